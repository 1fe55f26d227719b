"""A remote watcher's side: it stops the job's processes on its node when its parent is gone (``end``, its
session closed with no newer session to the node, no ping for ``timeout`` seconds), and only then; a watcher
whose session a blip broke leaves the job to the newer watcher its parent started. The watcher runs in-process
(``main`` over pipes) with a stand-in for pkill."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_cluster.supervisor import liveness
from ddp_cluster.supervisor.liveness import ParentLink, Watch, main, parent_record, sweep_node

EVERY, TIMEOUT = 0.05, 0.5
TAG = "[/]workspace/jobs/20261126-test/"


@pytest.fixture(autouse=True)
def records_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Parent records in the test's own folder, not the machine's /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield


class Remote:
    """``python -m ddp_cluster.supervisor.liveness ARGV`` run in a thread, its input and output pipes held
    as its parent's ssh session holds them; ``sweeps``: the pkill commands it ran."""

    def __init__(self, argv: list[str], spawn: liveness.Spawn | None = None, matched: bool = False) -> None:
        self.sweeps: list[list[str]] = []
        self.lines: list[str] = []
        self.matched = matched
        read_in, self._write_in = os.pipe()
        read_out, write_out = os.pipe()
        self._stdin = open(read_in, encoding="utf-8")  # noqa: SIM115 - closed in _main
        self._to_child = open(self._write_in, "w", encoding="utf-8")  # noqa: SIM115 - closed by hang_up
        self._stdout = open(write_out, "w", encoding="utf-8")  # noqa: SIM115 - closed in _main
        self._from_child = open(read_out, encoding="utf-8")  # noqa: SIM115 - closed by _collect
        self.pinging = threading.Event()
        self.pinging.set()
        self.ended_at: float | None = None
        self.started = time.monotonic()
        options = {"spawn": spawn} if spawn else {}
        self._thread = threading.Thread(target=self._main, args=(argv, options), daemon=True)
        self._thread.start()
        threading.Thread(target=self._collect, daemon=True).start()
        threading.Thread(target=self._ping, daemon=True).start()

    def _main(self, argv: list[str], options: dict[str, liveness.Spawn]) -> None:
        main(argv, stdin=self._stdin, stdout=self._stdout, run=self._pkill, **options)
        self.ended_at = time.monotonic()
        self._stdout.close()

    def _pkill(self, argv: list[str]) -> int:
        self.sweeps.append(argv)
        return 0 if self.matched and "-TERM" in argv else 1

    def _collect(self) -> None:
        with self._from_child:
            self.lines += (line.strip() for line in self._from_child)

    def _ping(self) -> None:
        while self.pinging.wait() and not self._to_child.closed:
            self.say("ping")
            time.sleep(EVERY)

    def say(self, word: str) -> None:
        try:
            self._to_child.write(word + "\n")
            self._to_child.flush()
        except (OSError, ValueError):
            pass

    def hang_up(self) -> None:
        self.pinging.clear()
        self._to_child.close()

    def ended_within(self, seconds: float) -> float | None:
        """Seconds from the start to the watcher's end, None if it did not end within ``seconds``."""
        self._thread.join(seconds)
        return None if self.ended_at is None else self.ended_at - self.started


def leaf(*more: str) -> list[str]:
    return ["--nodes", "node0,node1", "--index", "1", "--every", str(EVERY), "--timeout", str(TIMEOUT), *more]


TERM = ["pkill", "-TERM", "-f", "--", TAG]


def test_end_from_the_parent_sweeps_the_node_at_once() -> None:
    remote = Remote(leaf("--tag", TAG))
    time.sleep(0.2)
    assert remote.sweeps == [] and remote.lines[:2] == ["up -", "up -"]
    remote.say("end")
    took = remote.ended_within(5)
    assert took is not None and remote.sweeps == [TERM]  # nothing matched: no grace, no KILL
    remote.hang_up()


def test_a_parent_whose_session_closed_without_end_is_waited_for_then_swept() -> None:
    # The parent process was killed (the supervisor, say): its ssh client's input ends, no "end" is said.
    remote = Remote(leaf("--tag", TAG))
    time.sleep(0.2)
    closed = time.monotonic()
    remote.hang_up()
    took = remote.ended_within(5)
    assert took is not None and remote.sweeps == [TERM]
    waited = time.monotonic() - closed
    assert TIMEOUT - 0.05 <= waited <= TIMEOUT + 0.5  # the reconnect window: min(timeout, 3*every+ssh)


