"""The job's nodes as the supervisor reaches them: this node by a shell, the others over the mesh's ssh.

One :class:`Mesh` per supervisor: a command on a node (:meth:`Mesh.run`), a probe of its liveness, the job's
files handed out to many nodes at once, and the one way the job's processes are stopped on its nodes
(:meth:`Mesh.sweep`: one TERM sweep of every node, one grace for all, a KILL sweep where something was left).
The ssh sessions are the mesh's (host keys pinned, the cluster's port and key from the node's ssh config),
``POOL`` of them in flight at a time. Commands share one TCP connection per node (the mesh's ssh config:
ControlMaster, ControlPersist), so that a sweep of every node costs a session each, not a handshake each; a
probe, which judges whether a node answers, opens its own (``ControlPath=none``). Tests put a stand-in in its
place.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from ddp_cluster.job import node_jobs
from ddp_cluster.supervisor.failures import Failure
from ddp_cluster.supervisor.liveness import probe_verdict

# ssh's option that keeps a command off the mesh's shared connection: a verdict on a node needs its own login.
FRESH = ("-o", "ControlPath=none")
# ssh sessions the supervisor keeps in flight to the other nodes (hand-out, probes, stop sweeps), and the
# grace between the TERM and the KILL sweep of a stop.
POOL = 64
STOP_GRACE = 3.0
DISTRIBUTE_TIMEOUT = 300
COMMAND_TIMEOUT = 30


def pattern(tag: str) -> str:
    """pgrep's pattern of a job's processes, whose command lines hold ``tag`` (JOB/): '[/]workspace/...'
    matches them but not the pkill or pgrep command line itself."""
    return f"[{tag[0]}]{tag[1:]}" if tag else tag


class Mesh:
    """Commands on the job's nodes: ``me`` (this node) runs them in a shell, the others over ssh."""

    def __init__(self, me: str, ssh_timeout: int = 3) -> None:
        self.me = me
        self.ssh_timeout = ssh_timeout

    def ssh(self, node: str, *options: str) -> list[str]:
        return ["ssh", "-o", f"ConnectTimeout={self.ssh_timeout}", "-o", "BatchMode=yes", *options, node]

    def run(self, node: str, command: str) -> str:
        """Run a shell command on a node; its output, '' when the node does not answer."""
        argv = ["/bin/sh", "-c", command] if node == self.me else [*self.ssh(node), command]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            return ""
        return done.stdout

    def probe(self, node: str) -> str:
        """'up', 'slow' or 'down' (see probe_verdict); only 'down' counts towards declaring a node dead."""
        if node == self.me:
            return "up"
        try:
            done = subprocess.run(
                [*self.ssh(node, *FRESH, "-o", "LogLevel=INFO"), "true"],
                capture_output=True,
                text=True,
                timeout=self.ssh_timeout + 5,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return probe_verdict(None, "")
        verdict = probe_verdict(done.returncode, done.stderr)
        if verdict == "down":
            self.drop(node)
        return verdict

    def drop(self, node: str) -> None:
        """End the shared connection to ``node`` (its ControlMaster), if there is one: a command on the
        connection to a node that went down waits for the master's keepalives (a minute) or COMMAND_TIMEOUT,
        where a fresh one is refused at once. Asks the local master only; never fails."""
        if node == self.me:
            return
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run([*self.ssh(node), "-O", "exit"], capture_output=True, timeout=5, check=False)

    def down_now(self, nodes: Sequence[str], pool: ThreadPoolExecutor) -> list[str]:
        """The nodes that do not answer at all now (asked once, when the launcher failed: was one lost?)."""
        verdicts = pool.map(self.probe, nodes)
        return [node for node, verdict in zip(nodes, verdicts, strict=True) if verdict == "down"]

    def give(
        self, nodes: Sequence[str], data: bytes, where: Path, pool: ThreadPoolExecutor
    ) -> Failure | None:
        """Unpack ``data`` (a tar.gz) into ``where`` on ``nodes``, all at once; the failure naming the first
        node that did not take it. ``where`` is made (or kept) mode 0700: it holds the job's secrets, and
        tar keeps each member's own mode (secrets.json's 0600)."""
        if not data or not nodes:
            return None
        folder = shlex.quote(str(where))
        command = f"umask 077 && mkdir -p {folder} && chmod 700 {folder} && tar -xzf - -C {folder}"

        def give(node: str) -> str:
            return self.send(node, command, data, DISTRIBUTE_TIMEOUT)

        for node, error in zip(nodes, pool.map(give, nodes), strict=True):
            if error:
                down = probe_verdict(None, "") if error.startswith("no answer") else self.probe(node)
                return Failure(
                    f"the job's files could not be copied to node {node} ({error[:300]})",
                    node=node,
                    lost=(node,) if down == "down" else (),
                )
        return None

    def send(self, node: str, command: str, stdin: bytes | BinaryIO, timeout: float) -> str:
        """Run ``command`` on ``node`` with ``stdin`` as its input (bytes, or a file ssh reads itself, never
        held in memory); '' when it succeeded, else what went wrong ("no answer within N s" past the
        bound)."""
        feed: dict[str, Any] = {"input": stdin} if isinstance(stdin, bytes) else {"stdin": stdin}
        try:
            done = subprocess.run(
                [*self.ssh(node), command], capture_output=True, timeout=timeout, check=False, **feed
            )
        except subprocess.TimeoutExpired:
            return f"no answer within {timeout:.0f} s"
        except OSError as error:
            return f"ssh could not start: {error}"
        if done.returncode == 0:
            return ""
        said = (done.stderr or done.stdout).decode("utf-8", errors="replace").strip().splitlines()
        return (said[-1][:300] if said else "") or f"ssh exited with status {done.returncode}"

    def sweep(
        self, nodes: Sequence[str], tag: str, pool: ThreadPoolExecutor, grace: float = STOP_GRACE
    ) -> None:
        """Stop the processes whose command lines hold ``tag`` on ``nodes``: one TERM sweep of every node, one
        grace for all, then a KILL sweep of the nodes where something was left. The grace is paid once (not
        once per node, pool threads at a time), and not at all when nothing was left."""
        term = f"pkill -TERM -f -- '{pattern(tag)}' && echo left; true"
        found = pool.map(lambda node: self.run(node, term), nodes)
        left = [node for node, out in zip(nodes, found, strict=True) if "left" in out]
        if left:
            time.sleep(grace)
            list(pool.map(lambda node: self.run(node, f"pkill -KILL -f -- '{pattern(tag)}'; true"), left))

    def leftover(self, nodes: Sequence[str], tag: str, pool: ThreadPoolExecutor) -> dict[str, str]:
        """Node -> the processes whose command lines hold ``tag`` there (the nodes with none left out)."""
        found = pool.map(lambda node: self.run(node, f"pgrep -a -f -- '{pattern(tag)}' || true"), nodes)
        return {node: out.strip() for node, out in zip(nodes, found, strict=True) if out and out.strip()}

    def counts(self, nodes: Sequence[str], tag: str, pool: ThreadPoolExecutor) -> dict[str, int]:
        """Node -> how many processes hold ``tag`` there (-1: the node did not say)."""
        found = pool.map(lambda node: self.run(node, f"pgrep -c -f -- '{pattern(tag)}' || true"), nodes)
        return {
            node: int(text.strip()) if text.strip().isdigit() else -1
            for node, text in zip(nodes, found, strict=True)
        }

    def jobs_on(self, node: str, jobs_dir: str) -> list[str] | None:
        """The jobs that run on ``node`` (its ddp_cluster.supervisor.jobs says); None when it did not say."""
        report = node_jobs.parse(self.run(node, node_jobs.command(jobs_dir)))
        return None if report is None else list(report.get("busy", []))
