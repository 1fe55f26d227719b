"""A job outlives the playbook and recovers on its own (local inventory, 3 nodes: node2 is the spare of a
2-node job): detach / jobs.yml / attach / stop, Ctrl-C, a killed controller, one job per node, restarts on a
spare or on fewer nodes, restarts exhausted, and a user's error that is not restarted.

Named to run after test_site.py (pytest takes files in name order): its idempotence test re-runs site.yml on
the 2-node inventory, which a 3-node run before it would change."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, STATE_DIR, PlaybookResult, docker, node_exec, run_playbook, start_train

THREE = {"DDP_LOCAL_NODES": "3"}
RUNS = REPO / "runs"
# About 20 s of digits on two nodes: long enough to break something mid-job.
LONG = "--dataset digits --epochs 200 --batch-size 32 --lr 0.05 --log-every 10 --checkpoint-every 50"
NODES = ("node0", "node1", "node2")


def job_id(name: str) -> str:
    return f"test-life-{name}-{uuid.uuid4().hex[:6]}"


def playbook(name: str, **extravars: object) -> PlaybookResult:
    return run_playbook(name, extravars=extravars, env=THREE)


def start(job: str, script_args: str, *extra: str) -> subprocess.Popen[str]:
    """train.yml in the background (2 nodes unless -e nodes=N), on the 3-node inventory."""
    return start_train(job, script_args, extra=extra, env=THREE)


def status_of(job: str) -> dict[str, object]:
    """The job's status.json on its first node (node0), as the supervisor writes it; {} before."""
    try:
        return dict(
            json.loads((STATE_DIR / "node0" / "workspace" / "jobs" / job / "status.json").read_text())
        )
    except (OSError, ValueError):
        return {}


