"""The supervisor's tree of sessions (supervisor.tree), with relays run in this process over pipes in place of
ssh: every node answers, no node holds more than RADIX sessions, and a subtree whose session broke is run over
the flat fallback, named."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from ddp_cluster.supervisor import tree


@dataclass
class Piped:
    """A relay's session in this process: the parent writes ``stdin``, reads ``stdout``."""

    stdin: IO[str] | None
    stdout: IO[str] | None


class Fleet:
    """Relays on pipes; ``dead`` nodes read their first line and then vanish (their session ends)."""

    def __init__(
        self, dead: Sequence[str] = (), unreachable: Sequence[str] = (), mute: Sequence[str] = ()
    ) -> None:
        self.dead = set(dead)
        self.unreachable = set(unreachable)
        self.mute = set(mute)  # relays that take every line and answer none
        self.sessions: dict[str, int] = {}  # node -> sessions it opened
        self.ran: list[str] = []  # the nodes that ran a command
        self.lock = threading.Lock()

    def local(self, node: str) -> tree.RunLocal:
        def run(command: str, timeout: float) -> tuple[int, str]:
            with self.lock:
                self.ran.append(node)
            return 0, f"{node}: {command}\n"

        return run

    def spawn(self, parent: str) -> tree.Spawn:
        def spawn(child: str, subtree: Sequence[str]) -> tree.Session:
            if child in self.unreachable:
                raise OSError(f"ssh: connect to host {child}: No route to host")
            with self.lock:
                self.sessions[parent] = self.sessions.get(parent, 0) + 1
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
        if me in self.mute:
            for line in source:
                if line.startswith("end"):
                    break
            sink.close()
            return
        tree.serve(subtree, source, sink, self.spawn(me), self.local(me))


def flat(node: str, command: str) -> tuple[int, str]:
    return 0, f"{node} (flat): {command}\n"


def make(count: int, fleet: Fleet) -> tuple[list[str], tree.Tree]:
    nodes = [f"n{index}" for index in range(count)]
    return nodes, tree.Tree(nodes, fleet.spawn("n0"), flat, fleet.local("n0"), timeout=20)


@pytest.mark.parametrize("count", [1, 33, 1200])
def test_every_node_answers_and_none_holds_more_than_radix_sessions(count: int) -> None:
    fleet = Fleet()
    nodes, root = make(count, fleet)
    try:
        for command in ("pgrep -c x", "true"):
            answers = root.run_all(command)
            assert answers == {node: (0, f"{node}: {command}\n") for node in nodes}
    finally:
        root.close()
    assert max(fleet.sessions.values(), default=0) <= tree.RADIX
    assert sum(fleet.sessions.values()) == count - 1  # one session per node but the first, opened once
    assert fleet.sessions.get("n0", 0) == min(count - 1, tree.RADIX)


def test_1152_nodes_are_three_levels_deep_at_radix_32() -> None:
    # 1 + 32 + 32 * 32 = 1057 < 1152: a few nodes one level further.
    assert tree.depth(33) == 1 and tree.depth(1057) == 2 and tree.depth(1152) == 3
    groups = tree.split([str(index) for index in range(1151)])
    assert len(groups) == 32 and {len(group) for group in groups} == {35, 36}


def test_a_child_that_dies_has_its_subtree_run_over_flat_ssh() -> None:
    fleet = Fleet(dead=["n1"])
    nodes, root = make(100, fleet)
    try:
        answers = root.run_all("hostname")
    finally:
        root.close()
    subtree = tree.split(nodes[1:])[0]  # n1 and the nodes under it
    assert subtree[0] == "n1" and len(subtree) == 4
    assert {node for node, (_, out) in answers.items() if "(flat)" in out} == set(subtree)
    assert all(answers[node] == (0, f"{node}: hostname\n") for node in nodes if node not in subtree)


def test_a_child_that_cannot_be_reached_is_answered_for_at_once() -> None:
    fleet = Fleet(unreachable=["n5"])
    nodes, root = make(40, fleet)
    try:
        answers = root.run_all("true")
    finally:
        root.close()
    subtree = next(group for group in tree.split(nodes[1:]) if group[0] == "n5")
    assert subtree == ["n5", "n6"]
    assert {node for node, (_, out) in answers.items() if "(flat)" in out} == set(subtree)
    assert all(answers[node] == (0, f"{node}: true\n") for node in nodes if node not in subtree)


