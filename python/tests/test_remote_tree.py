"""The mesh's sweeps (supervisor.remote Mesh: counts, leftover, sweep, run_on) down the tree of relay
sessions (supervisor.tree) past ``tree_above`` nodes give what the flat path (one ssh per node) gives: against
fake nodes whose process tables a small pgrep/pkill stand-in reads, with relays run in this process over pipes
in place of ssh; a relay that dies has its subtree asked flat, a node that answers nowhere counts -1 either
way."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO

import pytest

from ddp_cluster.supervisor import remote, tree

TAG = "/job/"
COMMAND = re.compile(r"^(pgrep|pkill) (-c|-a|-TERM|-KILL) -f -- '([^']*)'")


@dataclass
class Node:
    """A node's processes (command lines); ``stubborn`` ones outlive a TERM."""

    procs: list[str] = field(default_factory=list)
    stubborn: set[str] = field(default_factory=set)
    ran: list[str] = field(default_factory=list)  # the commands run here


class Cluster:
    """Fake nodes: a shell that knows the sweeps' pgrep/pkill lines; ``silent`` nodes answer nowhere (no ssh,
    no relay), ``dead`` nodes' relays vanish after their first line (flat ssh still reaches them)."""

    def __init__(self, names: Sequence[str], dead: Sequence[str] = (), silent: Sequence[str] = ()) -> None:
        self.nodes: dict[str, Node] = {}
        for index, name in enumerate(names):
            node = Node([f"python {TAG}train.py --rank {index}.{k}" for k in range(index % 4)])
            node.procs.append("sshd: unrelated")
            if index % 7 == 3 and len(node.procs) > 1:
                node.stubborn.add(node.procs[0])
            self.nodes[name] = node
        self.dead, self.silent = set(dead), set(silent)
        self.lock = threading.Lock()
        self.spawned: list[str] = []

    def shell(self, name: str, command: str) -> str:
        found = COMMAND.match(command)
        assert found, command
        _, flag, pattern = found.groups()
        with self.lock:
            node = self.nodes[name]
            node.ran.append(command)
            hits = [proc for proc in node.procs if re.search(pattern, proc)]
            if flag == "-c":
                return f"{len(hits)}\n"
            if flag == "-a":
                return "".join(f"{100 + node.procs.index(proc)} {proc}\n" for proc in hits)
            gone = [proc for proc in hits if flag == "-KILL" or proc not in node.stubborn]
            node.procs = [proc for proc in node.procs if proc not in gone]
            return "left\n" if hits and flag == "-TERM" else ""

    def spawn(self) -> tree.Spawn:
        def spawn(child: str, subtree: Sequence[str]) -> tree.Session:
            if child in self.silent:
                raise OSError(f"ssh: connect to host {child}: No route to host")
            with self.lock:
                self.spawned.append(child)
            down_r, down_w = os.pipe()
            up_r, up_w = os.pipe()
            source, sink = os.fdopen(down_r, "r"), os.fdopen(up_w, "w")
            threading.Thread(target=self.relay, args=(list(subtree), source, sink), daemon=True).start()
            return Piped(os.fdopen(down_w, "w"), os.fdopen(up_r, "r"))

        return spawn

    def relay(self, subtree: list[str], source: IO[str], sink: IO[str]) -> None:
        me = subtree[0]
        if me in self.dead:
            source.readline()
            sink.close()
            source.close()
            return
        tree.serve(subtree, source, sink, self.spawn(), lambda command, _: (0, self.shell(me, command)))


@dataclass
class Piped:
    stdin: IO[str] | None
    stdout: IO[str] | None


class FakeMesh(remote.Mesh):
    """A Mesh whose ssh (and this node's shell) is the fake cluster's; counts the flat ssh sessions."""

    def __init__(self, me: str, cluster: Cluster, tree_above: int | None = None) -> None:
        super().__init__(me, tree_above=tree_above, spawn=cluster.spawn())
        self.cluster = cluster
        self.flat: list[str] = []

    def run(self, node: str, command: str) -> str:
        if node != self.me:
            self.flat.append(node)
        return "" if node in self.cluster.silent else self.cluster.shell(node, command)


def names(count: int) -> list[str]:
    return [f"n{index}" for index in range(count)]


