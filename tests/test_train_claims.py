"""One job per id (local inventory, 3 nodes): a job id used twice is refused naming its run (on the
controller, and on the nodes when the controller has no run of it), the first run left as it was; one id
started twice at once runs once; a stop of an id that is a pattern of another's reaches only its own
processes. (Two jobs on the same nodes queue in Slurm: tests/test_train_queue.py.)

Run under the local cluster's lock: flock /tmp/ddp-local.lock pytest tests/test_train_claims.py"""

from __future__ import annotations

import json
import shutil
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


def test_one_id_started_twice_together_runs_once_and_the_other_start_is_refused_by_name() -> None:
    job = job_id("twin")
    procs = [start_train(job, QUICK, env=THREE) for _ in range(2)]
    outputs = [finish(proc, 300) for proc in procs]
    codes = [proc.returncode for proc in procs]
    assert codes.count(0) == 1, f"{codes}\n{outputs[0][-3000:]}\n---\n{outputs[1][-3000:]}"
    said = outputs[codes.index(0) ^ 1]
    # refused by name, whichever step saw the other start first: the controller's run, a node's directory,
    # or the staged files of its submission (the two at the same moment)
    named = (
        f"job_id={job} was used before",
        f"is there already: job id {job} was used before",
        f"job {job} is being submitted already by another train.yml",
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