class ClosedSession:
    """stderr as a remote watcher has it once its ssh session is closed: every write fails."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_session_on_stderr_does_not_stop_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    # A thawed node: its watcher's ssh session was closed while it was frozen, so the line it writes when it
    # finds its parent gone has nowhere to go; it must still sweep the job and give its claim back.
    monkeypatch.setattr(sys, "stderr", ClosedSession())
    remote = Remote(leaf("--tag", TAG))
    time.sleep(0.2)
    remote.hang_up()
    took = remote.ended_within(5)
    assert took is not None and remote.sweeps == [TERM]


def test_a_parent_that_stops_pinging_is_gone_after_its_timeout() -> None:
    # A frozen parent node: its session stays open (half-open TCP), nothing comes.
    remote = Remote(leaf("--tag", TAG))
    time.sleep(0.2)
    remote.pinging.clear()
    silent = time.monotonic()
    took = remote.ended_within(5)
    assert took is not None and remote.sweeps == [TERM]
    assert TIMEOUT - 0.1 <= time.monotonic() - silent <= TIMEOUT + 0.5
    remote.hang_up()


def test_a_pinging_parent_keeps_the_watcher_and_the_job() -> None:
    remote = Remote(leaf("--tag", TAG))
    assert remote.ended_within(3 * TIMEOUT) is None and remote.sweeps == []
    remote.say("end")
    assert remote.ended_within(5) is not None
    remote.hang_up()


def test_without_a_tag_nothing_is_swept() -> None:
    for end in (True, False):
        remote = Remote(leaf())
        time.sleep(0.1)
        remote.say("end") if end else remote.hang_up()
        assert remote.ended_within(5) is not None and remote.sweeps == []
        remote.hang_up()


def test_a_sweep_that_found_processes_kills_what_is_left_after_a_grace() -> None:
    calls: list[list[str]] = []
    slept: list[float] = []

    def pkill(argv: list[str]) -> int:
        calls.append(argv)
        return 0

    sweep_node(TAG, pkill, grace=3.0, sleep=slept.append)  # what TERM reached is still there after 3 s
    assert calls[0] == TERM and calls[-1] == ["pkill", "-KILL", "-f", "--", TAG]
    assert sum(slept) == pytest.approx(3.0) and calls.count(["pgrep", "-f", "--", TAG]) == len(slept)
    calls.clear()
    sweep_node(TAG, pkill, grace=3.0, sleep=slept.append, proceed=lambda: False)  # a newer watcher meanwhile
    assert "-KILL" not in calls[-1]


def test_a_watcher_whose_session_a_blip_broke_leaves_the_job_to_the_newer_one() -> None:
    # The parent's ssh gave up during a blip and reconnected: a newer watcher on this node gets its pings.
    # The old session's end arrives when the network is back: the old watcher ends without a sweep.
    old = Remote(leaf("--tag", TAG))
    time.sleep(0.2)
    old.pinging.clear()  # the blip
    time.sleep(0.2)
    new = Remote(leaf("--tag", TAG))  # the parent's reconnection
    time.sleep(0.1)
    old.hang_up()
    assert old.ended_within(5) is not None and old.sweeps == []
    assert new.ended_within(3 * TIMEOUT) is None and new.sweeps == []  # the newer one watches on
    new.say("end")
    assert new.ended_within(5) is not None and new.sweeps == [TERM]
    new.hang_up()


def test_a_watcher_stopping_the_job_tells_its_children_to_stop_theirs(tmp_path: Path) -> None:
    # node1 watches node2 (fanout 1); its parent is gone: node2's session hears "end" from it.
    heard = tmp_path / "node2.input"

    def spawn(node: str, argv: list[str]) -> subprocess.Popen[str]:
        assert node == "node2" and "--tag" in argv[-1]
        script = f"(while :; do echo up 4.0; sleep {EVERY}; done) & cat > {heard}; kill $!"
        return subprocess.Popen(
            ["sh", "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    argv = ["--nodes", "node0,node1,node2", "--index", "1", "--fanout", "1", "--every", str(EVERY)]
    remote = Remote([*argv, "--timeout", str(TIMEOUT), "--tag", TAG], spawn=spawn)
    time.sleep(0.3)
    assert any(line.startswith("up 4.") for line in remote.lines)  # node2's age, passed up
    remote.pinging.clear()
    assert remote.ended_within(5) is not None and remote.sweeps == [TERM]
    words = heard.read_text().split()
    assert words[0] == "ping" and words[-1] == "end"
    remote.hang_up()


def test_the_parent_link_rules() -> None:
    now = [0]
    second = 1_000_000_000

    def clock() -> int:
        return now[0]

    record = parent_record(TAG)
    link = ParentLink(timeout=25, window=12, record=record, clock=clock)
    for now[0] in range(0, 100 * second, 3 * second):  # pings every 3 s for 100 s
        link.line("ping\n")
        assert link.verdict() is None
    now[0] += 24 * second
    assert link.verdict() is None
    now[0] += 1 * second
    assert link.verdict() == "gone"  # 25 s without a ping
    other = ParentLink(timeout=25, window=12, record=record, clock=clock)
    other.line("ping")
    assert link.verdict() == "superseded" and other.verdict() is None
    other.closed()
    now[0] += 11 * second
    assert other.verdict() is None
    now[0] += 1 * second
    assert other.verdict() == "gone"  # closed and no newer session within the window
    other.line("end")
    assert other.verdict() == "end"
    assert ParentLink(25, 12, clock=clock).verdict() is None
    bare = ParentLink(25, 12, clock=clock)
    bare.closed()
    assert bare.verdict() == "gone"  # nothing can tell a reconnection without a record: no wait


def test_the_watcher_refuses_a_tag_that_its_own_command_line_would_match() -> None:
    with pytest.raises(SystemExit):
        main(leaf("--tag", "/workspace/jobs/20261126-test/"))


def test_the_watcher_as_its_parent_starts_it(tmp_path: Path) -> None:
    # The real command line: a leaf with a tag; the job's log on this node gives its age; "end" ends it.
    log = tmp_path / "logs" / "rank.1"
    log.parent.mkdir()
    log.write_text("step\n")
    watcher = subprocess.Popen(
        [sys.executable, "-m", "ddp_cluster.supervisor.liveness", *leaf("--job-dir", str(tmp_path))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert watcher.stdout is not None and watcher.stdin is not None
    word, age = watcher.stdout.readline().split()
    assert word == "up" and 0 <= float(age) < 5
    watcher.stdin.write("ping\nend\n")
    watcher.stdin.flush()
    assert watcher.wait(timeout=10) == 0


def local(node: str, argv: list[str]) -> subprocess.Popen[str]:
    """ssh's stand-in that runs the remote command here, through a shell as sshd does."""
    command = argv[-1].replace("python", shlex.quote(sys.executable), 1)
    return subprocess.Popen(
        ["sh", "-c", command],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("end", [True, False])
def test_the_sweep_stops_the_jobs_processes_and_not_the_watchers(tmp_path: Path, end: bool) -> None:
    # Real processes and the real pkill: a "rank" whose command line holds the job's folder, the watcher
    # started as its parent starts it (through a shell), the sweep after "end" at once, after a killed
    # parent's session closed without it at the end of the reconnect window.
    job = tmp_path / "jobs" / "20261126-sweep"
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"{job}/train.py"])
    tree = Watch(
        ["node0", "node1"], 0, 1, EVERY, 1, spawn=local, timeout=TIMEOUT, job_dir=job, tag=f"{job}/"
    ).start()
    try:
        time.sleep(1.0)  # its watcher up (a python start)
        assert tree.lost() == [] and rank.poll() is None
        started = time.monotonic()
        tree.close(end=end)
        assert rank.wait(timeout=10) == -15  # TERM
        took = time.monotonic() - started
        assert took < 1.0 if end else TIMEOUT - 0.1 < took < TIMEOUT + 1.5
        tree.stop(within=10, end=end)  # the watcher waits its grace, finds nothing left to KILL, ends
        sessions = [state.session for state in tree._children.values() if state.session is not None]
        assert sessions and all(session.wait(timeout=10) == 0 for session in sessions)  # not stopped by it
    finally:
        rank.kill()
