"""Which nodes of a job stopped answering, at a cost on the first node that does not grow with the node count.

The job's nodes form a tree (node 0 the root, node i's children ``i*fanout+1`` .. ``i*fanout+fanout``). Each
node watches only its children, each over one persistent ssh session that runs this module on the child, which
watches its own children the same way and prints to its parent: ``up`` every interval, and ``down NODE`` when
it finds a node of its subtree gone. So the first node holds ``fanout`` sessions and reads ``fanout`` lines
per interval, whatever the job's size; a dead node is named by its parent, and the name travels up one line
per level.

A session is judged with ssh's own words (:func:`probe_verdict`): its end with "server not responding"
(keepalives unanswered), or a reconnection refused, without a route, or without any TCP answer, is a miss; two
misses in a row and the child is lost. A reconnection that reached the child's sshd but did not finish (a busy
node: banner exchange, connection closed) is "slow": it neither counts nor clears a miss, so a live but loaded
node is never declared dead. A child whose watcher ended otherwise is reconnected to.

    python -m ddp_cluster.supervisor.liveness --nodes N0,N1,... --index I [--fanout 4] [--every 3]
    [--ssh-timeout 3]

runs node I's watcher (started over ssh by its parent; it ends when its parent's session closes). Standard
library only.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

FANOUT = 4
MISSES = 2
# ssh's words when the node's TCP stack answered but its sshd did not finish the login in time (MaxStartups,
# load): the node is alive, only slow, e.g. while its ranks import torch on a loaded machine.
SSH_SLOW = re.compile(r"banner exchange|kex_exchange_identification|Connection closed by|Connection reset by")
# An established session whose keepalives went unanswered (ServerAliveInterval x ServerAliveCountMax). ssh
# says so, and what went wrong in a login, at LogLevel INFO: the sessions ask for it (the mesh's ssh_config
# keeps interactive use at ERROR).
SSH_SILENT = re.compile(r"Timeout, server .* not responding")


def probe_verdict(returncode: int | None, stderr: str) -> str:
    """An ssh attempt's outcome: 'up' (logged in), 'slow' (the node's TCP stack answered but sshd did not
    finish in time, or ssh ran past its bound after connecting: alive), 'down' (refused, no route, a name that
    no longer resolves, no TCP answer at all: the container or the server is gone)."""
    if returncode == 0:
        return "up"
    if returncode is None or SSH_SLOW.search(stderr):
        return "slow"
    return "down"


def children(index: int, count: int, fanout: int = FANOUT) -> list[int]:
    """The children of node ``index`` in the job's tree of ``count`` nodes."""
    first = index * fanout + 1
    return list(range(first, min(first + fanout, count)))


def depth(count: int, fanout: int = FANOUT) -> int:
    """Levels below the root: how many hops a dead node's name travels at most."""
    levels, index = 0, count - 1
    while index > 0:
        index = (index - 1) // fanout
        levels += 1
    return levels


def ssh_argv(node: str, remote: Sequence[str], every: float, ssh_timeout: int) -> list[str]:
    """One session to ``node`` running ``remote``: keepalives every ``every`` s, three unanswered end it."""
    return [
        "ssh",
        "-T",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={ssh_timeout}",
        "-o",
        f"ServerAliveInterval={max(1, round(every))}",
        "-o",
        "ServerAliveCountMax=3",
        "-o",
        "LogLevel=INFO",
        node,
        " ".join(remote),
    ]


Spawn = Callable[[str, list[str]], "subprocess.Popen[str]"]


def _spawn(node: str, argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    )


