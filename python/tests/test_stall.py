"""The progress watchdog: its rules on fake times, the stacks' capture (a fake mesh, then real processes that
registered the dump), and a stall's restart."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_cluster.runtime import heartbeat
from ddp_cluster.supervisor import liveness, stall
from ddp_cluster.supervisor.failures import Failure, restart_cause
from ddp_cluster.supervisor.stall import STALL, Watchdog, capture, summary


def test_the_supervisor_reads_the_folders_the_ranks_write() -> None:
    assert stall.STACKS_DIR == heartbeat.STACKS_DIR
    if not hasattr(liveness, "HEARTBEAT_DIR"):
        pytest.skip("the liveness tree does not read heartbeats yet")
    assert liveness.HEARTBEAT_DIR == heartbeat.HEARTBEAT_DIR


# --- the rules ---------------------------------------------------------------------------------------------
STARTED = 1000.0


def test_without_a_stall_timeout_nothing_is_ever_a_stall() -> None:
    dog = Watchdog(0, 120, STARTED)
    assert dog.check(STARTED + 5, 1) is None
    assert dog.check(STARTED + 99_999, None) is None
    assert dog.check(STARTED + 99_999, 99_000) is None


def test_no_progress_at_all_is_a_stall_once_the_start_allowance_is_over() -> None:
    dog = Watchdog(60, 120, STARTED)
    assert dog.check(STARTED + 119, None) is None
    reason = dog.check(STARTED + 121, None)
    assert reason is not None and reason.startswith("no progress within 121 s of the start")
    assert "stall_start_timeout=120" in reason


def test_a_previous_attempts_logs_are_not_this_attempts_progress() -> None:
    dog = Watchdog(60, 120, STARTED)
    assert dog.check(STARTED + 50, 100) is None  # written 50 s before the start: still starting up
    reason = dog.check(STARTED + 121, 171)
    assert reason is not None and "stall_start_timeout=120" in reason


def test_after_the_first_progress_a_silence_longer_than_stall_timeout_is_a_stall() -> None:
    dog = Watchdog(60, 600, STARTED)
    assert dog.check(STARTED + 10, 0) is None  # a first line of output: the watch is armed
    assert dog.check(STARTED + 70, 60) is None
    reason = dog.check(STARTED + 70.2, 60.2)
    assert reason is not None and reason.startswith("no progress for 61 s (stall_timeout=60: no rank printed")
    # Well within stall_start_timeout=600: that allowance covers the wait for the first progress only.


def test_steady_progress_is_never_a_stall_and_a_silence_is_measured_from_the_newest() -> None:
    dog = Watchdog(60, 120, STARTED)
    for now in range(int(STARTED) + 1, int(STARTED) + 5000, 7):
        assert dog.check(now, 3) is None
    assert dog.check(STARTED + 5050, 40) is None  # newest progress at +5010
    assert dog.check(STARTED + 5069, 90) is None  # an older age from a slower node: +5010 still stands
    assert dog.check(STARTED + 5071, 90) is not None


def test_a_poll_where_no_node_answered_keeps_the_last_progress_seen() -> None:
    dog = Watchdog(60, 600, STARTED)
    assert dog.check(STARTED + 10, 0) is None
    assert dog.check(STARTED + 60, None) is None
    assert dog.check(STARTED + 71, None) is not None


def test_a_restart_has_its_own_start_allowance() -> None:
    dog = Watchdog(20, 120, STARTED)
    assert dog.check(STARTED + 10, 0) is None
    assert dog.check(STARTED + 40, 30) is not None
    dog.reset(2000.0)
    assert dog.check(2010.0, 40) is None  # the stalled attempt's last line: not this one's progress
    assert dog.check(2119.0, None) is None
    assert dog.check(2121.0, None) is not None
    dog.reset(3000.0)
    assert dog.check(3005.0, 1) is None
    assert dog.check(3024.0, None) is None
    assert dog.check(3026.0, None) is not None


def test_a_stall_is_restartable_and_named_and_a_stop_is_not() -> None:
    reason = "the job stalled: no progress for 62 s (stall_timeout=60: ...); not in a collective: rank 1"
    assert restart_cause(Failure(reason, cause=STALL), []) == reason
    assert restart_cause(Failure("no progress", cause=STALL), []) == "the job stalled: no progress"
    assert restart_cause(Failure(reason, cause=STALL, restartable=False), []) is None
    assert restart_cause(Failure(reason), []) is None  # the cause is the field, not the words


# --- the stacks: a fake mesh -------------------------------------------------------------------------------
IN_BARRIER = """\
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0000000001 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4159 in barrier
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/workspace/jobs/j/workdir/train.py", line 30 in main
  File "<frozen runpy>", line 88 in _run_code
"""
# The signal landed on a helper thread ("Current"): the main thread, named by the pid file, is the first.
SLEEPING = """\
Thread 0x00007f00000000aa (most recent call first):
  File "/workspace/jobs/j/workdir/train.py", line 27 in main
  File "<frozen runpy>", line 88 in _run_code