def wait_for(what: str, check: object, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not within {seconds:.0f} s"
        time.sleep(0.5)


def step_of(job: str) -> int:
    progress = status_of(job).get("progress")
    return int(progress.get("step", 0)) if isinstance(progress, dict) else 0


def restarted(job: str) -> bool:
    records = status_of(job).get("restarts")
    return isinstance(records, list) and len(records) == 1 and records[0].get("training_again_s") is not None


def processes(node: str, job: str) -> str:
    return node_exec(node, f"pgrep -af '[/]workspace/jobs/{job}/' || true", check=False).stdout.strip()


def running_nodes() -> set[str]:
    out = docker("ps", "--format", "{{.Names}}", check=False).stdout.split()
    return {node for node in NODES if node in out}


@pytest.fixture
def three(local_cluster: PlaybookResult) -> Iterator[None]:
    """Three node containers up (site.yml brings back any that a test killed)."""
    # a job's spares are the nodes Slurm has free when it starts: every node idle first. A node Slurm set down
    # while a test cut it off stays down once the link is back (Slurm stops pinging a down node): site.yml's
    # probe sees it and its Slurm stage resumes it, as it brings back a killed node
    if running_nodes() != set(NODES) or not idle_soon(60):
        result = run_playbook("site.yml", env=THREE)
        assert result.rc == 0, result.stdout[-4000:]
    wait_for("every node idle in Slurm", lambda: idle_in_slurm() == set(NODES), 300)
    yield


def idle_soon(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while idle_in_slurm() != set(NODES):
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
    return True


def idle_in_slurm() -> set[str]:
    out = node_exec("node0", "sinfo -h -N -o '%N %t'", check=False).stdout.split("\n")
    rows = (line.split() for line in out)
    return {fields[0] for fields in rows if len(fields) == 2 and fields[1] == "idle"}


def finish(proc: subprocess.Popen[str], seconds: float = 240) -> str:
    try:
        output, _ = proc.communicate(timeout=seconds)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return output


def test_detach_then_list_then_attach_collects_it(three: None) -> None:
    job = job_id("detach")
    started = time.monotonic()
    detached = playbook("train.yml", job_id=job, nodes=2, detach=True, script_args=LONG)
    took = time.monotonic() - started
    assert detached.rc == 0, detached.stdout[-4000:]
    assert f"job {job}: detached: every rank runs" in detached.stdout
    assert f"ansible-playbook train.yml -e attach={job}" in detached.stdout
    assert status_of(job).get("ranks_running") is True and status_of(job).get("state") == "running"
    assert processes("node1", job), "detach returned before node1's rank ran"
    assert took < 30, f"detach took {took:.0f} s"
    assert not (RUNS / job / "output" / "summary.json").exists()

    started = time.monotonic()
    listed = playbook("jobs.yml")
    took = time.monotonic() - started
    assert listed.rc == 0, listed.stdout[-4000:]
    line = next(line for line in listed.stdout.splitlines() if line.startswith(job))
    assert "running" in line and "node0,node1" in line and "0/0" in line, line
    assert "node0: busy" in listed.stdout and "node2: free" in listed.stdout
    assert took < 15, f"jobs.yml took {took:.0f} s"

    attached = playbook("train.yml", attach=job)
    assert attached.rc == 0, attached.stdout[-4000:]
    assert f"job {job}: succeeded" in attached.stdout
    summary = json.loads((RUNS / job / "output" / "summary.json").read_text())
    assert summary["epochs"] == 200 and summary["world_size"] == 2
    assert (RUNS / job / "logs" / "rank.1.log").is_file()


def test_stop_ends_a_detached_job_on_every_node_and_collects_it(three: None) -> None:
    first = job_id("busy")
    detached = playbook("train.yml", job_id=first, nodes=2, detach=True, script_args=LONG)
    assert detached.rc == 0, detached.stdout[-4000:]

    stopped = playbook("jobs.yml", stop=first)
    assert stopped.rc == 0, stopped.stdout[-4000:]
    assert f"stopped with jobs.yml -e stop={first}" in stopped.stdout
    assert processes("node0", first) == "" and processes("node1", first) == ""
    assert (RUNS / first / "logs" / "rank.0.log").is_file(), "the stopped job's logs did not come back"
    assert json.loads((RUNS / first / "status.json").read_text())["state"] == "failed"


# A user's script that saves on a stop: each rank's SIGTERM handler takes 4 s (more than Open MPI's own 1 s
# between a daemon's SIGTERM and its SIGKILL), then writes its file.
SAVES_ON_STOP = """import os, signal, sys, time
rank = os.environ["RANK"]
output = os.path.join(os.environ["DDP_JOB_DIR"], "output")
os.makedirs(output, exist_ok=True)
def on_stop(signum, frame):
    time.sleep(4)
    with open(os.path.join(output, f"stopped-rank-{rank}"), "w") as saved:
        saved.write("saved\\n")
    sys.exit(143)
signal.signal(signal.SIGTERM, on_stop)
print(f"rank {rank} ready", flush=True)
while True:
    time.sleep(0.5)
"""


def test_stop_grace_lets_every_rank_s_own_handler_save_on_every_node(three: None, tmp_path: Path) -> None:
    job = job_id("grace")
    script = tmp_path / "saves_on_stop.py"
    script.write_text(SAVES_ON_STOP)
    detached = playbook("train.yml", job_id=job, nodes=2, detach=True, script=str(script), stop_grace=15)
    assert detached.rc == 0, detached.stdout[-4000:]
    wait_for("both ranks ready", lambda: all(
        "ready" in node_exec(node, f"cat /workspace/jobs/{job}/logs/1/rank.{rank}/stdout 2>/dev/null",
                             check=False).stdout
        for node, rank in (("node0", 0), ("node1", 1))
    ))  # fmt: skip
    began = time.monotonic()
    stopped = playbook("jobs.yml", stop=job)
    took = time.monotonic() - began
    assert stopped.rc == 0, stopped.stdout[-4000:]
    for node, rank in (("node0", 0), ("node1", 1)):  # node1's rank: through mpirun's daemon there
        saved = node_exec(node, f"cat /workspace/jobs/{job}/output/stopped-rank-{rank}", check=False)
        assert saved.stdout == "saved\n", (node, saved.stdout, saved.stderr, stopped.stdout[-3000:])
    assert processes("node0", job) == "" and processes("node1", job) == ""
    assert took < 15 + 45, f"the stop took {took:.0f} s"


def test_ctrl_c_stops_every_rank_collects_and_exits_non_zero(three: None) -> None:
    job = job_id("sigint")
    proc = start(job, LONG)
    try:
        wait_for("every rank running", lambda: status_of(job).get("ranks_running") is True)
        wait_for("training", lambda: step_of(job) > 0)
        os.kill(
            proc.pid, signal.SIGINT
        )  # what a terminal's Ctrl-C sends the playbook (its workers run apart)
        output = finish(proc, 120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode not in (0, None)
    assert "Ctrl-C: stopping the job on every node" in output, output[-3000:]
    assert f"job {job}: interrupted on the controller (Ctrl-C)" in output, output[-3000:]
    assert processes("node0", job) == "" and processes("node1", job) == ""
    assert (RUNS / job / "logs" / "rank.1.log").is_file()


def test_a_killed_controller_leaves_the_job_running_and_attach_collects_it(three: None) -> None:
    job = job_id("killed")
    quick = "--dataset digits --epochs 40 --batch-size 32 --lr 0.05"
    proc = start(job, quick)
    wait_for("every rank running", lambda: status_of(job).get("ranks_running") is True)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    wait_for("the job's end without its controller", lambda: status_of(job).get("state") == "succeeded")
    attached = playbook("train.yml", attach=job)
    assert attached.rc == 0, attached.stdout[-4000:]
    assert f"job {job}: succeeded" in attached.stdout
    assert json.loads((RUNS / job / "output" / "summary.json").read_text())["epochs"] == 40


def test_a_lost_node_is_replaced_by_the_spare_and_the_job_finishes(three: None) -> None:
    reference = job_id("undisturbed")
    undisturbed = playbook("train.yml", job_id=reference, nodes=2, script_args=LONG)
    assert undisturbed.rc == 0, undisturbed.stdout[-4000:]
    expected = json.loads((RUNS / reference / "output" / "summary.json").read_text())["accuracy"]

    job = job_id("spare")
    proc = start(job, LONG, "-e", "max_restarts=1")
    try:
        wait_for("step 1000", lambda: step_of(job) > 1000)
        docker("kill", "node1")
        killed = time.time()
        output = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-5000:]
    status = json.loads((RUNS / job / "status.json").read_text())
    [restart] = status["restarts"]
    assert restart["lost"] == ["node1"] and restart["spares_taken"] == ["node2"]
    assert restart["nodes_after"] == ["node0", "node2"] and "node1" in restart["cause"]
    again = float(restart["lost_at"]) + float(restart["training_again_s"]) - killed
    assert again < 60, f"training again {again:.0f} s after node1 was killed"
    assert 0 <= restart["steps_redone"] <= 60, restart
    summary = json.loads((RUNS / job / "output" / "summary.json").read_text())
    assert summary["restarts"][0]["spares_taken"] == ["node2"]
    assert abs(summary["accuracy"] - expected) <= 0.02, (summary["accuracy"], expected)
    assert f"job {job}: 1 restart(s) of max_restarts=1" in output
    assert (RUNS / job / "nodes" / "node2").is_dir(), "the spare's results did not come back"


def test_without_a_spare_min_nodes_lets_it_finish_on_fewer(three: None) -> None:
    job = job_id("fewer")
    proc = start(job, LONG, "-e", "nodes=3", "-e", "max_restarts=1", "-e", "min_nodes=2")
    try:
        wait_for("step 500", lambda: step_of(job) > 500)
        docker("kill", "node2")
        output = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-5000:]
    [restart] = json.loads((RUNS / job / "status.json").read_text())["restarts"]
    assert restart["nodes_after"] == ["node0", "node1"] and restart["spares_taken"] == []
    assert json.loads((RUNS / job / "output" / "summary.json").read_text())["world_size"] == 2


def test_restarts_exhausted_fail_as_before_naming_both_losses(three: None) -> None:
    job = job_id("exhausted")
    proc = start(job, LONG, "-e", "max_restarts=1")
    try:
        wait_for("step 500", lambda: step_of(job) > 500)
        docker("kill", "node1")
        wait_for("the restart on node2", lambda: len(status_of(job).get("restarts") or []) == 1)  # type: ignore[arg-type]
        wait_for(
            "training again", lambda: (status_of(job).get("restarts") or [{}])[0].get("training_again_s")
        )  # type: ignore[index,union-attr]
        docker("kill", "node2")
        output = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode not in (0, None)
    assert "node node2 stopped answering" in output, output[-4000:]
    assert "max_restarts=1 reached (lost before: node1)" in output, output[-4000:]
    assert processes("node0", job) == ""


def test_an_error_in_the_users_code_is_not_restarted(three: None, tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text(
        "import os, time\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "time.sleep(2)\nif dist.get_rank() == 1:\n    raise ZeroDivisionError('a bug of mine')\n"
        "dist.barrier()\n"
    )
    job = job_id("userbug")
    result = playbook("train.yml", job_id=job, nodes=2, max_restarts=2, script=str(script))
    assert result.rc != 0
    assert "not restarted: a restart does not cure this" in result.stdout, result.stdout[-4000:]
    assert json.loads((RUNS / job / "status.json").read_text()).get("restarts", []) == []
