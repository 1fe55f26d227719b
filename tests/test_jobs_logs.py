"""jobs.yml -e logs=ID on the local cluster (2 nodes, one rank each): one detached job, its logs tailed with
both ranks' prefixes, narrowed to one rank, followed (each new line shown within 2 s of the rank writing it)
and the following stopped with Ctrl-C while the job goes on; the job is stopped with jobs.yml -e stop=ID at
the end. A job no node has is named."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, STATE_DIR, PlaybookResult, run_playbook, running_cluster

# Long enough for every check below (a jobs.yml run takes seconds); stopped by the fixture's teardown.
JOB_ARGS = "--dataset digits --epochs 2000 --batch-size 32 --lr 0.05 --log-every 10"
LINE = re.compile(r"^\[(node\d+) rank (\d+)\] (.*)$")
FOLLOW = (str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", "inventories/local", "jobs.yml")
FOLLOW += ("-e", "follow=true", "-e", "tail=1")
LATENCY = 2.0  # seconds from a rank's write to the follow's line (the target)


def rank_log(job: str, node: str, rank: int) -> Path:
    """A rank's log as mpirun writes it on its node, read through the node's workspace on this machine."""
    return STATE_DIR / node / "workspace" / "jobs" / job / "logs" / "1" / f"rank.{rank}" / "stdout"


def whole_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def logged(output: str) -> list[tuple[str, int, str]]:
    return [(m.group(1), int(m.group(2)), m.group(3)) for m in map(LINE.match, output.splitlines()) if m]


@pytest.fixture(scope="module")
def job(local_cluster_made: list[PlaybookResult]) -> Iterator[str]:
    running_cluster(local_cluster_made)
    name = f"test-logs-{uuid.uuid4().hex[:6]}"
    started = run_playbook(
        "train.yml", extravars={"job_id": name, "nodes": 2, "detach": True, "script_args": JOB_ARGS}
    )
    try:
        assert started.rc == 0, started.stdout[-4000:]
        # mpirun makes each rank's file at the launch, empty: wait for the lines the tests' tails show
        deadline = time.monotonic() + 120
        logs = [rank_log(name, "node0", 0), rank_log(name, "node1", 1)]
        while not all(whole_lines(log) >= 5 for log in logs):
            assert time.monotonic() < deadline, "the ranks wrote no 5 lines within 120 s"
            time.sleep(0.5)
        yield name
    finally:
        stopped = run_playbook("jobs.yml", extravars={"stop": name})
        status = STATE_DIR / "node0" / "workspace" / "jobs" / name / "status.json"
        assert json.loads(status.read_text())["state"] in ("succeeded", "failed"), stopped.stdout[-4000:]


def test_the_tail_has_every_rank_s_last_lines_prefixed(job: str) -> None:
    started = time.monotonic()
    result = run_playbook("jobs.yml", extravars={"logs": job, "tail": 5})
    took = time.monotonic() - started
    assert result.rc == 0, result.stdout[-4000:]
    lines = logged(result.stdout)
    assert [(node, rank) for node, rank, _ in lines] == [("node0", 0)] * 5 + [("node1", 1)] * 5
    # each rank's lines are from its own log: the entrypoint's lines name their rank
    assert all(f"[rank {1 - rank}/2]" not in text for _, rank, text in lines), lines
    assert {rank for _, rank, text in lines if f"[rank {rank}/2]" in text} == {0, 1}, lines
    assert took < 20, f"jobs.yml -e logs took {took:.1f} s"  # bench/bench_logs.py measures it


def test_rank_narrows_the_logs_to_that_rank(job: str) -> None:
    result = run_playbook("jobs.yml", extravars={"logs": job, "rank": 1, "tail": 3})
    assert result.rc == 0, result.stdout[-4000:]
    assert [(node, rank) for node, rank, _ in logged(result.stdout)] == [("node1", 1)] * 3


def test_a_rank_the_job_does_not_have_or_a_job_no_node_has_is_named(job: str) -> None:
    result = run_playbook("jobs.yml", extravars={"logs": job, "rank": 2})
    assert result.rc != 0
    assert f"rank=2: job {job} has ranks 0 to 1" in result.stdout
    result = run_playbook("jobs.yml", extravars={"logs": "test-logs-nosuch"})
    assert result.rc != 0
    assert "no node has job test-logs-nosuch" in result.stdout


class Watcher(threading.Thread):
    """Each new line of the ranks' logs, and when it was first seen in the file (read every 20 ms)."""

    def __init__(self, paths: dict[str, Path]) -> None:
        super().__init__(daemon=True)
        self.paths = paths
        self.seen: dict[tuple[str, str], float] = {}
        self.count: dict[tuple[str, str], int] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        offsets = {key: path.stat().st_size for key, path in self.paths.items()}
        while not self.halt.is_set():
            for key, path in self.paths.items():
                with open(path, "rb") as handle:
                    handle.seek(offsets[key])
                    data = handle.read()
                whole = data[: data.rfind(b"\n") + 1]
                offsets[key] += len(whole)
                now = time.monotonic()
                for line in whole.decode("utf-8", "replace").splitlines():
                    self.seen.setdefault((key, line), now)
                    self.count[(key, line)] = self.count.get((key, line), 0) + 1
            time.sleep(0.02)


