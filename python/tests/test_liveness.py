"""The tree the nodes are watched along, and one node's watch of its children, judged by ssh's own words: a
dead child is named after two misses (also when a grandchild's death is reported by its parent), a busy one
never. Sessions are stand-ins for ssh (a local process that prints what a child's watcher prints and ends as
ssh ends)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ddp_cluster.supervisor import liveness
from ddp_cluster.supervisor.liveness import Watch, children, depth

NODES = [f"node{index}" for index in range(16)]


def test_the_tree_gives_the_first_node_fanout_children_whatever_the_size() -> None:
    for count in (2, 5, 16, 128, 1152):
        tree = {index: children(index, count) for index in range(count)}
        assert len(tree[0]) == min(4, count - 1)
        assert sorted(child for kids in tree.values() for child in kids) == list(range(1, count))  # each once
        assert max(len(kids) for kids in tree.values()) <= 4
    assert children(0, 16) == [1, 2, 3, 4] and children(3, 16) == [13, 14, 15] and children(4, 16) == []
    assert [depth(count) for count in (1, 2, 5, 6, 21, 22, 1152)] == [0, 1, 1, 2, 2, 3, 5]


def session(stdout: str, stderr: str, code: int, linger: float = 0.0) -> subprocess.Popen[str]:
    """A stand-in ssh session: prints ``stdout`` lines, then ``stderr``, then ends with ``code``."""
    script = (
        "import sys, time\n"
        f"sys.stdout.write({stdout!r}); sys.stdout.flush(); time.sleep({linger})\n"
        f"sys.stderr.write({stderr!r}); sys.exit({code})\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def scripted(plans: dict[str, list[tuple[str, str, int]]]) -> tuple[liveness.Spawn, dict[str, int]]:
    calls: dict[str, int] = {}

    def spawn(node: str, argv: list[str]) -> subprocess.Popen[str]:
        assert argv[0] == "ssh" and argv[-2] == node and "ServerAliveInterval=1" in argv
        plan = plans.get(node, [UP])
        index = calls.get(node, 0)
        calls[node] = index + 1
        return session(*plan[min(index, len(plan) - 1)])

    return spawn, calls


@contextlib.contextmanager
def watch(spawn: liveness.Spawn, reported: list[str], count: int = 3) -> Iterator[Watch]:
    tree = Watch(NODES[:count], 0, fanout=4, every=0.2, ssh_timeout=1, report=reported.append, spawn=spawn)
    tree.start()
    try:
        yield tree
    finally:
        tree.stop()


def wait_for(condition: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)


UP = ("up\n", "", 0)
SILENT = ("up\nup\n", "Timeout, server node1 not responding.\r\n", 255)
NO_ROUTE = ("", "ssh: connect to host node1 port 12345: No route to host\r\n", 255)
BUSY = ("", "Connection timed out during banner exchange\r\n", 255)


def test_a_child_gone_is_named_after_its_keepalives_and_a_refused_reconnection() -> None:
    spawn, calls = scripted({"node1": [SILENT, NO_ROUTE], "node2": [("up\n" * 3, "", 0)]})
    reported: list[str] = []
    with watch(spawn, reported) as tree:
        wait_for(tree.lost)
        assert tree.lost() == ["node1"] and reported == ["node1"]
        assert calls["node1"] == 2  # no more sessions to a lost node


def test_a_busy_child_is_never_declared_dead() -> None:
    spawn, calls = scripted({"node1": [SILENT, BUSY], "node2": [UP]})
    reported: list[str] = []
    with watch(spawn, reported) as tree:
        wait_for(lambda: calls.get("node1", 0) >= 6)
        assert calls["node1"] >= 6 and tree.lost() == []  # one miss, then only "slow" answers


def test_a_watcher_that_ends_on_the_child_is_not_a_miss() -> None:
    spawn, calls = scripted(
        {"node1": [("", "Traceback: ...\n", 1), NO_ROUTE, ("up\n", "", 1)], "node2": [UP]}
    )
    reported: list[str] = []
    with watch(spawn, reported) as tree:
        wait_for(lambda: calls.get("node1", 0) >= 5)
        assert tree.lost() == []  # no route once, then the node answered again: misses start over


def test_a_grandchild_reported_by_its_parent_is_named() -> None:
    spawn, _ = scripted({"node1": [("up\ndown node5\nup\n", "", 0)], "node2": [UP]})
    reported: list[str] = []
    with watch(spawn, reported, count=6) as tree:
        wait_for(tree.lost)
        assert tree.lost()[0] == "node5"


@pytest.mark.parametrize("count", [1, 2, 16])
def test_the_first_node_opens_at_most_fanout_sessions(count: int) -> None:
    opened: list[str] = []

    def spawn(node: str, argv: list[str]) -> subprocess.Popen[str]:
        opened.append(node)
        return session("up\n", "", 0, linger=5)

    tree = Watch(NODES[:count], 0, fanout=4, every=0.2, spawn=spawn).start()
    time.sleep(0.5)
    tree.stop()
    assert sorted(set(opened)) == NODES[1 : min(count, 5)]


def test_the_remote_watcher_says_up_and_ends_with_its_parents_session() -> None:
    # A leaf (no children): it prints "up" until its input ends.
    leaf = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddp_cluster.supervisor.liveness",
            "--nodes",
            "node0,node1",
            "--index",
            "1",
            "--every",
            "0.1",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert leaf.stdout is not None and leaf.stdin is not None
    assert leaf.stdout.readline() == "up\n" and leaf.stdout.readline() == "up\n"
    leaf.stdin.close()
    assert leaf.wait(timeout=10) == 0


def test_a_child_where_the_watcher_cannot_run_has_its_children_watched_from_here() -> None:
    # node1 answers ssh but its watcher fails (an older image, say): node5, its child, is watched from node0.
    spawn, calls = scripted({"node1": [("", "ModuleNotFoundError: No module named 'ddp_cluster'\n", 1)]})
    with watch(spawn, [], count=6) as tree:
        wait_for(lambda: calls.get("node5", 0) >= 1)
        assert calls.get("node5", 0) >= 1 and tree.lost() == []


def test_stop_ends_every_session_at_once() -> None:
    def spawn(node: str, argv: list[str]) -> subprocess.Popen[str]:
        return session("up\n", "", 0, linger=60)  # sessions that would outlive the watch

    tree = Watch(NODES, 0, fanout=4, every=0.2, spawn=spawn).start()
    time.sleep(0.5)
    started = time.monotonic()
    tree.stop(within=2.0)
    assert time.monotonic() - started < 4.0
