"""The tree the nodes are watched along, and one node's watch of its children: a child unheard for ``timeout``
seconds is lost whatever ssh said (a frozen node's logins that time out in the banner exchange, a dead one's
refusals), one heard again before that is not (a blip); a grandchild's loss travels up; the progress ages of
the subtree; the nodes a verdict is due on. Sessions are in-process stand-ins for ssh (:class:`Fake`), so the
tests run with intervals of tens of milliseconds."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import pytest

from ddp_cluster.supervisor import liveness
from ddp_cluster.supervisor.liveness import Watch, children, depth, node_activity_age, ssh_argv, tag_pattern

NODES = [f"node{index}" for index in range(16)]
EVERY, TIMEOUT = 0.05, 0.5

BANNER = "Connection timed out during banner exchange\r\nConnection to node1 port 22 timed out\r\n"
REFUSED = "ssh: connect to host node1 port 22: Connection refused\r\n"
NO_ROUTE = "ssh: connect to host node1 port 22: No route to host\r\n"
SILENT = "Timeout, server node1 not responding.\r\n"


class Input:
    """A session's input: what the parent said to the child."""

    def __init__(self, closing: threading.Event) -> None:
        self.words: list[str] = []
        self.closed = False
        self._closing = closing

    def write(self, text: str) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        self.words += text.split()
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True
        self._closing.set()