def test_follow_shows_new_lines_within_2_s_and_ctrl_c_stops_only_the_following(job: str) -> None:
    watcher = Watcher({"0": rank_log(job, "node0", 0), "1": rank_log(job, "node1", 1)})
    watcher.start()
    follow = subprocess.Popen(
        [*FOLLOW, "-e", f"logs={job}"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=os.environ | {"ANSIBLE_NOCOLOR": "1"},
        start_new_session=True,
    )
    shown: list[tuple[str, str, float]] = []
    output: list[str] = []
    assert follow.stdout is not None
    hung = threading.Timer(180, lambda: os.killpg(follow.pid, signal.SIGKILL))  # a follow that never ends
    hung.start()
    try:
        deadline = time.monotonic() + 60
        for line in follow.stdout:
            output.append(line)
            if match := LINE.match(line.rstrip("\n")):
                shown.append((match.group(2), match.group(3), time.monotonic()))
            if len(shown) > 60 or time.monotonic() > deadline:
                break
        os.killpg(follow.pid, signal.SIGINT)  # as Ctrl-C in its terminal
        rest, _ = follow.communicate(timeout=30)
        output.append(rest)
    finally:
        hung.cancel()
        watcher.halt.set()
        if follow.poll() is None:
            os.killpg(follow.pid, signal.SIGKILL)
    text = "".join(output)
    assert len(shown) > 60, text[-4000:]
    assert {rank for rank, _, _ in shown} == {"0", "1"}, text[-4000:]
    # the first line of each rank is the tail; every line after it was written while following (a text a
    # rank writes more than once, as a blank line, cannot say when it was written: left out)
    once = [(rank, line, at) for rank, line, at in shown[2:] if watcher.count.get((rank, line)) == 1]
    delays = [at - watcher.seen[(rank, line)] for rank, line, at in once]
    assert len(delays) > 30, (len(delays), text[-3000:])
    worst = max(delays)
    in_order = "\n".join(
        f"{at - watcher.seen[(rank, line)]:.2f} {at:.2f} {rank} {line}" for rank, line, at in once
    )
    said = f"a line showed {worst:.2f} s after its rank wrote it (delay, shown at, rank, line):\n{in_order}"
    assert worst < LATENCY, said
    # Ctrl-C ended the following; the job goes on: its ranks still write
    sizes = rank_log(job, "node1", 1).stat().st_size
    time.sleep(2)
    assert rank_log(job, "node1", 1).stat().st_size > sizes, "the job stopped with the following"