Current thread 0x00007f00000000bb (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/timer.py", line 12 in loop
"""
IN_BACKWARD = """\
Current thread 0x00007f0000000001 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 823 in _engine_run_backward
  File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 626 in backward
  File "/src/ddp_cluster/runtime/train.py", line 111 in run_batch
"""


def answers(files: dict[str, str]) -> str:
    return "".join(f"{stall.FILE_MARK}{name}\n{text}\n" for name, text in files.items())


def test_capture_names_the_ranks_outside_a_collective_and_keeps_their_stacks(tmp_path: Path) -> None:
    said = {
        "node0": (
            f"signalled 0\nsignalled 1\n{stall.ANSWERED}\n",
            answers(
                {
                    "rank.0.txt": IN_BARRIER,
                    "rank.1.txt": SLEEPING,
                    "rank.0.pid": "100 555 0x7f0000000001\n",
                    "rank.1.pid": "101 556 0x7f00000000aa\n",
                    "py-spy.rank.1.txt": "Thread 101 (idle): MainThread\n",
                }
            ),
        ),
        "node1": (f"signalled 2\nsignalled 3\n{stall.ANSWERED}\n", answers({"rank.2.txt": IN_BACKWARD})),
        "node2": ("", ""),  # does not answer
    }
    asked: list[tuple[str, str]] = []

    def run(node: str, command: str) -> str:
        asked.append((node, command))
        signalling = "kill -USR2" in command
        return said[node][0 if signalling else 1]

    started = time.monotonic()
    captured = capture(run, ["node0", "node1", "node2"], str(tmp_path) + "/", wait=0.2)
    assert time.monotonic() - started < 5
    assert captured["ranks"] == {
        0: {
            "node": "node0",
            "in_collective": True,
            "top": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:4159 barrier",
        },
        1: {"node": "node0", "in_collective": False, "top": "/workspace/jobs/j/workdir/train.py:27 main"},
        2: {
            "node": "node1",
            "in_collective": True,
            "top": "/venv/lib/python3.11/site-packages/torch/autograd/graph.py:823 _engine_run_backward",
        },
        3: {"node": "node1", "in_collective": False, "top": stall.NO_DUMP},
    }
    assert captured["not_in_collective"] == [1, 3]
    assert captured["no_answer"] == ["node2"]
    assert captured["stacks_dir"] == str(tmp_path / "stacks")
    assert (tmp_path / "stacks" / "node0" / "rank.1.txt").read_text() == SLEEPING
    assert (tmp_path / "stacks" / "node0" / "py-spy.rank.1.txt").read_text().startswith("Thread 101")
    assert (tmp_path / "stacks" / "node1" / "rank.2.txt").read_text() == IN_BACKWARD
    # The job's processes are found by "JOB/" in their command lines: the capture's own never holds it.
    assert all(f"{tmp_path}/" not in command for _, command in asked)
    line = summary(captured)
    assert "rank 1 on node0 (at /workspace/jobs/j/workdir/train.py:27 main)" in line
    assert "rank 3 on node1" in line and str(tmp_path / "stacks") in line


# --- the stacks: real processes ----------------------------------------------------------------------------
RANK_PROGRAM = """\
import sys, time
sys.path.insert(0, sys.argv[1])
from ddp_cluster.runtime.heartbeat import install_stack_dump
install_stack_dump()
def waiting_outside():
    time.sleep(120)
if sys.argv[2] == "collective":
    from torch.distributed import distributed_c10d  # a stand-in, from sys.argv[1]
    distributed_c10d.barrier()
else:
    waiting_outside()
"""


def local_run(node: str, command: str) -> str:
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=60, check=False)
    return done.stdout


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[tuple[Path, list[subprocess.Popen[bytes]]]]:
    """A job folder with two live ranks that registered the dump: rank 0 waits in a (stand-in) collective,
    rank 1 sleeps in its own code; and a stale pid file naming a live process started after it (a reused
    pid), which SIGUSR2 would kill."""
    job = tmp_path / "job"
    stand_in = tmp_path / "lib" / "torch" / "distributed"
    stand_in.mkdir(parents=True)
    (stand_in.parent / "__init__.py").write_text("")
    (stand_in / "__init__.py").write_text("")
    (stand_in / "distributed_c10d.py").write_text("import time\n\ndef barrier():\n    time.sleep(120)\n")
    program = tmp_path / "rank.py"
    program.write_text(RANK_PROGRAM)
    children = []
    for rank, where in ((0, "collective"), (1, "outside")):
        env = {**os.environ, "DDP_JOB_DIR": str(job), "RANK": str(rank)}
        children.append(
            subprocess.Popen([sys.executable, str(program), str(tmp_path / "lib"), where], env=env)
        )
    bystander = subprocess.Popen(["sleep", "120"])
    children.append(bystander)
    try:
        deadline = time.monotonic() + 30
        while not all((job / "stacks" / f"rank.{rank}.pid").exists() for rank in (0, 1)):
            assert time.monotonic() < deadline, "the ranks did not register their dump"
            time.sleep(0.05)
        (job / "stacks" / "rank.7.pid").write_text(f"{bystander.pid} 1 0x1\n")
        time.sleep(0.3)  # into their sleeps
        yield job, children
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_capture_of_real_ranks_names_the_one_outside_a_collective(
    ranks: tuple[Path, list[subprocess.Popen[bytes]]],
) -> None:
    job, children = ranks
    captured = capture(local_run, ["here"], str(job), wait=1.0)
    assert captured["not_in_collective"] == [1], captured
    assert captured["ranks"][0]["in_collective"] is True
    assert captured["ranks"][0]["top"].endswith("torch/distributed/distributed_c10d.py:4 barrier")
    assert captured["ranks"][1]["top"].endswith("rank.py:6 waiting_outside")
    assert 7 not in captured["ranks"]
    assert all(child.poll() is None for child in children), "SIGUSR2 ended a process"
    saved = (job / "stacks" / "here" / "rank.1.txt").read_text()
    assert "waiting_outside" in saved and "ddp_cluster stack dump" not in saved
    # A second capture reads its own dump, not the first one's.
    again = capture(local_run, ["here"], str(job), wait=1.0)
    assert again["not_in_collective"] == [1]
    assert (job / "stacks" / "rank.1.txt").read_text().count("waiting_outside") == 2
    assert (job / "stacks" / "here" / "rank.1.txt").read_text().count("waiting_outside") == 1
