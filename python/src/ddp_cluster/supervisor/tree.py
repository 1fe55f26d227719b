"""Commands on every node of a job along a tree of persistent ssh sessions: the first node holds at most
``RADIX`` sessions, each to a relay (this module, ``--relay``) on a child node, which runs the command itself
and passes it on to its own children the same way; every node's answer comes back up the same sessions. A
sweep of 1152 nodes then costs the first node 32 sessions opened once for the job, not 1151 per sweep.

The lines, one per message (UTF-8; the command and its output in base64, so that a line is a line):

* down: ``run ID CMD [NODES]`` runs CMD (``/bin/sh -c``) on every node of the subtree, or only on those of
  NODES (their names, space-separated, in base64); ``end`` ends the relay.
* up: ``done ID NODE RC OUT``, one per node of the subtree (RC -1: the command ran past its bound).

A relay whose session to a child ended (the child, or the ssh between them, died) answers for every node of
that child's subtree at once with :data:`BROKEN` and its words, for the commands under way and for those
after: the root (:class:`Tree`) runs them over flat ssh (its ``fallback``), as it does for a node whose
answer did not come within the bound, so a broken subtree costs time, not answers. Whether a node is alive
is not this module's call: the liveness watch (supervisor.liveness) keeps a login of its own per watched
node.

    python -m ddp_cluster.supervisor.tree [--env FILE] [--connect-timeout S] --relay NODE [NODE ...]

runs the relay of the first NODE (this node) for the subtree NODE... (started over ssh by its parent).
Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Protocol

# Sessions a node holds to its children: 1152 nodes are 1 + 32 + 1024 (+ the rest one level further).
RADIX = 32
COMMAND_TIMEOUT = 30
# RC of a node whose answer could not come back along the tree (a session on its way ended).
BROKEN = 255
# The words a relay sends with BROKEN (the root runs these nodes' commands over flat ssh).
BROKEN_WORDS = "the relay's session to "
# Seconds past a command's bound that its answers may take to come up the tree.
SLACK = 5.0
# Flat ssh sessions the root keeps in flight for the nodes the tree could not answer.
FALLBACK_POOL = 64


class Session(Protocol):
    """A running relay on a child: its input and output (an ssh session, or a stand-in in tests)."""

    stdin: IO[str] | None
    stdout: IO[str] | None


Spawn = Callable[[str, Sequence[str]], Session]  # (child, its subtree, child first) -> its relay's session
RunLocal = Callable[[str, float], tuple[int, str]]  # (command, bound) -> (rc, output)


def encode(text: str) -> str:
    return base64.b64encode(text.encode("utf-8", errors="replace")).decode("ascii") or "-"


def decode(word: str) -> str:
    return "" if word == "-" else base64.b64decode(word).decode("utf-8", errors="replace")


def split(nodes: Sequence[str], radix: int = RADIX) -> list[list[str]]:
    """``nodes`` (a node's descendants) in at most ``radix`` contiguous groups of near-equal size: each
    group's first node is a child, the others its subtree."""
    count = min(radix, len(nodes))
    if count == 0:
        return []
    size, extra = divmod(len(nodes), count)
    groups, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        groups.append(list(nodes[start:end]))
        start = end
    return groups


def depth(count: int, radix: int = RADIX) -> int:
    """Levels of sessions below the first node for ``count`` nodes."""
    if count <= 1:
        return 0
    return 1 + max(depth(len(group), radix) for group in split(range_names(count - 1), radix))


def range_names(count: int) -> list[str]:
    return [str(index) for index in range(count)]


def run_here(command: str, timeout: float) -> tuple[int, str]:
    """A command in this node's shell: its status and standard output (-1: past ``timeout``)."""
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", command], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return -1, ""
    return done.returncode, done.stdout


def ssh_spawn(connect_timeout: int = 3, env: str = "") -> Spawn:
    """Start a child's relay over the mesh's ssh (its shared connection: a session, not a login). ``env``: a
    shell file the node's commands source first (the node's python and package), passed on down the tree."""
    ssh = ("ssh", "-T", "-o", f"ConnectTimeout={connect_timeout}", "-o", "BatchMode=yes")
    options = ["--connect-timeout", str(connect_timeout), *(["--env", env] if env else [])]

    def spawn(child: str, subtree: Sequence[str]) -> Session:
        words = ("python", "-m", "ddp_cluster.supervisor.tree", *options, "--relay", *subtree)
        remote = " ".join(shlex.quote(word) for word in words)
        if env:
            remote = f". {shlex.quote(env)} && exec {remote}"
        return subprocess.Popen(
            [*ssh, child, remote],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )

    return spawn


@dataclass
class Child:
    node: str
    subtree: list[str]  # the child first
    session: Session | None = None
    broken: str = ""  # why its session ended ('' while it runs)
    pending: dict[str, set[str]] = field(default_factory=dict)  # command id -> nodes not yet answered


class Relay:
    """One node's part of the tree: runs each command here and passes it to its children; every answer of its
    subtree goes to ``up`` (a line)."""

    def __init__(
        self,
        subtree: Sequence[str],
        up: Callable[[str], None],
        spawn: Spawn,
        run_local: RunLocal = run_here,
        radix: int = RADIX,
        timeout: float = COMMAND_TIMEOUT,
    ) -> None:
        self.me = subtree[0]
        self.up = up
        self.run_local = run_local
        self.timeout = timeout
        self.lock = threading.Lock()
        self.running: list[threading.Thread] = []  # this node's commands under way
        self.children = [Child(group[0], group) for group in split(subtree[1:], radix)]
        for child in self.children:
            try:
                child.session = spawn(child.node, child.subtree)
            except OSError as error:
                child.broken = f"{BROKEN_WORDS}{child.node} could not start ({error})"
                continue
            threading.Thread(target=self._read, args=(child,), daemon=True).start()

    def run(self, ident: str, command: str, only: Collection[str] | None = None) -> None:
        """Run ``command`` on every node of the subtree, or on those of ``only`` (answers come through
        ``up``)."""
        for child in self.children:
            targets = child.subtree if only is None else [node for node in child.subtree if node in only]
            if not targets:
                continue
            line = f"run {ident} {encode(command)}"
            line += "\n" if only is None else f" {encode(' '.join(targets))}\n"
            with self.lock:
                if not child.broken:
                    child.pending[ident] = set(targets)
                    if self._send(child, line):
                        continue
                broken = child.broken
            self._answer_broken(ident, targets, broken)
        if only is not None and self.me not in only:
            return
        here = threading.Thread(target=self._run_here, args=(ident, command), daemon=True)
        here.start()
        with self.lock:
            self.running = [thread for thread in self.running if thread.is_alive()] + [here]

    def end(self, wait: bool = True) -> None:
        """End the children's relays once the commands under way answered (within the bound); at once without
        ``wait`` (the root: nobody reads an answer that did not come by its command's end)."""
        deadline = time.monotonic() + (self.timeout + SLACK if wait else 0.0)
        with self.lock:
            running = list(self.running)
        for thread in running:
            thread.join(max(0.0, deadline - time.monotonic()))
        while time.monotonic() < deadline:
            with self.lock:
                if not any(child.pending for child in self.children if not child.broken):
                    break
            time.sleep(0.05)
        for child in self.children:
            with self.lock:
                if not child.broken:
                    self._send(child, "end\n")

    def _run_here(self, ident: str, command: str) -> None:
        rc, out = self.run_local(command, self.timeout)
        self.up(f"done {ident} {self.me} {rc} {encode(out)}")

    def _send(self, child: Child, line: str) -> bool:
        """Under the lock: ``line`` to the child's relay; False (the child broken) when it cannot take it."""
        try:
            assert child.session is not None and child.session.stdin is not None
            child.session.stdin.write(line)
            child.session.stdin.flush()
        except (OSError, ValueError, AssertionError) as error:
            child.broken = f"{BROKEN_WORDS}{child.node} ended ({error or 'closed'})"
            return False
        return True

    def _read(self, child: Child) -> None:
        assert child.session is not None and child.session.stdout is not None
        for line in child.session.stdout:
            words = line.split()
            if len(words) == 5 and words[0] == "done":
                with self.lock:
                    waiting = child.pending.get(words[1])
                    if waiting is not None:
                        waiting.discard(words[2])
                        if not waiting:
                            del child.pending[words[1]]
                self.up(line.rstrip("\n"))
        with self.lock:
            child.broken = child.broken or f"{BROKEN_WORDS}{child.node} ended"
            pending, child.pending = child.pending, {}
        for ident, nodes in pending.items():
            self._answer_broken(ident, [node for node in child.subtree if node in nodes], child.broken)

    def _answer_broken(self, ident: str, nodes: Sequence[str], why: str) -> None:
        for node in nodes:
            self.up(f"done {ident} {node} {BROKEN} {encode(why)}")


class Tree:
    """The first node's end of the tree: :meth:`run_all` runs a command on every node and returns each
    node's (rc, output); the nodes whose answer could not come along the tree are run through ``fallback``
    (flat ssh)."""

    def __init__(
        self,
        nodes: Sequence[str],
        spawn: Spawn,
        fallback: Callable[[str, str], tuple[int, str]],
        run_local: RunLocal = run_here,
        radix: int = RADIX,
        timeout: float = COMMAND_TIMEOUT,
    ) -> None:
        self.nodes = list(nodes)
        self.fallback = fallback
        self.timeout = timeout
        self.lock = threading.Lock()
        self.index = set(self.nodes)
        # command id -> (answers so far, how many are awaited, set when all came)
        self.waiting: dict[str, tuple[dict[str, tuple[int, str]], int, threading.Event]] = {}
        self.count = 0
        self.relay = Relay(self.nodes, self._up, spawn, run_local, radix, timeout)

    def run_all(self, command: str, nodes: Sequence[str] | None = None) -> dict[str, tuple[int, str]]:
        """Node -> (rc, output) for every node of ``nodes`` (default: all of the tree's), the command run on
        those nodes only. A node whose answer could not come along the tree (a broken session on its way, no
        answer within the bound, not one of the tree's nodes) is run through ``fallback``, those all at once.
        """
        wanted = list(dict.fromkeys(self.nodes if nodes is None else nodes))
        only = None if nodes is None else {node for node in wanted if node in self.index}
        expected = len(self.nodes) if only is None else len(only)
        got: dict[str, tuple[int, str]] = {}
        if expected:
            with self.lock:
                self.count += 1
                ident = str(self.count)
                answers: dict[str, tuple[int, str]] = {}
                event = threading.Event()
                self.waiting[ident] = (answers, expected, event)
            self.relay.run(ident, command, only)
            event.wait(self.timeout + SLACK)
            with self.lock:
                del self.waiting[ident]
                got = dict(answers)
        again = [node for node in wanted if node not in got or self._broke(*got[node])]
        if again:
            with ThreadPoolExecutor(max_workers=min(FALLBACK_POOL, len(again))) as pool:
                flat = pool.map(lambda node: self.fallback(node, command), again)
                got.update(zip(again, flat, strict=True))
        return {node: got[node] for node in wanted}

    def close(self) -> None:
        """End the relays: each ends its children's once its own commands answered."""
        self.relay.end(wait=False)

    @staticmethod
    def _broke(rc: int, out: str) -> bool:
        return rc == BROKEN and out.startswith(BROKEN_WORDS)

    def _up(self, line: str) -> None:
        words = line.split()
        if len(words) != 5 or words[0] != "done":
            return
        with self.lock:
            found = self.waiting.get(words[1])
            if found is None:
                return
            answers, expected, event = found
            answers[words[2]] = (int(words[3]), decode(words[4]))
            if len(answers) >= expected:
                event.set()


def serve(subtree: Sequence[str], source: IO[str], sink: IO[str], spawn: Spawn, run_local: RunLocal) -> None:
    """A relay's loop: lines from its parent (``source``) until ``end`` or its end; answers to ``sink``."""
    lock = threading.Lock()

    def up(line: str) -> None:
        with lock:
            try:
                sink.write(line + "\n")
                sink.flush()
            except (OSError, ValueError):
                pass  # the parent is gone: this relay's end follows from its input's

    relay = Relay(subtree, up, spawn, run_local)
    for line in source:
        words = line.split()
        if words[:1] == ["end"]:
            break
        if len(words) in (3, 4) and words[0] == "run":
            relay.run(words[1], decode(words[2]), set(decode(words[3]).split()) if len(words) == 4 else None)
    relay.end()  # after the answers under way went up


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_cluster.supervisor.tree")
    parser.add_argument(
        "--relay", nargs="+", required=True, metavar="NODE", help="this node, then its subtree"
    )
    parser.add_argument("--env", default="", help="shell file a child's relay sources first")
    parser.add_argument("--connect-timeout", type=int, default=3, help="ssh's ConnectTimeout to a child")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    serve(args.relay, sys.stdin, sys.stdout, ssh_spawn(args.connect_timeout, args.env), run_here)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
