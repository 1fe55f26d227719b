"""The job's nodes as the supervisor reaches them: this node by a shell, the others over the mesh's ssh.

One :class:`Mesh` per supervisor: a command on a node (:meth:`Mesh.run`), a probe of its liveness, the job's
files handed out to many nodes at once, and the one way the job's processes are stopped on its nodes
(:meth:`Mesh.sweep`: one TERM sweep of every node, one grace for all, a KILL sweep where something was left).
The ssh sessions are the mesh's (host keys pinned, the cluster's port and key from the node's ssh config),
``POOL`` of them in flight at a time. Commands share one TCP connection per node (the mesh's ssh config:
ControlMaster, ControlPersist), so that a sweep of every node costs a session each, not a handshake each; a
probe, which judges whether a node answers, opens its own (``ControlPath=none``). Past ``TREE_ABOVE`` nodes
the sweeps of every node (:meth:`Mesh.counts`, :meth:`Mesh.leftover`, :meth:`Mesh.sweep`, :meth:`Mesh.run_on`)
go down a tree of persistent relay sessions (supervisor.tree: this node holds at most RADIX of them, opened
once for the job) instead of one ssh session per node from this node; a node the tree could not answer is
asked over flat ssh, so the answers are the same either way. Tests put a stand-in in its place.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from ddp_cluster.job import node_jobs
from ddp_cluster.supervisor import tree
from ddp_cluster.supervisor.failures import Failure
from ddp_cluster.supervisor.fence import GONE_SIGNS
from ddp_cluster.supervisor.liveness import probe_verdict

# ssh's option that keeps a command off the mesh's shared connection: a verdict on a node needs its own login.
FRESH = ("-o", "ControlPath=none")
# ssh sessions the supervisor keeps in flight to the other nodes (hand-out, probes, stop sweeps), and the
# grace between the TERM and the KILL sweep of a stop.
POOL = 64
STOP_GRACE = 3.0
DISTRIBUTE_TIMEOUT = 300
COMMAND_TIMEOUT = 30
# Sweeps of more nodes than this go down the tree: the local clusters (2-40 nodes) keep one ssh per node (a
# session each on the shared connections); past it, POOL-wide rounds of sessions from one node add up.
TREE_ABOVE = 64
# Seconds a login that would prove a node gone may take to connect (proven_gone), and how long such logins
# are tried again: a server that died moments ago keeps its neighbour entry (its MAC) on the others for up to
# the kernel's reachable time (15-45 s), then 5 s of delay and 3 s of probes; until then a login to it times
# out (silence, no proof) rather than failing with 'No route to host'.
GONE_WAIT = 10
GONE_WITHIN = 60.0
GONE_STAGGER = 1.0
# The launcher's own processes (their /proc/PID/comm): a job's ranks (or torchrun agents) are their children.
LAUNCHER_COMMS = "mpirun|orterun|orted|prterun|prted"
# The PIDs of a job's ranks on a node (Mesh.term_ranks): the launcher's children whose environment holds
# DDP_JOB_ID=ID (every rank gets it: JobSpec.variables), whatever their command line; not the ssh sessions
# mpirun starts its daemons over (its children too, with its environment).
RANKS_OF = (
    "for e in $(grep -lzxF -- {job} /proc/[0-9]*/environ 2>/dev/null); do p=${{e#/proc/}}; p=${{p%/environ}};"
    ' case "$(cat /proc/$p/comm 2>/dev/null)" in ssh|{launcher}) continue;; esac;'
    " pp=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f2);"
    ' case "$(cat /proc/$pp/comm 2>/dev/null)" in {launcher}) echo "$p";; esac; done'
)


def pattern(tag: str) -> str:
    """pgrep's pattern of a job's processes, whose command lines hold ``tag`` (JOB/) itself: every regular
    expression character escaped (job a.1's never matches job a-1's), '[/]workspace/...' so that it
    matches them but not the pkill or pgrep command line itself (node_jobs.literal_pattern)."""
    return node_jobs.literal_pattern(tag)


class Mesh:
    """Commands on the job's nodes: ``me`` (this node) runs them in a shell, the others over ssh."""

    tree_above = TREE_ABOVE

    def __init__(
        self,
        me: str,
        ssh_timeout: int = 3,
        tree_above: int | None = None,
        spawn: tree.Spawn | None = None,
    ) -> None:
        self.me = me
        self.ssh_timeout = ssh_timeout
        if tree_above is not None:
            self.tree_above = tree_above
        # How a relay is started on a child node (tests: in this process); the tree itself once, at the first
        # sweep past tree_above, over that sweep's nodes, kept for the job's life.
        self.spawn = spawn or tree.ssh_spawn(ssh_timeout, node_jobs.NODE_ENV)
        self.tree: tree.Tree | None = None
        self.tree_lock = threading.Lock()

    def ssh(self, node: str, *options: str, connect: int | None = None) -> list[str]:
        """ssh's argv to ``node``: its connect bound ``connect`` seconds (default: the mesh's ssh_timeout)."""
        bound = self.ssh_timeout if connect is None else connect
        return ["ssh", "-o", f"ConnectTimeout={bound}", "-o", "BatchMode=yes", *options, node]

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

    def proven_gone(self, node: str) -> bool:
        """Whether ``node`` is proven gone, not merely silent: a fresh login says its name no longer resolves
        or its address does not route (supervisor.fence.GONE_SIGNS); never on a timeout."""
        if node == self.me:
            return False
        # Logins GONE_STAGGER seconds apart, each bound long enough for the address's neighbour lookup to fail
        # (about 3 s), until one is conclusive or GONE_WITHIN (see there): a login begun while the dead node's
        # neighbour entry is still held only times out, the first begun after it lapsed fails at once, so
        # the proof comes about 3 s after the entry lapses rather than after a whole login's bound.
        argv = [*self.ssh(node, *FRESH, "-o", "LogLevel=INFO", connect=GONE_WAIT), "true"]
        deadline = time.monotonic() + GONE_WITHIN
        running: list[tuple[subprocess.Popen[str], float]] = []
        next_start = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if now >= next_start and now + GONE_WAIT <= deadline:
                    try:
                        login = subprocess.Popen(
                            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
                        )
                    except OSError:
                        return False
                    running.append((login, now + GONE_WAIT + 5))
                    next_start = now + GONE_STAGGER
                for login, bound in list(running):
                    if login.poll() is None and time.monotonic() < bound:
                        continue
                    running.remove((login, bound))
                    if login.poll() is None:  # past its own bound: silence
                        login.kill()
                        login.wait()
                        continue
                    said = login.stderr.read() if login.stderr else ""
                    if any(sign in said for sign in GONE_SIGNS):
                        return login.returncode != 0
                    if "timed out" not in said:
                        return False  # it answered (or refused the login): not gone
                if not running and time.monotonic() + GONE_WAIT > deadline:
                    return False
                time.sleep(0.1)
        finally:
            for login, _ in running:
                with contextlib.suppress(OSError):
                    login.kill()
                    login.wait()

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

    def send(
        self, node: str, command: str, stdin: bytes | BinaryIO, timeout: float, options: Sequence[str] = ()
    ) -> str:
        """Run ``command`` on ``node`` with ``stdin`` as its input (bytes, or a file ssh reads itself, never
        held in memory); '' when it succeeded, else what went wrong ("no answer within N s" past the
        bound). ``options``: ssh's own (``FRESH``: a login of its own)."""
        feed: dict[str, Any] = {"input": stdin} if isinstance(stdin, bytes) else {"stdin": stdin}
        try:
            done = subprocess.run(
                [*self.ssh(node, *options), command],
                capture_output=True,
                timeout=timeout,
                check=False,
                **feed,
            )
        except subprocess.TimeoutExpired:
            return f"no answer within {timeout:.0f} s"
        except OSError as error:
            return f"ssh could not start: {error}"
        if done.returncode == 0:
            return ""
        said = (done.stderr or done.stdout).decode("utf-8", errors="replace").strip().splitlines()
        return (said[-1][:300] if said else "") or f"ssh exited with status {done.returncode}"

    def run_on(self, nodes: Sequence[str], command: str, pool: ThreadPoolExecutor) -> dict[str, str]:
        """Node -> ``command``'s output there ('' where the node did not answer), on every node of ``nodes``
        at once: ``pool``'s ssh sessions, or past ``tree_above`` nodes the tree's."""
        if len(nodes) > self.tree_above and (relays := self._tree(nodes)) is not None:
            return {node: out for node, (_, out) in relays.run_all(command, nodes).items()}
        return dict(zip(nodes, pool.map(lambda node: self.run(node, command), nodes), strict=True))

    def close(self) -> None:
        """End the tree's relays (once the commands under way answered); without it they end with this
        process, whose end closes their sessions."""
        with self.tree_lock:
            relays, self.tree = self.tree, None
        if relays is not None:
            relays.close()

    def _tree(self, nodes: Sequence[str]) -> tree.Tree | None:
        """The job's tree, made at its first sweep over that sweep's nodes (this node its root); None when
        no relay could be started (the sweep goes flat). A later sweep's nodes outside it are asked flat."""
        with self.tree_lock:
            if self.tree is None:
                order = [self.me, *(node for node in dict.fromkeys(nodes) if node != self.me)]
                relays = tree.Tree(
                    order,
                    self.spawn,
                    lambda node, command: (0, self.run(node, command)),
                    lambda command, timeout: (0, self.run(self.me, command)),
                    timeout=COMMAND_TIMEOUT,
                )
                if relays.relay.children and all(child.broken for child in relays.relay.children):
                    return None
                self.tree = relays
            return self.tree

    def sweep(
        self,
        nodes: Sequence[str],
        tag: str,
        pool: ThreadPoolExecutor,
        grace: float = STOP_GRACE,
        guard: str = "",
    ) -> None:
        """Stop the processes whose command lines hold ``tag`` on ``nodes``: one TERM sweep of every node, one
        grace for all, then a KILL sweep of the nodes where something was left. The grace is paid once (not
        once per node, pool threads at a time), and not at all when nothing was left. ``guard``: a shell
        prefix (:func:`ddp_cluster.supervisor.fence.guard`) the other nodes run first: a node where a newer
        supervisor holds the job keeps its processes."""
        term = f"pkill -TERM -f -- {shlex.quote(pattern(tag))} && echo left; true"
        kill = f"pkill -KILL -f -- {shlex.quote(pattern(tag))}; true"
        if guard and self.me in nodes:  # this node is the sender's own: no guard
            found = self.run_on([self.me], term, pool)
            found.update(
                self.run_on([node for node in nodes if node != self.me], f"{guard}{{ {term}; }}", pool)
            )
        else:
            found = self.run_on(nodes, f"{guard}{{ {term}; }}" if guard else term, pool)
        left = [node for node, out in found.items() if "left" in out]
        if left:
            time.sleep(grace)
            self.run_on(left, kill, pool)

    def term_ranks(
        self, nodes: Sequence[str], job: str, pool: ThreadPoolExecutor, grace: float, guard: str = ""
    ) -> list[str]:
        """A stop's SIGTERM straight to job ``job``'s ranks (or torchrun agents) on ``nodes``, all at once:
        the processes whose parent is the launcher (mpirun, its daemons) and whose environment holds the
        job's DDP_JOB_ID; then up to ``grace`` seconds for them to end (a script's own handler saves within
        it). The nodes where some are left after it (the caller's stop ends them)."""
        ranks = RANKS_OF.format(job=shlex.quote(f"DDP_JOB_ID={job}"), launcher=LAUNCHER_COMMS)
        term = f'{ranks} | while read -r p; do kill -TERM "$p" 2>/dev/null; done; true'
        others = [node for node in nodes if node != self.me]
        if self.me in nodes:
            self.run_on([self.me], term, pool)
        if others:
            self.run_on(others, f"{guard}{{ {term}; }}" if guard else term, pool)
        left = list(nodes)
        deadline = time.monotonic() + grace
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            said = self.run_on(left, f"{ranks} | head -n 1", pool)
            left = [node for node in left if said.get(node, "").strip()]
        return left

    def leftover(self, nodes: Sequence[str], tag: str, pool: ThreadPoolExecutor) -> dict[str, str]:
        """Node -> the processes whose command lines hold ``tag`` there (the nodes with none left out)."""
        found = self.run_on(nodes, f"pgrep -a -f -- {shlex.quote(pattern(tag))} || true", pool)
        return {node: out.strip() for node, out in found.items() if out and out.strip()}

    def counts(self, nodes: Sequence[str], tag: str, pool: ThreadPoolExecutor) -> dict[str, int]:
        """Node -> how many processes hold ``tag`` there (-1: the node did not say)."""
        found = self.run_on(nodes, f"pgrep -c -f -- {shlex.quote(pattern(tag))} || true", pool)
        return {node: int(text.strip()) if text.strip().isdigit() else -1 for node, text in found.items()}

    def jobs_on(self, node: str, jobs_dir: str) -> list[str] | None:
        """The jobs that run on ``node`` (its ddp_cluster.supervisor.jobs says); None when it did not say."""
        report = node_jobs.parse(self.run(node, node_jobs.command(jobs_dir)))
        return None if report is None else list(report.get("busy", []))
