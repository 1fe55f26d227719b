"""jobs.yml -e sync=ID on the local 2-node cluster: a detached job's results so far come into runs/<id>/ while
it runs (metrics.jsonl, loss.png drawn from it, both ranks' logs, each node's directory), a second sync moves
only what the job wrote since, and the job runs on undisturbed. One job for the whole file (a module
fixture), stopped with jobs.yml -e stop=ID at its end."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, STATE_DIR, PlaybookResult, node_exec, run_playbook, running_cluster

RUNS = REPO / "runs"
NODES = ("node0", "node1")
# About 20 s of digits on two nodes (tests/test_train_lifecycle.py's LONG, without its checkpoints).
LONG = "--dataset digits --epochs 200 --batch-size 32 --lr 0.05 --log-every 10"
BROUGHT = re.compile(
    r"job (\S+): brought (\d+) file\(s\), (\d+) bytes \((\d+) bytes packed, (\d+) bytes answered\)"
)
NOTHING = re.compile(r"job (\S+): nothing changed since the last sync \((\d+) bytes asked and answered\)")


def node_job_dir(node: str, job: str) -> Path:
    return STATE_DIR / node / "workspace" / "jobs" / job


def status_of(job: str) -> dict[str, object]:
    try:
        return dict(json.loads((node_job_dir("node0", job) / "status.json").read_text()))
    except (OSError, ValueError):
        return {}


def step_of(job: str) -> int:
    progress = status_of(job).get("progress")
    return int(progress.get("step", 0)) if isinstance(progress, dict) else 0


def wait_for(what: str, check: object, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not within {seconds:.0f} s"
        time.sleep(0.5)


def synced_bytes(run: Path) -> int:
    """The bytes of every file a sync brought (the nodes' copies and the output; not what it drew)."""
    return sum(
        path.stat().st_size
        for top in (run / "output", run / "nodes")
        for path in top.rglob("*")
        if path.is_file() and not path.is_symlink() and path.name != "loss.png"
    )


def processes(node: str, job: str) -> str:
    return node_exec(node, f"pgrep -af '[/]workspace/jobs/{job}/' || true", check=False).stdout.strip()


def moved(result: PlaybookResult) -> tuple[int, int, int]:
    """(files, bytes of files, bytes answered) of a sync's line."""
    if found := BROUGHT.search(result.stdout):
        return int(found.group(2)), int(found.group(3)), int(found.group(5))
    found = NOTHING.search(result.stdout)
    assert found, result.stdout[-3000:]
    return 0, 0, int(found.group(2))


@pytest.fixture(scope="module")
def job(local_cluster_made: list[PlaybookResult]) -> Iterator[str]:
    """A detached 2-node job, running; stopped (and collected) at the end of the file."""
    running_cluster(local_cluster_made)
    name = f"test-sync-{uuid.uuid4().hex[:6]}"
    detached = run_playbook(
        "train.yml",
        extravars={"job_id": name, "nodes": 2, "detach": True, "script_args": LONG, "telemetry_interval": 2},
    )
    assert detached.rc == 0, detached.stdout[-4000:]
    try:
        yield name
    finally:
        stopped = run_playbook("jobs.yml", extravars={"stop": name})
        left = {node: processes(node, name) for node in ("node0", "node1")}
        assert not any(left.values()), (left, stopped.stdout[-3000:])


def telemetry_of(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_sync_brings_the_results_so_far_and_a_second_only_what_the_job_wrote_since(job: str) -> None:
    wait_for("training", lambda: step_of(job) > 0)
    sampled = node_job_dir("node0", job) / "telemetry"
    wait_for("a sample of each node", lambda: all(telemetry_of(sampled / f"{n}.jsonl") for n in NODES))
    run = RUNS / job
    checked = run_playbook("jobs.yml", extravars={"sync": job}, cmdline="--check")
    assert checked.rc == 0, checked.stdout[-4000:]
    assert f"check mode: job {job}: would bring" in checked.stdout, checked.stdout[-3000:]
    assert not (run / "output").exists() and not (run / "nodes").exists()
    started = time.monotonic()
    first = run_playbook("jobs.yml", extravars={"sync": job})
    first_s = time.monotonic() - started
    assert first.rc == 0, first.stdout[-4000:]
    files, first_bytes, _ = moved(first)
    assert files >= 5 and first_bytes > 0, first.stdout[-3000:]
    assert f"into {run}" in first.stdout
    metrics = (run / "output" / "metrics.jsonl").read_text().splitlines()
    assert metrics and json.loads(metrics[0])["step"] >= 0
    assert (run / "output" / "loss.png").read_bytes().startswith(b"\x89PNG")
    for rank in (0, 1):
        assert (run / "logs" / f"rank.{rank}.log").read_text().strip(), f"rank {rank}'s log is empty"
    assert (run / "nodes" / "node1" / "job.json").is_file() and not list(run.rglob("secrets.json"))
    assert not (run / "status.json").exists() and not (run / "output" / "summary.json").exists()
    # The TensorBoard event files so far, read back with tensorboard's own reader; every node's telemetry.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "output" / "tensorboard"))
    events.Reload()
    assert "train/loss" in events.Tags()["scalars"], events.Tags()
    assert all(event.step >= 0 for event in events.Scalars("train/loss")), events.Scalars("train/loss")
    for node in NODES:
        records = telemetry_of(run / "telemetry" / f"{node}.jsonl")
        assert records and all(set(record) == {"time", "node", "processes", "devices"} for record in records)
        assert all(record["node"] == node for record in records), records[:2]
        assert any(record["processes"]["count"] >= 1 for record in records), records[:2]  # type: ignore[index]
    before = synced_bytes(run)
    # What the job does not write while it runs (its files as sent): the second sync leaves these copies as
    # they are (the same inode: not written again).
    unchanging = [run / "nodes" / node / "job.json" for node in ("node0", "node1")]
    inodes = {path: path.stat().st_ino for path in [*unchanging, run / "nodes" / "node0" / "hostfile"]}

    started = time.monotonic()
    second = run_playbook("jobs.yml", extravars={"sync": job})
    second_s = time.monotonic() - started
    assert second.rc == 0, second.stdout[-4000:]
    _, second_bytes, answered = moved(second)
    grown = synced_bytes(run) - before
    # Only what the job appended since (and its status.json, rewritten whole): never the files again.
    assert second_bytes <= grown + 16384, (second_bytes, grown, second.stdout[-2000:])
    assert {path: path.stat().st_ino for path in inodes} == inodes
    assert answered < first_bytes + 65536
    print(
        f"sync: first {first_bytes} bytes in {first_s:.1f} s, second {second_bytes} bytes in {second_s:.1f} s"
    )

    # The job ran on undisturbed: still running, still stepping, on both nodes.
    step = step_of(job)
    assert status_of(job).get("state") == "running", status_of(job)
    wait_for("a step after the syncs", lambda: step_of(job) > step, 60)
    for node in ("node0", "node1"):
        assert processes(node, job), f"nothing of job {job} runs on {node} after the syncs"