def test_a_relays_lines_carry_any_output() -> None:
    text = "two\nlines with spaces and ünïcode\n"
    assert tree.decode(tree.encode(text)) == text and tree.decode(tree.encode("")) == ""
    assert " " not in tree.encode(text) and "\n" not in tree.encode(text)


def test_the_relay_runs_as_a_process_on_its_node() -> None:
    # What a parent starts over ssh: a relay of one node (no children) runs the command in its shell.
    import subprocess
    import sys

    lines = f"run 7 {tree.encode('echo hi; exit 3')}\nend\n"
    done = subprocess.run(
        [sys.executable, "-m", "ddp_cluster.supervisor.tree", "--relay", "n9"],
        input=lines,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stdout == f"done 7 n9 3 {tree.encode('hi' + chr(10))}\n"


def test_a_command_for_some_nodes_runs_on_those_only() -> None:
    fleet = Fleet()
    nodes, root = make(100, fleet)
    some = [*nodes[7::9], "n0"]
    try:
        answers = root.run_all("pkill -KILL x", some)
    finally:
        root.close()
    assert answers == {node: (0, f"{node}: pkill -KILL x\n") for node in some}
    assert sorted(fleet.ran) == sorted(some)


def test_a_subtree_that_does_not_answer_in_time_and_a_node_outside_the_tree_are_run_flat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tree, "SLACK", 0.5)
    fleet = Fleet(mute=["n1"])
    nodes = [f"n{index}" for index in range(40)]
    root = tree.Tree(nodes, fleet.spawn("n0"), flat, fleet.local("n0"), timeout=0.2)
    try:
        answers = root.run_all("true", [*nodes, "n99"])
    finally:
        root.close()
    subtree = tree.split(nodes[1:])[0]
    assert subtree[0] == "n1" and len(subtree) == 2
    assert {node for node, (_, out) in answers.items() if "(flat)" in out} == {*subtree, "n99"}
    assert all(answers[node] == (0, f"{node}: true\n") for node in nodes if node not in subtree)


def test_relays_started_over_ssh_source_the_node_env_and_pass_it_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An ssh stand-in that runs the remote command here: the relays are real processes, each child's started
    # by its parent's ssh_spawn with the options main() passes down (a tree two levels deep at radix 3).
    import sys

    ssh = tmp_path / "bin" / "ssh"
    ssh.parent.mkdir()
    log = tmp_path / "ssh.log"
    ssh.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\nwhile [ $# -gt 2 ]; do shift; done\nexec /bin/sh -c "$2"\n'
    )
    ssh.chmod(0o755)
    env = tmp_path / "env.sh"
    source = Path(tree.__file__).parents[2]
    env.write_text(
        f"export PATH={ssh.parent}:{Path(sys.executable).parent}:$PATH PYTHONPATH={source}\n"
        "export NODE_ENV_READ=yes\n"
    )
    nodes = [f"n{index}" for index in range(10)]
    monkeypatch.setenv("PATH", f"{ssh.parent}:{os.environ['PATH']}")
    root = tree.Tree(nodes, tree.ssh_spawn(7, str(env)), flat, tree.run_here, radix=3, timeout=20)
    try:
        answers = root.run_all("echo $NODE_ENV_READ")
        some = root.run_all("echo again", ["n0", "n9"])
    finally:
        root.close()
    assert answers == {"n0": (0, "\n"), **{node: (0, "yes\n") for node in nodes[1:]}}
    assert some == {"n0": (0, "again\n"), "n9": (0, "again\n")}
    lines = log.read_text().splitlines()
    assert len(lines) == len(nodes) - 1  # a session per node, once
    assert all(line.startswith("-T -o ConnectTimeout=7 -o BatchMode=yes n") for line in lines)
    relay = f". {env} && exec python -m ddp_cluster.supervisor.tree --connect-timeout 7 --env {env}"
    assert all(relay in line for line in lines)
