"""A rank's heartbeat (a file touched at most once a second, nothing outside a job) and its stack dump's
files; ``ddp_cluster.heartbeat()`` without torch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_cluster.runtime import heartbeat as beat


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    """A fresh heartbeat (no touch yet) on a fake monotonic clock, in an environment without a job."""
    fake = Clock()
    monkeypatch.setattr(beat, "_last_beat", None)
    monkeypatch.setattr(beat, "_beat_path", None)
    monkeypatch.setattr(beat, "_beat_failed", False)
    monkeypatch.setattr(beat.time, "monotonic", fake)
    for name in (beat.JOB_DIR_VARIABLE, *beat.RANK_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    yield fake


def test_outside_a_job_a_heartbeat_writes_nothing(
    clock: Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    beat.heartbeat()
    assert list(tmp_path.iterdir()) == []
    assert beat.install_stack_dump(0) is None
    assert list(tmp_path.iterdir()) == []


def test_a_heartbeat_creates_the_folder_and_touches_the_ranks_file(
    clock: Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = tmp_path / "job"  # not there yet: the first heartbeat makes the folder
    monkeypatch.setenv(beat.JOB_DIR_VARIABLE, str(job))
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")  # under mpirun, without torchrun's RANK
    beat.heartbeat()
    assert sorted(path.name for path in (job / "heartbeat").iterdir()) == ["rank.3"]


def test_heartbeats_touch_at_most_once_a_second(
    clock: Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(beat.JOB_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    beat.heartbeat()
    path = tmp_path / "heartbeat" / "rank.1"
    os.utime(path, (1000, 1000))
    clock.now += 0.5
    beat.heartbeat()
    assert path.stat().st_mtime == 1000, "touched again within a second"
    clock.now += 0.5
    beat.heartbeat()
    assert time.time() - path.stat().st_mtime < 60, "not touched a second later"


def test_a_heartbeat_that_cannot_write_says_so_once_and_never_raises(
    clock: Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(beat.JOB_DIR_VARIABLE, str(blocker))
    for _ in range(3):
        beat.heartbeat()
        clock.now += 2
    said = capsys.readouterr().err
    assert said.count("ddp_cluster.heartbeat: cannot touch") == 1, said
    assert str(blocker / "heartbeat" / "rank.0") in said


def test_the_package_exports_heartbeat_without_importing_torch(tmp_path: Path) -> None:
    code = (
        "import sys, ddp_cluster\n"
        "ddp_cluster.heartbeat()\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    env = {**os.environ, "DDP_JOB_DIR": str(tmp_path), "RANK": "2"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "heartbeat" / "rank.2").is_file()
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        import ddp_cluster

        ddp_cluster.nothing_here  # noqa: B018


def test_the_stack_dump_names_the_process_its_start_and_main_thread_and_dumps_on_sigusr2(
    tmp_path: Path,
) -> None:
    code = (
        "import threading, time\n"
        "from ddp_cluster.runtime.heartbeat import install_stack_dump\n"
        "print(install_stack_dump(), hex(threading.main_thread().ident), flush=True)\n"
        "def waiting_here():\n"
        "    time.sleep(60)\n"
        "waiting_here()\n"
    )
    env = {**os.environ, "DDP_JOB_DIR": str(tmp_path), "RANK": "4"}
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        dump, main_thread = child.stdout.readline().split()
        assert dump == str(tmp_path / "stacks" / "rank.4.txt")
        pid, start, thread = (tmp_path / "stacks" / "rank.4.pid").read_text().split()
        assert (int(pid), start, int(thread, 16)) == (
            child.pid,
            beat.process_start_time(child.pid),
            int(main_thread, 16),
        )
        assert start != "-"
        time.sleep(0.2)  # into waiting_here
        os.kill(child.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while "waiting_here" not in Path(dump).read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "waiting_here" in Path(dump).read_text()
        assert child.poll() is None, "SIGUSR2 ended the rank"
    finally:
        child.kill()
        child.wait()
