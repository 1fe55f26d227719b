"""train.yml on the local cluster: launchers, user scripts, bad input, a failing rank, a dead node and
resume."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tarfile
import time
import uuid
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import REPO, PlaybookResult, docker, node_exec, run_playbook, start_train

RUNS = REPO / "runs"
QUICK = "--dataset digits --epochs 4 --batch-size 32 --lr 0.05"
USER_SCRIPT = REPO / "tests" / "scripts" / "ddp_script.py"
PROJECT = REPO / "tests" / "projects" / "tiny"


def job_id(name: str) -> str:
    return f"test-{name}-{uuid.uuid4().hex[:6]}"


def train(job: str, **extravars: object) -> PlaybookResult:
    return run_playbook("train.yml", extravars={"job_id": job, **extravars})


def summary(job: str) -> dict[str, object]:
    return json.loads((RUNS / job / "output" / "summary.json").read_text())


def assert_results(job: str, world_size: int) -> None:
    run = RUNS / job
    result = summary(job)
    assert result["world_size"] == world_size
    ranks = sorted(p.name for p in (run / "logs").iterdir() if p.name.startswith("rank."))
    assert [f"rank.{rank}.log" for rank in range(world_size)] == ranks
    assert len((run / "output" / "metrics.jsonl").read_text().splitlines()) >= 4
    assert (run / "output" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (run / "output" / "checkpoints").iterdir()) == ["epoch-00004.ckpt"]


def no_job_processes(node: str, job: str) -> bool:
    return node_exec(node, f"pgrep -af '[/]workspace/jobs/{job}/' || true").stdout.strip() == ""


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_two_nodes_train_digits(local_cluster: PlaybookResult, launcher: str) -> None:
    job = job_id(launcher)
    # As a user sees it (ansible.cfg's output, without the skipped tasks the other tests read).
    quiet = {"ANSIBLE_DISPLAY_SKIPPED_HOSTS": "false"}
    result = run_playbook("train.yml", extravars={"job_id": job, "nodes": 2, "launcher": launcher,
                                                  "script_args": QUICK}, env=quiet)  # fmt: skip
    assert result.rc == 0, result.stdout[-5000:]
    assert_results(job, world_size=2)
    assert summary(job)["accuracy"] >= 0.9
    assert f"job {job}: succeeded" in result.stdout
    # Rank 0's TensorBoard event files, collected where `tensorboard --logdir runs/` finds them, hold the
    # loss at the steps of metrics.jsonl and the test accuracy of summary.json.
    output = RUNS / job / "output"
    assert list((output / "tensorboard").glob("events.out.tfevents.*")), sorted(output.rglob("*"))
    events = EventAccumulator(str(output / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    logged = [row["step"] for row in rows if row["kind"] == "step"]
    assert [event.step for event in events.Scalars("train/loss")] == logged and logged
    assert events.Scalars("eval/accuracy")[-1].value == pytest.approx(summary(job)["accuracy"])
    assert "final loss:" in result.stdout and "samples/s:" in result.stdout
    # Each rank's output stays in its file on its own node (mpirun's --output-filename DIR:nocopy): none of it
    # reaches mpirun on node0, whose launcher.log holds mpirun's own lines only.
    launched = (RUNS / job / "nodes" / "node0" / "launcher.log").read_text()
    assert "[rank 0/2]" not in launched and "[rank 1/2]" not in launched, launched[-2000:]
    assert "[rank 1/2]" in (RUNS / job / "nodes" / "node1" / "logs" / "1" / "rank.1" / "stdout").read_text()
    # The plan, the progress and the summary; no skipped task.
    assert f"job {job}: {launcher} on node0, node1" in result.stdout
    assert re.search(rf"job {job}: (starting|running) after \d+ s: ", result.stdout), result.stdout
    # (Ansible still says "skipping: no hosts matched" of the gate's play when no gate was asked for.)
    assert "skipping: [" not in result.stdout, result.stdout


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_two_nodes_two_processes_each(local_cluster: PlaybookResult, launcher: str) -> None:
    job = job_id(f"2x2-{launcher}")
    result = train(job, nodes=2, launcher=launcher, cluster_nproc_per_node=2, script_args=QUICK)
    assert result.rc == 0, result.stdout[-5000:]
    assert_results(job, world_size=4)
    hostfile = (RUNS / job / "nodes" / "node0" / "hostfile").read_text().splitlines()
    assert [line for line in hostfile if not line.startswith("#")] == ["node0 slots=2", "node1 slots=2"]
    # Every worker has a log of its own, also under torchrun (whose agents' logs are agent.N.log).
    for rank in range(4):
        log = (RUNS / job / "logs" / f"rank.{rank}.log").read_text()
        assert f"local rank {rank % 2}/2, node {rank // 2}," in log, (rank, log[-2000:])
        assert f"local rank {(rank + 1) % 2}/2" not in log, (rank, log[-2000:])
    agents = sorted(p.name for p in (RUNS / job / "logs").glob("agent.*.log"))
    assert agents == (["agent.0.log", "agent.1.log"] if launcher == "torchrun" else [])


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_user_script_runs_unmodified(local_cluster: PlaybookResult, launcher: str) -> None:
    job = job_id(f"script-{launcher}")
    result = train(job, nodes=2, launcher=launcher, script=str(USER_SCRIPT), script_args="--steps 3")
    assert result.rc == 0, result.stdout[-5000:]
    logs = "\n".join(p.read_text() for p in (RUNS / job / "nodes").rglob("*") if p.is_file())
    assert "user-script rank 0/2" in logs and "user-script rank 1/2" in logs
    assert "identical=True" in logs and "identical=False" not in logs


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_a_whole_project_runs_unmodified_in_its_directory(
    local_cluster: PlaybookResult, launcher: str, tmp_path: Path
) -> None:
    project = tmp_path / "tiny"
    shutil.copytree(PROJECT, project)
    # What must stay on the controller: what .gitignore lists, byte code, a git directory.
    for name in ("scratch/big.bin", "debug.log", "tinyproj/__pycache__/model.cpython-311.pyc", ".git/HEAD"):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_bytes(b"x" * 100)
    job = job_id(f"project-{launcher}")
    result = train(job, nodes=2, launcher=launcher, workdir=str(project), script="train.py",
                   script_args="--steps=4 --label=from-args")  # fmt: skip
    assert result.rc == 0, result.stdout[-5000:]
    logs = "\n".join(p.read_text() for p in (RUNS / job / "nodes").rglob("*.log") if p.is_file())
    logs += "\n".join(p.read_text() for p in (RUNS / job / "logs").iterdir())
    for rank in (0, 1):
        assert f"project rank {rank}/2 cwd=/workspace/jobs/{job}/workdir rows=24 label=from-args" in logs, (
            logs[-3000:]
        )
    # What rank 0 wrote in its working directory came back; the project as it ran is kept beside the results.
    written = json.loads((RUNS / job / "nodes" / "node0" / "workdir" / "results" / "result.json").read_text())
    assert written | {"loss": 0} == {"label": "from-args", "rows": 24, "lr": 0.05, "loss": 0, "world": 2}
    with tarfile.open(RUNS / job / "workdir.tar.gz") as shipped:
        assert sorted(shipped.getnames()) == [".gitignore", "conf/config.json", "data/points.csv",
                                              "tinyproj/__init__.py", "tinyproj/data.py", "tinyproj/model.py",
                                              "train.py"]  # fmt: skip
    for node in ("node0", "node1"):
        back = RUNS / job / "nodes" / node / "workdir"
        assert (back / "train.py").is_file() and (back / "data" / "points.csv").is_file()
        assert not any((back / name).exists() for name in ("scratch", "debug.log", ".git"))
        assert not list(back.rglob("__pycache__")), "byte code stays on the nodes"


@pytest.mark.parametrize(
    ("extravars", "message"),
    [
        ({}, "nodes is required"),
        ({"nodes": 0}, "nodes=0 is not a whole number of 1 or more"),
        ({"nodes": -1}, "nodes=-1 is not a whole number of 1 or more"),
        ({"nodes": "two"}, "nodes=two is not a whole number of 1 or more"),
        ({"nodes": 3}, "nodes=3 is more than the 2 nodes of the inventory"),
        (
            {"nodes": 2, "launcher": "horovodrun"},
            "launcher=horovodrun must be mpirun, torchrun or torch_npu_run",
        ),
        (
            {"nodes": 2, "launcher": "torch_npu_run"},
            "launcher=torch_npu_run needs torch_npu: it is for npu clusters",
        ),
        ({"nodes": 2, "device": "gpu"}, "device=gpu must be cpu, cuda or npu"),
        ({"nodes": 2, "script": "/nonexistent/train.py"}, "script=/nonexistent/train.py does not exist"),
        ({"nodes": 2, "job_timeout": "soon"}, "job_timeout=soon must be a whole number"),
        ({"nodes": 2, "workdir": str(PROJECT)}, "needs the script to run in it: add -e script=PATH"),
        (
            {"nodes": 2, "workdir": str(PROJECT), "script": "../ddp_script.py"},
            "must be a path inside workdir=",
        ),
        (
            {"nodes": 2, "workdir": str(PROJECT), "script": "train.py", "ddp_job_workdir_max_mb": 0.001},
            "more than the 1.0 KiB a",
        ),
    ],
    ids=[
        "missing",
        "zero",
        "negative",
        "not-a-number",
        "too-many",
        "launcher",
        "npu-launcher",
        "device",
        "script",
        "timeout",
        "workdir-no-script",
        "workdir-script-outside",
        "workdir-too-big",
    ],
)
def test_bad_request_is_refused_before_anything_starts(
    local_cluster: PlaybookResult, extravars: dict[str, object], message: str
) -> None:
    result = run_playbook("train.yml", extravars=extravars)
    assert result.rc != 0
    assert message in result.stdout, result.stdout[-3000:]
    assert "TASK [ddp_job : Start the job" not in result.stdout


def test_taken_master_port_is_named(local_cluster: PlaybookResult) -> None:
    # SO_REUSEADDR: earlier jobs leave the port in TIME_WAIT, where a plain bind would fail.
    holder = (
        "import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        "s.bind(('0.0.0.0',29501)); s.listen(); time.sleep(120)"
    )
    docker("exec", "-d", "node0", "python3", "-c", holder)
    try:
        deadline = time.monotonic() + 15
        while not node_exec("node0", "ss -Htln 'sport = :29501'").stdout.strip():
            assert time.monotonic() < deadline, "the port holder did not start listening"
            time.sleep(0.5)
        result = train(job_id("port"), nodes=2, script_args=QUICK)
        assert result.rc != 0
        assert "node0: the master port 29501 is taken" in result.stdout, result.stdout[-3000:]
        assert "TASK [ddp_job : Start the job" not in result.stdout
    finally:
        node_exec("node0", "pkill -f '[s]ocket.socket' || true")


def test_failing_rank_stops_the_job_and_is_named(local_cluster: PlaybookResult) -> None:
    job = job_id("fail")
    start = time.monotonic()
    result = train(job, nodes=2, script=str(USER_SCRIPT), script_args="--steps 500 --fail-rank 1")
    assert result.rc != 0
    assert time.monotonic() - start < 120
    assert f"job {job} failed: a rank exited with an error" in result.stdout, result.stdout[-4000:]
    assert "node: node1, rank: 1" in result.stdout
    assert "exit code 3" in result.stdout
    assert "failing on purpose" in result.stdout  # the last lines of the failed rank's log
    assert no_job_processes("node0", job) and no_job_processes("node1", job)
    # The doctor names the rank that failed first, above the lost peer its neighbour then reported.
    assert "ddp-cluster doctor: " in result.stdout, result.stdout[-3000:]
    assert "1   rank 1 on node node1 exited with code 3" in result.stdout, result.stdout[-3000:]


def test_a_failed_job_is_diagnosed_and_its_log_lines_stay_lines(
    local_cluster: PlaybookResult, tmp_path: Path
) -> None:
    # A script that imports a sibling module which was not shipped with it (-e script copies one file).
    script = tmp_path / "train_with_helpers.py"
    script.write_text("import helpers_of_mine  # noqa: F401\n")
    result = train(job_id("doctor"), nodes=2, script=str(script))
    assert result.rc != 0
    out = result.stdout
    assert "ModuleNotFoundError: No module named 'helpers_of_mine'" in out, out[-4000:]
    # Each log line on a line of its own, never joined with literal \n escapes.
    assert "\\n" not in out.split("Report the failure")[1], out[-4000:]
    assert "1   Python module helpers_of_mine is missing" in out, out[-4000:]
    assert "workdir=DIR" in out and "docker/requirements.txt" in out


def test_dead_node_fails_the_job_and_resume_finishes_it(local_cluster: PlaybookResult) -> None:
    job = job_id("dead")
    args = "--dataset synthetic --synthetic-samples 24000 --epochs 8 --batch-size 64 --log-every 50"
    playbook = start_train(job, args)
    checkpoints = Path(f"/var/lib/ddp-cluster/node0/workspace/jobs/{job}/output/checkpoints")
    try:
        deadline = time.monotonic() + 240
        while not list(checkpoints.glob("epoch-*.ckpt")):
            assert playbook.poll() is None, "train.yml ended before the first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(1)
        docker("kill", "node1")
        killed = time.monotonic()
        output, _ = playbook.communicate(timeout=120)
        took = time.monotonic() - killed
    finally:
        if playbook.poll() is None:
            os.killpg(playbook.pid, signal.SIGTERM)
    assert playbook.returncode != 0
    assert took < 60, f"train.yml took {took:.0f} s to fail after node1 died"
    assert f"job {job} failed: node node1 stopped answering ssh" in output, output[-4000:]
    assert no_job_processes("node0", job)
    fetched = sorted((RUNS / job / "output" / "checkpoints").glob("epoch-*.ckpt"))
    assert fetched, "the failed job's latest checkpoint did not come back"

    back = run_playbook("site.yml")
    assert back.rc == 0, back.stdout[-4000:]
    resumed_job = job_id("resumed")
    result = train(resumed_job, nodes=2, resume=True, resume_from=job, script_args=args)
    assert result.rc == 0, result.stdout[-5000:]
    assert f"resuming from {fetched[-1]}" in result.stdout or f"resumed from {fetched[-1]}" in result.stdout
    done = summary(resumed_job)
    assert done["epochs"] == 8
    assert done["resumed_from"] is not None


def test_accelerator_a_rank_cannot_use_fails_the_job_naming_node_rank_and_reason(
    local_cluster: PlaybookResult,
) -> None:
    # No GPU here: asking for cuda must fail the job, never train on cpu instead.
    job = job_id("no-gpu")
    result = train(job, nodes=2, device="cuda", script_args=QUICK)
    assert result.rc != 0
    assert re.search(
        r"node node[01] rank [01]/2: error: device cuda was asked for but no cuda device", result.stdout
    ), result.stdout[-3000:]
    assert not (RUNS / job / "output" / "summary.json").exists()


def test_check_is_a_dry_run_that_plans_and_checks_and_starts_nothing(local_cluster: PlaybookResult) -> None:
    job = job_id("dry")
    result = run_playbook("train.yml", extravars={"job_id": job, "nodes": 2}, cmdline="--check")
    assert result.rc == 0, result.stdout[-3000:]
    assert f"job {job}: mpirun on node0, node1" in result.stdout
    assert f"job {job}: a dry run (--check): planned here and checked from node0" in result.stdout
    assert result.stats["ok"].get("node0"), result.stats  # the nodes were checked from the first node
    assert not (RUNS / job).exists()
    left = node_exec(
        "node0", f"ls -d /workspace/jobs/{job} /workspace/jobs/.staged/{job} 2>/dev/null", check=False
    )
    assert left.stdout.strip() == "", left.stdout
    queued = node_exec("node0", "squeue -h -o %j").stdout
    assert job not in queued, queued
    # the plan's checks hold in a dry run too: bad input is the plan's one error, before anything
    bad = run_playbook("train.yml", extravars={"job_id": job, "nodes": 9}, cmdline="--check")
    assert bad.rc != 0
    assert "nodes=9 is more than the 2 nodes of the inventory" in bad.stdout, bad.stdout[-2000:]