class Watch:
    """Node ``index``'s watch of its children (and through them, of its whole subtree).

    ``report`` receives each node found lost (the remote watcher prints it to its parent). ``spawn`` starts a
    session (tests give a stand-in for ssh)."""

    def __init__(
        self,
        nodes: Sequence[str],
        index: int = 0,
        fanout: int = FANOUT,
        every: float = 3.0,
        ssh_timeout: int = 3,
        report: Callable[[str], None] | None = None,
        spawn: Spawn = _spawn,
        misses: int = MISSES,
    ) -> None:
        self.nodes = list(nodes)
        self.index = index
        self.fanout = fanout
        self.every = every
        self.ssh_timeout = ssh_timeout
        self.report = report or (lambda node: None)
        self.spawn = spawn
        self.misses_allowed = misses
        self._lost: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sessions: dict[str, subprocess.Popen[str]] = {}
        self._threads: list[threading.Thread] = []

    def remote(self, child: int) -> list[str]:
        return [
            "python",
            "-m",
            "ddp_cluster.supervisor.liveness",
            "--nodes",
            ",".join(self.nodes),
            "--index",
            str(child),
            "--fanout",
            str(self.fanout),
            "--every",
            f"{self.every:g}",
            "--ssh-timeout",
            str(self.ssh_timeout),
        ]

    def start(self) -> Watch:
        for child in children(self.index, len(self.nodes), self.fanout):
            self._start_thread(child)
        return self

    def lost(self) -> list[str]:
        with self._lock:
            return list(self._lost)

    def stop(self, within: float = 5.0) -> None:
        """End every session at once (each remote watcher sees its input end and ends its own), within
        ``within`` seconds in all."""
        self._stop.set()
        with self._lock:
            sessions = list(self._sessions.values())
            threads = list(self._threads)
        for session in sessions:
            _close_input(session)
        deadline = time.monotonic() + within
        for session in sessions:
            try:
                session.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                session.kill()
        for thread in threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))

    def _mark(self, node: str) -> None:
        with self._lock:
            if node in self._lost:
                return
            self._lost.append(node)
        self.report(node)

    def _start_thread(self, child: int) -> None:
        thread = threading.Thread(target=self._watch, args=(child,), daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _adopt(self, child: int) -> None:
        """The watcher does not start on ``child`` (a node on another image, no python): watch its children
        from here, so that its subtree is still watched; the node itself is still watched over ssh."""
        node = self.nodes[child]
        orphans = children(child, len(self.nodes), self.fanout)
        adopted = ", ".join(self.nodes[index] for index in orphans) or "nothing more"
        print(
            f"liveness: the watcher does not start on {node}; {self.nodes[self.index]} watches {adopted}",
            file=sys.stderr,
            flush=True,
        )
        for orphan in orphans:
            self._start_thread(orphan)

    def _watch(self, child: int) -> None:
        node = self.nodes[child]
        argv = ssh_argv(node, self.remote(child), self.every, self.ssh_timeout)
        misses = broken = 0
        while not self._stop.is_set() and node not in self.lost():
            session = self.spawn(node, argv)
            with self._lock:
                self._sessions[f"{node}#{child}"] = session
            if self._stop.is_set():
                _end(session)
                return
            heard = self._read(session)
            stderr = _end(session)
            if self._stop.is_set():
                return
            if heard:
                misses = 0  # its watcher ran: the node was up until this session ended
            if SSH_SILENT.search(stderr):
                misses += 1  # keepalives unanswered
            elif session.returncode == 255:  # ssh itself failed: judge its words
                misses += probe_verdict(255, stderr) == "down"
            else:
                misses = 0  # logged in: the node is up
                broken = 0 if heard or session.returncode == 0 else broken + 1
                if broken == 2:  # twice without a word: the watcher cannot run there
                    self._adopt(child)
            if misses >= self.misses_allowed:
                self._mark(node)
                return
            self._stop.wait(min(self.every, 1.0) if misses else self.every)

    def _read(self, session: subprocess.Popen[str]) -> bool:
        """Follow a child's lines until its session ends; True if it said ``up`` at least once."""
        heard = False
        assert session.stdout is not None
        for line in session.stdout:
            word, _, rest = line.strip().partition(" ")
            if word == "up":
                heard = True
            elif word == "down" and rest:
                self._mark(rest)
            if self._stop.is_set():
                break
        return heard


def _close_input(session: subprocess.Popen[str]) -> None:
    try:
        if session.stdin:
            session.stdin.close()
    except OSError:
        pass


def _end(session: subprocess.Popen[str]) -> str:
    """Close a session (its remote watcher sees its input end) and return what ssh said on stderr."""
    if session.poll() is None:
        _close_input(session)
        try:
            session.wait(timeout=5)
        except subprocess.TimeoutExpired:
            session.kill()
            session.wait()
    try:
        return session.stderr.read() if session.stderr else ""
    except (OSError, ValueError):
        return ""


def serve(watch: Watch, every: float, out: IO[str], parent_gone: threading.Event) -> None:
    """A remote watcher's loop: ``up`` every ``every`` s to the parent until its session ends."""
    watch.start()
    try:
        while not parent_gone.wait(every):
            out.write("up\n")
            out.flush()
    except (BrokenPipeError, OSError):
        pass
    finally:
        watch.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ddp_cluster.supervisor.liveness", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--nodes", required=True, help="the job's nodes, comma-separated, the first node first"
    )
    parser.add_argument("--index", type=int, required=True, help="this node's place in --nodes")
    parser.add_argument("--fanout", type=int, default=FANOUT)
    parser.add_argument("--every", type=float, default=3.0, help="seconds between heartbeats and keepalives")
    parser.add_argument("--ssh-timeout", type=int, default=3)
    args = parser.parse_args(argv)
    nodes = [node for node in args.nodes.split(",") if node]
    if not 0 <= args.index < len(nodes) or args.fanout < 1 or args.every <= 0:
        parser.error("--index must be a place in --nodes, --fanout at least 1, --every above 0")
    lock = threading.Lock()

    def tell_parent(node: str) -> None:
        with lock:
            try:
                sys.stdout.write(f"down {node}\n")
                sys.stdout.flush()
            except (BrokenPipeError, OSError):
                pass

    watch = Watch(nodes, args.index, args.fanout, args.every, args.ssh_timeout, report=tell_parent)
    parent_gone = threading.Event()

    def follow_parent() -> None:
        for _ in sys.stdin:
            pass
        parent_gone.set()

    threading.Thread(target=follow_parent, daemon=True).start()
    sys.stdout.write("up\n")
    sys.stdout.flush()
    serve(watch, args.every, sys.stdout, parent_gone)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
