"""One job per node, one job per id (local inventory, 3 nodes): a job id used twice is refused naming its run
(on the controller, and on the nodes when the controller has no run of it), the first run left as it was;
two train.yml started together on the same nodes: one runs, the other is refused naming the node and the
job that has it, and starts nothing; with wait=true, two waiters start one after the other.

Run under the local cluster's lock: flock /tmp/ddp-local.lock pytest tests/test_train_claims.py"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

import pytest
from test_train_lifecycle import (  # noqa: F401 (three: the fixture every test here uses)
    LONG,
    NODES,
    THREE,
    finish,
    processes,
    three,
)

from conftest import REPO, STATE_DIR, node_exec, run_playbook, start_train

RUNS = REPO / "runs"
pytestmark = pytest.mark.usefixtures("three")
QUICK = "--dataset digits --epochs 4 --batch-size 32 --lr 0.05"


def job_id(name: str) -> str:
    return f"test-claim-{name}-{uuid.uuid4().hex[:6]}"


def job_dir(node: str, job: str) -> Path:
    return STATE_DIR / node / "workspace" / "jobs" / job


def snapshot(folder: Path) -> dict[str, int]:
    """Every file under ``folder``, with its time: what a second run would have touched."""
    return {str(path.relative_to(folder)): path.stat().st_mtime_ns for path in folder.rglob("*")}


def test_a_job_id_used_twice_is_refused_naming_it_and_the_first_run_is_left_as_it_was() -> None:
    job = job_id("twice")
    first = run_playbook("train.yml", extravars={"job_id": job, "nodes": 2, "script_args": QUICK}, env=THREE)
    assert first.rc == 0, first.stdout[-4000:]
    run, on_node = RUNS / job, job_dir("node0", job)
    before, before_node = snapshot(run), snapshot(on_node)

    again = run_playbook("train.yml", extravars={"job_id": job, "nodes": 2, "script_args": QUICK}, env=THREE)
    assert again.rc != 0
    assert f"job_id={job} was used before: {run} holds its run" in again.stdout, again.stdout[-3000:]
    assert f"-e attach={job}" in again.stdout and "leave job_id out" in again.stdout
    assert snapshot(run) == before and snapshot(on_node) == before_node

    # A controller without that run (another checkout, or runs/ cleaned): the nodes refuse it by name.
    kept = run.with_name(f"{job}.kept")
    run.rename(kept)
    try:
        elsewhere = run_playbook(
            "train.yml", extravars={"job_id": job, "nodes": 2, "script_args": QUICK}, env=THREE
        )
        assert elsewhere.rc != 0
        assert f"node0: the job's directory {on_node} is there already: job id {job} was used before" in (
            elsewhere.stdout
        ), elsewhere.stdout[-3000:]
        assert snapshot(on_node) == before_node
        assert processes("node0", job) == "" and processes("node1", job) == ""
    finally:
        shutil.rmtree(run, ignore_errors=True)
        kept.rename(run)
    assert snapshot(run) == before


def test_two_jobs_started_together_on_the_same_nodes_one_runs_the_other_is_refused() -> None:
    jobs = [job_id("a"), job_id("b")]
    procs = [start_train(job, LONG, env=THREE) for job in jobs]
    outputs = [finish(proc, 300) for proc in procs]
    codes = [proc.returncode for proc in procs]
    assert codes.count(0) == 1, f"{codes}\n{outputs[0][-3000:]}\n---\n{outputs[1][-3000:]}"
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    said = outputs[loser]
    named = [node for node in ("node0", "node1") if f"{node} runs another job: job {jobs[winner]}" in said]
    assert named, said[-4000:]
    assert f"jobs.yml -e stop={jobs[winner]}" in said
    # the refused job started nothing: no supervisor, no status, no rank, on either node
    assert not (job_dir("node0", jobs[loser]) / "status.json").exists()
    assert processes("node0", jobs[loser]) == "" and processes("node1", jobs[loser]) == ""
    summary = json.loads((RUNS / jobs[winner] / "output" / "summary.json").read_text())
    assert summary["epochs"] == 200 and summary["world_size"] == 2
    # the winner's claim went with its supervisor: the nodes are free for the next job
    for node in ("node0", "node1"):
        claim = node_exec(node, "cat /workspace/jobs/.claim 2>/dev/null || true", check=False).stdout.strip()
        assert claim == "", f"{node} still holds a claim after its job ended: {claim}"


def test_wait_true_waiters_start_one_after_the_other() -> None:
    """A detached job holds node0 and node1; two waiters for the same nodes: once it ends, one starts and
    the other waits for that one's end (a waiter never shares a node)."""
    holder = job_id("holder")
    quick_long = "--dataset digits --epochs 60 --batch-size 32 --lr 0.05"
    detached = run_playbook(
        "train.yml",
        extravars={"job_id": holder, "nodes": 2, "detach": True, "script_args": quick_long},
        env=THREE,
    )
    assert detached.rc == 0, detached.stdout[-4000:]
    waiters = [job_id("w1"), job_id("w2")]
    procs = [start_train(job, quick_long, extra=("-e", "wait=true"), env=THREE) for job in waiters]
    outputs = [finish(proc, 600) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], f"{outputs[0][-3000:]}\n---\n{outputs[1][-3000:]}"
    spans = []
    for job in waiters:
        status = json.loads((RUNS / job / "status.json").read_text())
        assert status["state"] == "succeeded"
        ended = float(status["updated"])
        spans.append((ended - float(status["elapsed"]), ended))
    (_, end_a), (start_b, _) = sorted(spans)
    assert end_a <= start_b + 1.0, f"the waiters ran at once: {spans}"
    assert any("waiting for it (wait=true)" in output for output in outputs)
    deadline = time.monotonic() + 60
    while processes("node0", holder) and time.monotonic() < deadline:
        time.sleep(1)
    assert processes("node0", holder) == ""