class Fake:
    """A stand-in ssh session: ``lines`` one per ``gap`` s (``forever``: the last one again and again), then
    silence for ``linger`` s, then ``stderr`` and the exit ``code``. It ends early when killed, or when its
    input closes unless ``frozen`` (a frozen node's session ends only when ssh gives up or is killed)."""

    def __init__(
        self,
        lines: list[str] | None = None,
        stderr: str = "",
        code: int = 0,
        gap: float = EVERY,
        linger: float = 0.0,
        forever: bool = False,
        frozen: bool = False,
    ) -> None:
        self.lines, self.gap, self.linger, self.forever = lines or [], gap, linger, forever
        self.code, self.frozen, self._stderr = code, frozen, stderr
        self._end = threading.Event()
        self._killed = False
        self.stdin = Input(threading.Event() if frozen else self._end)
        read, write = os.pipe()
        self.stdout = open(read, encoding="utf-8")  # noqa: SIM115 - closed by the reader's end of file
        self._out = open(write, "w", encoding="utf-8")  # noqa: SIM115 - closed by _run
        self.stderr = io.StringIO()
        self.returncode: int | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        index = 0
        while not self._end.is_set() and (index < len(self.lines) or (self.forever and self.lines)):
            self._out.write(self.lines[min(index, len(self.lines) - 1)] + "\n")
            self._out.flush()
            index += 1
            self._end.wait(self.gap)
        self._end.wait(self.linger)
        self.stderr.write(self._stderr)
        self.stderr.seek(0)
        self._out.close()
        self.returncode = -9 if self._killed else self.code

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._thread.join(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired("ssh", timeout or 0)
        return self.returncode

    def kill(self) -> None:
        self._killed = True
        self._end.set()


def up_forever(age: str = "") -> Fake:
    """A child whose watcher says ``up`` every interval until its input closes."""
    return Fake([f"up {age}".strip()], forever=True)


def failing(stderr: str) -> Fake:
    return Fake([], stderr, 255, linger=0.01)


Plan = Callable[[float], Fake]  # seconds since the watch started -> the session a new connection gets


class Spawner:
    """Sessions by node and by time since the watch started (a node without a plan answers forever)."""

    def __init__(self, plans: dict[str, Plan]) -> None:
        self.plans = plans
        self.started = time.monotonic()
        self.sessions: dict[str, list[Fake]] = {}
        self.argvs: list[list[str]] = []

    def __call__(self, node: str, argv: list[str]) -> subprocess.Popen[str]:
        self.argvs.append(argv)
        plan = self.plans.get(node, lambda elapsed: up_forever())
        session = plan(time.monotonic() - self.started)
        self.sessions.setdefault(node, []).append(session)
        return cast("subprocess.Popen[str]", session)

    def calls(self, node: str) -> int:
        return len(self.sessions.get(node, []))


@contextmanager
def watching(
    plans: dict[str, Plan], count: int = 3, timeout: float = TIMEOUT, **options: object
) -> Iterator[tuple[Watch, Spawner, list[str]]]:
    spawn = Spawner(plans)
    reported: list[str] = []
    tree = Watch(
        NODES[:count],
        0,
        fanout=4,
        every=EVERY,
        ssh_timeout=1,
        report=reported.append,
        spawn=spawn,
        timeout=timeout,
        **options,  # type: ignore[arg-type]
    )
    tree.start()
    try:
        yield tree, spawn, reported
    finally:
        tree.stop(within=2.0)


def wait_for(condition: Callable[[], object], seconds: float = 10.0) -> float:
    """Seconds until ``condition`` held (``seconds`` if it never did)."""
    started = time.monotonic()
    while not condition() and time.monotonic() - started < seconds:
        time.sleep(0.01)
    return time.monotonic() - started


# --- the tree -----------------------------------------------------------------------------------------------
def test_the_tree_gives_the_first_node_fanout_children_whatever_the_size() -> None:
    for count in (2, 5, 16, 128, 1152):
        tree = {index: children(index, count) for index in range(count)}
        assert len(tree[0]) == min(4, count - 1)
        assert sorted(child for kids in tree.values() for child in kids) == list(range(1, count))  # each once
        assert max(len(kids) for kids in tree.values()) <= 4
    assert children(0, 16) == [1, 2, 3, 4] and children(3, 16) == [13, 14, 15] and children(4, 16) == []
    assert [depth(count) for count in (1, 2, 5, 6, 21, 22, 1152)] == [0, 1, 1, 2, 2, 3, 5]


def test_the_watchers_command_lines_do_not_match_the_jobs_sweep() -> None:
    # The sweep (pkill -f on the tag's pattern) runs on the child and on this node: neither the watcher's
    # command line there nor the ssh client's here may match it, or the sweep would stop the watch itself.
    tag = "/workspace/jobs/20261126-abc/"
    tree = Watch(
        NODES[:6], 0, every=3, ssh_timeout=3, timeout=25, job_dir="/workspace/jobs/20261126-abc/", tag=tag
    )
    remote = tree.remote(1)
    ssh = ssh_argv("node1", remote, 3, 3)
    assert remote[remote.index("--job-dir") + 1] == "/workspace/jobs/20261126-abc"
    assert remote[remote.index("--tag") + 1] == "[/]workspace/jobs/20261126-abc/"
    assert remote[remote.index("--timeout") + 1] == "25"
    pattern = re.compile(tag_pattern(tag))
    assert not pattern.search(" ".join(remote)) and not pattern.search(" ".join(ssh))
    assert pattern.search(f"python train.py --output {tag}ckpt")  # ... and does match the job's ranks
    assert "'[/]workspace/jobs/20261126-abc/'" in ssh[-1]  # quoted: the remote shell does not glob it
    assert "ConnectTimeout=3" in ssh and "ServerAliveInterval=3" in ssh and "ServerAliveCountMax=3" in ssh
    # Its own TCP connection: over the mesh's shared one (ControlMaster) the keepalives would be the master's.
    fresh = ssh.index("ControlPath=none")
    assert ssh[fresh - 1] == "-o" and fresh < ssh.index("node1")
    assert "--tag" not in Watch(NODES[:2]).remote(1) and "--job-dir" not in Watch(NODES[:2]).remote(1)


@pytest.mark.parametrize("count", [1, 2, 16])
def test_the_first_node_opens_at_most_fanout_sessions(count: int) -> None:
    with watching({}, count=count) as (_, spawn, _):
        time.sleep(0.3)
    assert sorted(spawn.sessions) == NODES[1 : min(count, 5)]


# --- the time rule ------------------------------------------------------------------------------------------
def test_a_frozen_child_is_lost_within_its_timeout() -> None:
    # A frozen node's kernel still answers TCP: each login ends in the banner exchange, never "down".
    with watching({"node1": lambda elapsed: failing(BANNER)}) as (tree, spawn, reported):
        took = wait_for(tree.lost)
        assert tree.lost() == ["node1"] and reported == ["node1"]
        assert TIMEOUT - 0.05 <= took <= TIMEOUT + 0.4
        assert "not heard from" in tree.why("node1") and "banner exchange" in tree.why("node1")
        calls = spawn.calls("node1")
        time.sleep(0.2)
        # No more sessions to a lost node: at most the one its thread was starting as the verdict came (it
        # sees the verdict once started, and ends it at once), then none.
        settled = spawn.calls("node1")
        assert settled - calls <= 1
        time.sleep(0.3)
        assert spawn.calls("node1") == settled
        assert tree.lost() == ["node1"]  # node2, heard all along, is not


def test_a_frozen_child_whose_session_stays_open_is_lost_within_its_timeout() -> None:
    # It froze after its first word: the session stays open, silent, until ssh's keepalives give up.
    with watching({"node1": lambda elapsed: Fake(["up 1.0"], frozen=True, linger=60)}) as (tree, spawn, _):
        took = wait_for(tree.lost)
        assert tree.lost() == ["node1"] and took <= TIMEOUT + 0.4
        # its session is ended by the watcher that found it lost, not left to ssh (just after the verdict)
        session = spawn.sessions["node1"][0]
        wait_for(lambda: session.returncode is not None, seconds=2.0)
        assert session.returncode == -9


def test_a_dead_child_is_lost_after_its_timeout_not_after_a_few_refusals() -> None:
    with watching({"node1": lambda elapsed: failing(REFUSED)}) as (tree, spawn, _):
        took = wait_for(tree.lost)
        assert tree.lost() == ["node1"] and TIMEOUT - 0.05 <= took <= TIMEOUT + 0.4
        assert spawn.calls("node1") >= 4  # reconnected about every second (every interval here) meanwhile


def test_a_child_that_blips_for_less_than_its_timeout_is_never_lost() -> None:
    # Twice 0.4 s without the network (timeout 1.0): the session goes silent and ssh gives up on it, the
    # reconnections find no route, then the child answers again.
    blips = [(0.3, 0.7), (1.4, 1.8)]

    def blipping(elapsed: float) -> Fake:
        if any(start <= elapsed < end for start, end in blips):
            return failing(NO_ROUTE)
        following = [start for start, _ in blips if start > elapsed]
        if not following:
            return up_forever()
        lines = max(1, int((following[0] - elapsed) / EVERY))
        return Fake(["up"] * lines, SILENT, 255, linger=0.1)  # up until the blip, silent, then ssh ends it

    with watching({"node1": blipping, "node2": blipping}, timeout=1.0) as (tree, spawn, _):
        time.sleep(2.4)
        assert tree.lost() == [] and tree.suspects() == []
        assert spawn.calls("node1") >= 5  # reconnected during each blip


def test_a_child_silent_on_an_open_session_for_less_than_its_timeout_is_not_lost() -> None:
    # A blip that does not end the session: silence, then the lines come again.
    with watching({"node1": lambda elapsed: Fake(["up", "up"], gap=0.45, linger=0.3)}, timeout=1.0) as (
        tree,
        _,
        _,
    ):
        time.sleep(1.5)
        assert tree.lost() == []


def test_a_grandchild_reported_by_its_parent_is_named() -> None:
    with watching({"node1": lambda elapsed: Fake(["up", "down node5", "up"], linger=60)}, count=6) as (
        tree,
        _,
        reported,
    ):
        wait_for(tree.lost)
        assert tree.lost() == ["node5"] and reported == ["node5"]
        assert tree.why("node5") == "node5 was reported lost by node1"


def test_a_child_where_the_watcher_cannot_run_has_its_children_watched_from_here() -> None:
    # node1 answers ssh but its watcher fails (an older image, say): node5, its child, is watched from node0;
    # node1's logins count as heard, so it is not lost.
    with watching(
        {"node1": lambda elapsed: Fake([], "ModuleNotFoundError: No module named 'ddp_cluster'\n", 1)},
        count=6,
    ) as (tree, spawn, _):
        wait_for(lambda: spawn.calls("node5") >= 1)
        assert spawn.calls("node5") >= 1
        time.sleep(TIMEOUT + 0.2)
        assert tree.lost() == []


def test_suspects_are_the_children_unheard_for_two_intervals_until_lost() -> None:
    started = time.monotonic()  # node1 says its one "up" after this (it may, before the block below starts)
    with watching({"node1": lambda elapsed: Fake(["up"], frozen=True, linger=60)}, timeout=1.0) as (
        tree,
        _,
        _,
    ):
        time.sleep(0.03)
        assert tree.suspects() == [] and tree.heard_within(0.5)
        wait_for(lambda: tree.suspects())
        assert tree.suspects() == ["node1"]  # node2 keeps talking
        assert 2 * EVERY <= time.monotonic() - started < 1.0
        assert not tree.heard_within(2 * EVERY) and tree.lost() == []
        wait_for(tree.lost)
        assert tree.lost() == ["node1"] and tree.suspects() == []


# --- the parent's words -------------------------------------------------------------------------------------
def test_the_parent_pings_each_session_every_interval_and_says_end_when_it_stops() -> None:
    with watching({}) as (tree, spawn, _):
        time.sleep(0.4)
        session = spawn.sessions["node1"][0]
        assert session.stdin.words[0] == "ping" and session.stdin.words.count("ping") >= 4
        tree.stop()
        assert session.stdin.words[-1] == "end" and session.stdin.closed
    with watching({}) as (tree, spawn, _):
        time.sleep(0.1)
        tree.stop(end=False)  # a watcher superseded by a newer one: its children wait for that one's sessions
        assert "end" not in spawn.sessions["node1"][0].stdin.words


def test_stop_ends_every_session_at_once() -> None:
    with watching(
        {node: lambda elapsed: Fake(["up"], frozen=True, linger=60) for node in NODES}, count=16
    ) as (
        tree,
        _,
        _,
    ):
        time.sleep(0.2)
        started = time.monotonic()
        tree.stop(within=1.0)
        assert time.monotonic() - started < 2.0


# --- progress ages ------------------------------------------------------------------------------------------
def test_a_nodes_activity_age_is_its_newest_log_heartbeat_or_metrics(tmp_path: Path) -> None:
    assert node_activity_age(tmp_path) is None
    log = tmp_path / "logs" / "1" / "rank.3" / "stdout"
    log.parent.mkdir(parents=True)
    log.write_text("step 1\n")
    os.utime(log, (1000.0, 1000.0))
    assert node_activity_age(tmp_path, now=1030.0) == pytest.approx(30.0)
    beat = tmp_path / liveness.HEARTBEAT_DIR / "rank.3"
    beat.parent.mkdir()
    beat.touch()
    os.utime(beat, (1020.0, 1020.0))
    assert node_activity_age(tmp_path, now=1030.0) == pytest.approx(10.0)
    metrics = tmp_path / "output" / "metrics.jsonl"
    metrics.parent.mkdir()
    metrics.write_text("{}\n")
    os.utime(metrics, (1025.0, 1025.0))
    assert node_activity_age(tmp_path, now=1030.0) == pytest.approx(5.0)
    other = tmp_path / "output" / "model.pt"  # not a sign of progress
    other.write_text("x")
    os.utime(other, (1029.0, 1029.0))
    assert node_activity_age(tmp_path, now=1030.0) == pytest.approx(5.0)
    assert node_activity_age(tmp_path, now=900.0) == 0.0  # a clock behind the files: no negative age


def test_the_activity_age_is_the_freshest_in_the_subtree_aged_since_it_came(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "rank.0"
    log.parent.mkdir()
    log.write_text("x")
    os.utime(log, (time.time() - 50, time.time() - 50))
    plans: dict[str, Plan] = {
        "node1": lambda elapsed: Fake(["up 7.5", "up"], linger=60),  # an "up" without an age: still 7.5
        "node2": lambda elapsed: Fake(["up 20"], linger=60),
        "node3": lambda elapsed: Fake(["up -"], linger=60),  # nothing known below node3
    }
    with watching(plans, count=4, timeout=5.0, job_dir=tmp_path) as (tree, _, _):
        time.sleep(0.5)
        age = tree.activity_age()
        assert age is not None and 7.5 + 0.3 <= age <= 7.5 + 0.6
        time.sleep(0.3)
        later = tree.activity_age()
        assert later is not None and later - age == pytest.approx(0.3, abs=0.1)
        log.write_text("y")  # this node's own progress, now
        fresh = tree.activity_age()
        assert fresh is not None and fresh < 0.5
    with watching({"node1": lambda elapsed: Fake(["up -"], linger=60)}, count=2) as (tree, _, _):
        time.sleep(0.1)
        assert tree.activity_age() is None


# --- the remote watcher, run as its parent runs it ----------------------------------------------------------
LEAF = ["--nodes", "node0,node1", "--index", "1", "--every", "0.1"]


def test_the_remote_watcher_says_up_and_ends_with_its_parents_session() -> None:
    # A leaf (no children): it prints "up AGE" until its input ends.
    leaf = subprocess.Popen(
        [sys.executable, "-m", "ddp_cluster.supervisor.liveness", *LEAF],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert leaf.stdout is not None and leaf.stdin is not None
    assert leaf.stdout.readline() == "up -\n" and leaf.stdout.readline() == "up -\n"
    leaf.stdin.close()
    assert leaf.wait(timeout=10) == 0
