"""Slurm schedules train.yml's jobs (local inventory, 3 nodes): a job on nodes another job holds is queued,
not refused, says its place and Slurm's reason, and starts by itself within seconds of the other's end; two
jobs started together run one after the other, never sharing a node; nodelist and exclude pick the nodes;
Ctrl-C on a queued job cancels it in Slurm; detach=true returns once the job is queued; jobs.yml lists
Slurm's queue and stops a queued job (scancel) as it stops a running one.

Run under the local cluster's lock: flock /tmp/ddp-local.lock pytest tests/test_train_queue.py"""

from __future__ import annotations

import json
import signal
import time
import uuid
from datetime import datetime

import pytest
from test_train_lifecycle import (  # noqa: F401 (three: the fixture every test here uses)
    THREE,
    finish,
    processes,
    three,
)

from conftest import REPO, STATE_DIR, node_exec, run_playbook, start_train

RUNS = REPO / "runs"
pytestmark = pytest.mark.usefixtures("three")
# About 10 s of digits on two nodes; and a job long enough to hold its nodes while a test looks at the queue.
QUICK = "--dataset digits --epochs 40 --batch-size 32 --lr 0.05"
HOLD = "--dataset digits --epochs 3000 --batch-size 32 --lr 0.05"


def job_id(name: str) -> str:
    return f"test-queue-{name}-{uuid.uuid4().hex[:6]}"


def slurm_times(job: str) -> tuple[datetime, datetime]:
    """When Slurm started and ended job JOB (by its name), as squeue remembers an ended job."""
    said = node_exec("node0", f"squeue -h -t all -n {job} -o '%S %e'").stdout.split()
    return datetime.fromisoformat(said[0]), datetime.fromisoformat(said[1])


def slurm_state(job: str) -> str:
    return node_exec("node0", f"squeue -h -t all -n {job} -o %T", check=False).stdout.strip()


def hold(job: str, **extra: object) -> None:
    """Start JOB detached on two nodes, holding them (nodelist node0,node1 unless EXTRA says otherwise)."""
    extravars = {"job_id": job, "nodes": 2, "detach": True, "script_args": HOLD, "nodelist": "node0,node1"}
    held = run_playbook("train.yml", extravars=extravars | extra, env=THREE)
    assert held.rc == 0, held.stdout[-4000:]
    assert f"job {job}: detached: every rank runs" in held.stdout, held.stdout[-3000:]


def stop(job: str) -> None:
    stopped = run_playbook("jobs.yml", extravars={"stop": job}, env=THREE)
    assert stopped.rc == 0, stopped.stdout[-4000:]


def test_two_jobs_started_together_run_one_after_the_other_and_the_second_starts_within_10_s() -> None:
    jobs = [job_id("a"), job_id("b")]
    procs = [start_train(job, QUICK, env=THREE) for job in jobs]
    outputs = [finish(proc, 400) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], f"{outputs[0][-3000:]}\n---\n{outputs[1][-3000:]}"
    spans = sorted(slurm_times(job) for job in jobs)
    (_, first_end), (second_start, _) = spans
    assert first_end <= second_start, f"the two jobs shared nodes: {spans}"
    assert (second_start - first_end).total_seconds() <= 10, spans
    assert any("waiting for nodes that other jobs hold (Resources)" in output for output in outputs)
    for job in jobs:
        status = json.loads((RUNS / job / "status.json").read_text())
        assert status["state"] == "succeeded" and len(status["nodes"]) == 2, status
        summary = json.loads((RUNS / job / "output" / "summary.json").read_text())
        assert summary["world_size"] == 2


def test_nodelist_and_exclude_pick_the_nodes_slurm_gives() -> None:
    def ran_on(name: str, **selection: object) -> tuple[list[str], str]:
        job = job_id(name)
        done = run_playbook(
            "train.yml", extravars={"job_id": job, "script_args": "--epochs 1", **selection}, env=THREE
        )
        assert done.rc == 0, done.stdout[-4000:]
        return sorted(json.loads((RUNS / job / "status.json").read_text())["nodes"]), done.stdout

    assert ran_on("exclude", nodes=1, exclude="node0,node1")[0] == ["node2"]
    nodes, stdout = ran_on("nodelist", nodes=2, nodelist="node[1-2]")
    assert nodes == ["node1", "node2"]
    assert "Slurm job" in stdout and "runs on node1, node2" in stdout
    refused = run_playbook(
        "train.yml",
        extravars={"job_id": job_id("bad"), "nodes": 2, "exclude": "node9", "script_args": "--epochs 1"},
        env=THREE,
    )
    assert refused.rc != 0 and "exclude names node9, which the inventory does not have" in refused.stdout


def test_ctrl_c_on_a_queued_job_cancels_it_in_slurm_and_leaves_nothing_staged() -> None:
    holder, waiter = job_id("holder"), job_id("ctrlc")
    hold(holder)
    try:
        proc = start_train(waiter, QUICK, extra=("-e", "nodes=3"), env=THREE)
        deadline, seen = time.monotonic() + 120, ""
        while time.monotonic() < deadline and "queued as Slurm job" not in seen:
            time.sleep(1)
            seen = slurm_state(waiter)
            if seen == "PENDING":
                break
        assert slurm_state(waiter) == "PENDING", seen
        time.sleep(2)
        proc.send_signal(signal.SIGINT)
        output = finish(proc, 120)
        assert proc.returncode != 0, output[-3000:]
        assert "cancelled in Slurm's queue (Ctrl-C on the controller)" in output, output[-3000:]
        assert slurm_state(waiter) == "CANCELLED"
        assert not (STATE_DIR / "node0" / "workspace" / "jobs" / ".staged" / waiter).exists()
        assert processes("node2", waiter) == ""
    finally:
        stop(holder)


def test_detach_returns_once_queued_jobs_yml_lists_the_queue_and_stops_the_queued_job() -> None:
    holder, waiter = job_id("holder"), job_id("queued")
    hold(holder)
    try:
        extravars = {"job_id": waiter, "nodes": 3, "detach": True, "script_args": QUICK}
        queued = run_playbook("train.yml", extravars=extravars, env=THREE)
        assert queued.rc == 0, queued.stdout[-4000:]
        assert f"job {waiter}: detached: it stays queued as Slurm job" in queued.stdout, queued.stdout[-3000:]
        assert slurm_state(waiter) == "PENDING"
        listed = run_playbook("jobs.yml", env=THREE)
        assert listed.rc == 0, listed.stdout[-4000:]
        rows = [line for line in listed.stdout.splitlines() if line.strip().startswith(waiter)]
        assert rows and "PENDING" in rows[0] and "(Resources)" in rows[0], listed.stdout[-3000:]
        assert any(holder in line and "RUNNING" in line for line in listed.stdout.splitlines())
        stop(waiter)
        assert slurm_state(waiter) == "CANCELLED"
        assert not (STATE_DIR / "node0" / "workspace" / "jobs" / ".staged" / waiter).exists()
    finally:
        stop(holder)
    assert slurm_state(holder) in ("COMPLETED", "FAILED", "COMPLETING"), slurm_state(holder)