def test_one_id_started_twice_together_runs_once_and_the_other_start_is_refused_by_name() -> None:
    job = job_id("twin")
    procs = [start_train(job, QUICK, env=THREE) for _ in range(2)]
    outputs = [finish(proc, 300) for proc in procs]
    codes = [proc.returncode for proc in procs]
    assert codes.count(0) == 1, f"{codes}\n{outputs[0][-3000:]}\n---\n{outputs[1][-3000:]}"
    said = outputs[codes.index(0) ^ 1]
    # refused by name, whichever step saw the other start first: the controller's run, a node's directory,
    # or the claim of the nodes (the two at the same moment)
    named = (
        f"job_id={job} was used before",
        f"is there already: job id {job} was used before",
        f"job {job} is being started by another train.yml already",
    )
    assert any(text in said for text in named), said[-4000:]
    status = json.loads((RUNS / job / "status.json").read_text())
    assert status["state"] == "succeeded" and len(status.get("restarts") or []) == 0
    assert processes("node0", job) == "" and processes("node1", job) == ""


def lasting(listed: str) -> set[str]:
    """The processes of a ``pgrep -af`` answer that live as long as the job: the supervisor's one-shot ssh
    calls (the standby's start, a liveness probe) end by themselves, and a stop that reached them would show
    elsewhere."""
    return {line for line in listed.splitlines() if not line.split(" ", 1)[-1].startswith("ssh -o ")}


def test_stop_of_an_id_that_is_a_regex_of_another_leaves_that_job_running() -> None:
    """``jobs.yml -e stop=X.1`` (a process of X.1 left on node0) must not reach job X-1's ranks there."""
    base = job_id("regex")
    running, dotted = f"{base}-1", f"{base}.1"
    longer = LONG.replace("--epochs 200", "--epochs 3000")  # outlives the stop's 20 s wait for X.1's process
    detached = run_playbook(
        "train.yml",
        extravars={"job_id": running, "nodes": 2, "detach": True, "script_args": longer},
        env=THREE,
    )
    assert detached.rc == 0, detached.stdout[-4000:]
    try:
        node_exec(
            "node0",
            f"mkdir -p /workspace/jobs/{dotted} && (setsid nohup python3 -c 'import time; time.sleep(300)'"
            f" /workspace/jobs/{dotted}/left >/dev/null 2>&1 &)",
        )
        before = lasting(processes("node0", running))
        assert before, "job X-1 runs no rank on node0"
        stopped = run_playbook("jobs.yml", extravars={"stop": dotted}, env=THREE)
        exact = f"pgrep -af '[/]workspace/jobs/{base}[.]1/' || true"
        assert node_exec("node0", exact, check=False).stdout.strip() == "", stopped.stdout[-3000:]
        assert lasting(processes("node0", running)) == before, "stop=X.1 reached job X-1's processes"
        state = json.loads((job_dir("node0", running) / "status.json").read_text())["state"]
        assert state == "running", state
    finally:
        run_playbook("jobs.yml", extravars={"stop": running}, env=THREE)