def everything(mesh: remote.Mesh, nodes: list[str]) -> dict[str, object]:
    """What the sweeps say, and what the nodes hold after a stop."""
    assert isinstance(mesh, FakeMesh)
    with ThreadPoolExecutor(max_workers=8) as pool:
        said: dict[str, object] = {
            "counts": mesh.counts(nodes, TAG, pool),
            "leftover": mesh.leftover(nodes, TAG, pool),
            "some": mesh.counts(nodes[::3], TAG, pool),
        }
        mesh.sweep(nodes, TAG, pool, grace=0)
        said["after"] = mesh.counts(nodes, TAG, pool)
    said["procs"] = {name: node.procs for name, node in mesh.cluster.nodes.items()}
    # Which nodes ran a KILL (the nodes where something was left after the TERM, only those).
    said["killed"] = sorted(
        name for name, node in mesh.cluster.nodes.items() if any("-KILL" in line for line in node.ran)
    )
    return said


def pair(count: int, **kwargs: Sequence[str]) -> tuple[list[str], FakeMesh, FakeMesh]:
    nodes = names(count)
    me = nodes[count // 2]  # this node need not be the job's first
    flat = FakeMesh(me, Cluster(nodes, **kwargs), tree_above=10**9)
    down = FakeMesh(me, Cluster(nodes, **kwargs), tree_above=0)
    return nodes, flat, down


@pytest.mark.parametrize("count", [1, 5, 100])
def test_the_tree_answers_as_the_flat_path_does(count: int) -> None:
    nodes, flat, down = pair(count)
    try:
        expected, got = everything(flat, nodes), everything(down, nodes)
    finally:
        down.close()
    assert got == expected
    assert expected["after"] == dict.fromkeys(nodes, 0)
    # The KILL pass ran on the nodes where the TERM found something, and only there.
    assert expected["killed"] == sorted(node for index, node in enumerate(nodes) if index % 4)
    assert down.flat == [] and len(flat.flat) >= 5 * (count - 1)  # the tree's: no ssh per node from here
    assert sorted(down.cluster.spawned) == sorted(node for node in nodes if node != down.me)


def test_a_dead_relays_subtree_and_a_silent_node_are_answered_as_flat() -> None:
    nodes = names(100)
    groups = tree.split([node for node in nodes if node != "n50"])  # the subtrees under this node, n50
    dead, silent, deep = groups[1][0], groups[20][0], groups[5][1]  # a child, a child, a grandchild
    assert len(groups[5]) == 3 and tree.split(groups[5][1:]) == [[deep], [groups[5][2]]]
    nodes, flat, down = pair(100, dead=[dead], silent=[silent, deep])
    assert down.me == "n50"
    try:
        expected, got = everything(flat, nodes), everything(down, nodes)
    finally:
        down.close()
    assert got == expected
    assert expected["counts"][silent] == expected["counts"][deep] == -1  # type: ignore[index]
    broken = {*groups[1], *groups[20], deep}
    assert set(down.flat) == broken  # only these went flat, each sweep
    left = {node for index, node in enumerate(nodes) if index % 4 and node not in (silent, deep)}
    # counts, leftover, TERM, the counts after: every node; then nodes[::3]; the KILL: where TERM found some.
    assert len(down.flat) == 4 * len(broken) + len(broken & set(nodes[::3])) + len(broken & left)


def test_small_lists_stay_flat_and_the_tree_is_made_once() -> None:
    cluster = Cluster(names(100))
    mesh = FakeMesh("n0", cluster)  # the default threshold
    assert mesh.tree_above == remote.TREE_ABOVE == 64
    with ThreadPoolExecutor(max_workers=8) as pool:
        small = names(40)
        assert mesh.counts(small, TAG, pool) == {node: index % 4 for index, node in enumerate(small)}
        assert cluster.spawned == [] and mesh.tree is None and len(mesh.flat) == 39
        mesh.counts(names(64), TAG, pool)
        assert cluster.spawned == [] and mesh.tree is None
        big = names(100)
        for _ in range(3):
            assert mesh.counts(big, TAG, pool) == {node: index % 4 for index, node in enumerate(big)}
        assert sorted(cluster.spawned) == sorted(big[1:])  # one session per node, opened once
        assert mesh.tree is not None and len(mesh.flat) == 39 + 63
    mesh.close()
    assert mesh.tree is None
