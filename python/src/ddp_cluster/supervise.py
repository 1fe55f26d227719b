"""Job supervisor: runs the launcher on the first node, watches every node, stops every rank when one fails.

    python -m ddp_cluster.supervise --job-dir JOB      (reads JOB/job.json)

Everything comes from the job's spec (:class:`ddp_cluster.job.JobSpec`, written by train.yml): its nodes, the
launcher's command line and hostfile, whether mpirun's processes are ranks or torchrun agents, the time bound
and the poll. The command line is not the supervisor's own: every rank's command line holds ``JOB/`` (its
output dir or script), which is how ranks are found and stopped, and the supervisor's must not.

train.yml starts it detached inside the first node's container. It writes ``JOB/status.json`` (atomically)
as the job goes: ``running`` with the latest progress, then ``succeeded`` or ``failed`` with the reason, the
node, the rank, its exit code or signal and the last lines of that rank's log. A job fails when the launcher
exits non-zero, when a node stops answering ssh (its container or server died: the collectives would otherwise
wait for their own, much longer, timeout), when the time bound passes, or when the supervisor is told to stop.
Then every rank on every node that still answers is stopped, and what is left over is reported.

Its parts, each tested on its own: :class:`StatusFile`, :func:`launcher_failure` (what mpirun's or torchrun's
output says failed), :class:`ddp_cluster.liveness.Watch` (which nodes stopped answering, watched along a tree
whose cost on this node does not grow with the node count; a slow node is never declared dead),
and :class:`Supervisor`, which runs the launcher and stops everything.

No torch here: the supervisor runs beside the job, in the image's Python.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_cluster import job as jobspec
from ddp_cluster import status
from ddp_cluster.atomic import write_atomic
from ddp_cluster.job import JobSpec
from ddp_cluster.liveness import FANOUT, Watch, probe_verdict
from ddp_cluster.results import find_mpirun_log, mpirun_log
from ddp_cluster.status import Status

LAUNCHER_LOG = "launcher.log"
# The job's files, unpacked on every node before the launcher starts (see Supervisor.distribute).
BUNDLE = jobspec.BUNDLE_FILE
DISTRIBUTE_TIMEOUT = 300
STATUS_FILE = status.FILE
TAIL_LINES = 20
# mpirun, when a rank exits non-zero / dies of a signal; torchrun's "Root Cause" block.
MPI_EXIT = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]\s*\n\s*Exit code:\s*(-?\d+)")
MPI_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
TORCHRUN_ROOT = re.compile(r"host\s*:\s*(\S+)\s*\n\s*rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")


@dataclass
class Failure:
    reason: str
    node: str | None = None
    rank: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    lost: tuple[str, ...] = ()  # the nodes that stopped answering


def launcher_failure(text: str, spec: JobSpec, returncode: int) -> Failure:
    """What failed, from the launcher's output: torchrun's Root Cause block (node, rank, exit code or signal),
    mpirun's "exited on signal" line, or mpirun's first non-zero exit (its process is a rank, or with torchrun
    a node's agent, which names the node but not the rank); else only the launcher's own status."""
    if match := TORCHRUN_ROOT.search(text):
        code = int(match.group(3))
        failure = Failure("a rank exited with an error", node=match.group(1), rank=int(match.group(2)))
        if code < 0:
            failure.signal = -code
        else:
            failure.exit_code = code
        return failure
    if match := MPI_SIGNAL.search(text):
        rank = int(match.group(1))
        return Failure(
            "a rank was killed by a signal", node=match.group(2), rank=rank, signal=int(match.group(3))
        )
    if match := MPI_EXIT.search(text):
        process = int(match.group(1))
        failed_rank = None if spec.agents else process
        node = spec.node_of_process(process) or f"rank {process}"
        return Failure(
            "a rank exited with an error", node=node, rank=failed_rank, exit_code=int(match.group(2))
        )
    return Failure(f"the launcher exited with status {returncode}", exit_code=returncode)


class StatusFile:
    """The job's status.json (a :class:`ddp_cluster.status.Status`), rewritten whole (atomically) at every
    change; ``elapsed`` since ``started``."""

    def __init__(self, path: Path, started: float) -> None:
        self.path = path
        self.started = started
        self.status = Status()

    def write(self, **fields: Any) -> None:
        self.status = self.status.update(
            **fields, elapsed=round(time.time() - self.started, 1), updated=time.time()
        )
        write_atomic(self.path, self.status.dumps().encode())


def down_now(nodes: Sequence[str], probe: Callable[[str], str], pool: ThreadPoolExecutor) -> list[str]:
    """The nodes that do not answer at all now: asked once, when the launcher failed (was a node lost?)."""
    verdicts = pool.map(probe, nodes)
    return [node for node, verdict in zip(nodes, verdicts, strict=True) if verdict == "down"]


@dataclass
class Supervisor:
    spec: JobSpec
    job_dir: Path
    launcher: list[str]
    liveness_every: float = 3.0
    fanout: int = FANOUT
    ssh_timeout: int = 3
    tag: str = ""
    started: float = field(default_factory=time.time)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.tag = self.tag or str(self.job_dir).rstrip("/") + "/"
        self.me = socket.gethostname()
        self.nodes = list(self.spec.nodes)
        self.status = StatusFile(self.job_dir / STATUS_FILE, self.started)

    # --- logs and progress ------------------------------------------------------------------------------
    def rank_log(self, process: int) -> Path:
        """The output file of mpirun's process ``process`` (OpenMPI 4.x layout), on this node."""
        return find_mpirun_log(self.job_dir, process) or mpirun_log(self.job_dir, process)

    def rank_log_tail(self, process: int, node: str) -> list[str]:
        """Last lines of a process's log, which mpirun writes on the process's own node."""
        if node == self.me:
            return tail(self.rank_log(process))
        remote = mpirun_log(self.job_dir, process)
        return self.on_node(node, f"tail -n {TAIL_LINES} {remote} 2>/dev/null").splitlines()

    def progress(self) -> Any:
        metrics = self.job_dir / "output" / "metrics.jsonl"
        line = last_line(metrics) if metrics.exists() else last_line(self.rank_log(0))
        if line is None:
            return None
        try:
            return json.loads(line)
        except ValueError:
            return line[-300:]

    # --- watching ---------------------------------------------------------------------------------------
    def probe(self, node: str) -> str:
        """'up', 'slow' or 'down' (see probe_verdict); only 'down' counts towards declaring a node dead."""
        if node == self.me:
            return "up"
        probe = [
            "ssh",
            "-o",
            f"ConnectTimeout={self.ssh_timeout}",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=INFO",
        ]
        probe += [node, "true"]
        try:
            bound = self.ssh_timeout + 5
            done = subprocess.run(probe, capture_output=True, text=True, timeout=bound, check=False)
        except subprocess.TimeoutExpired:
            return probe_verdict(None, "")
        return probe_verdict(done.returncode, done.stderr)

    def tree(self) -> Watch:
        """The nodes watched along a tree (ddp_cluster.liveness): this node holds ``fanout`` ssh sessions,
        however many nodes the job has."""
        order = [self.me, *(node for node in self.nodes if node != self.me)]
        return Watch(order, 0, self.fanout, self.liveness_every, self.ssh_timeout).start()

    def watch(
        self, process: subprocess.Popen[bytes], pool: ThreadPoolExecutor, tree: Watch
    ) -> Failure | None:
        """Wait for the launcher, the time bound, a stop, or a lost node; the failure, or None on success."""
        others = [node for node in self.nodes if node != self.me]
        while True:
            returncode = process.poll()
            if returncode is not None:
                if returncode == 0:
                    return None
                failure = launcher_failure(read_text(self.job_dir / LAUNCHER_LOG), self.spec, returncode)
                # A dead node makes its peers' collectives fail first: name the cause.
                if lost := tree.lost() or down_now(others, self.probe, pool):
                    return Failure(
                        f"node {lost[0]} stopped answering ssh (its container or server is down); "
                        f"then {failure.reason} on {failure.node or 'a node'}",
                        node=lost[0],
                        lost=tuple(lost),
                    )
                return failure
            if self._stop.is_set():
                return Failure("the job was stopped (the supervisor received a signal)")
            if time.time() - self.started > self.spec.timeout:
                return Failure(f"the job did not finish within job_timeout={self.spec.timeout:g} s")
            if lost := tree.lost():
                return Failure(
                    f"node {lost[0]} stopped answering ssh (its container or server is down)",
                    node=lost[0],
                    lost=tuple(lost),
                )
            self.status.write(progress=self.progress())
            time.sleep(self.spec.poll)

    def run(self) -> int:
        for folder in (self.job_dir, self.job_dir / "output", self.job_dir / "logs"):
            folder.mkdir(parents=True, exist_ok=True)
        self.status.write(state="running", pid=os.getpid(), nodes=self.nodes, launcher=self.launcher)
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(self.nodes)))) as pool:
            failure = self.distribute(pool)
            if failure is not None:
                self.report(failure, None, {})
                return 1
            with open(self.job_dir / LAUNCHER_LOG, "ab") as log:
                process = subprocess.Popen(
                    self.launcher,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.job_dir,
                    start_new_session=True,
                )
            tree = self.tree()
            try:
                failure = self.watch(process, pool, tree)
                if failure is None:
                    tree.stop()
                    self.status.write(state="succeeded", rc=0, progress=self.progress())
                    return 0
                self.stop_everything(process, pool)  # the ranks first, then the watch
                tree.stop()
                self.report(failure, process.returncode, self.leftover(pool))
                return 1
            finally:
                tree.stop()

    def distribute(self, pool: ThreadPoolExecutor) -> Failure | None:
        """Unpack the job's files (JOB/job.tar.gz: job.json, the script or the project, the rank table) into
        the job's directory on every other node, over the mesh's ssh, all at once; the failure naming the
        first node that did not take them. The playbook puts them on this node only, after every node's
        check passed, so that a refused job leaves nothing behind."""
        bundle = self.job_dir / BUNDLE
        others = [node for node in self.nodes if node != self.me]
        if not bundle.is_file() or not others:
            return None
        where = shlex.quote(str(self.job_dir))
        command = f"mkdir -p {where} && tar -xzf - -C {where}"

        def give(node: str) -> str:
            argv = ["ssh", "-o", f"ConnectTimeout={self.ssh_timeout}", "-o", "BatchMode=yes", node, command]
            try:
                with bundle.open("rb") as data:
                    done = subprocess.run(
                        argv, stdin=data, capture_output=True, timeout=DISTRIBUTE_TIMEOUT, check=False
                    )
            except subprocess.TimeoutExpired:
                return f"no answer within {DISTRIBUTE_TIMEOUT} s"
            if done.returncode == 0:
                return ""
            said = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
            return (said[-1] if said else "") or f"ssh exited with status {done.returncode}"

        for node, error in zip(others, pool.map(give, others), strict=True):
            if error:
                down = probe_verdict(None, "") if error.startswith("no answer") else self.probe(node)
                return Failure(
                    f"the job's files could not be copied to node {node} ({error[:300]})",
                    node=node,
                    lost=(node,) if down == "down" else (),
                )
        return None

    def report(self, failure: Failure, returncode: int | None, leftover: dict[str, str]) -> None:
        log_node = failure.node if failure.node in self.nodes and failure.rank is not None else self.me
        # mpirun names log files after its own processes: with torchrun those are the nodes' agents.
        if self.spec.agents:
            log_process = self.nodes.index(log_node) if log_node in self.nodes else 0
        else:
            log_process = failure.rank if failure.rank is not None else 0
        self.status.write(
            state="failed",
            rc=returncode,
            reason=failure.reason,
            lost_nodes=failure.lost,
            failed_node=failure.node,
            failed_rank=failure.rank,
            exit_code=failure.exit_code,
            signal=failure.signal,
            signal_name=signal_name(failure.signal),
            log_file=f"{log_node}:{mpirun_log(self.job_dir, log_process)}",
            log_tail=self.rank_log_tail(log_process, log_node) or tail(self.job_dir / LAUNCHER_LOG),
            launcher_tail=tail(self.job_dir / LAUNCHER_LOG),
            leftover=leftover,
            progress=self.progress(),
        )

    # --- stopping ---------------------------------------------------------------------------------------
    def pattern(self) -> str:
        # '[/]workspace/...' matches the job's command lines but not the pkill/pgrep command line itself.
        return f"[{self.tag[0]}]{self.tag[1:]}" if self.tag else self.tag

    def stop_everything(self, process: subprocess.Popen[bytes], pool: ThreadPoolExecutor) -> None:
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if process.poll() is not None:
                break
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        kill = f"pkill -TERM -f -- '{self.pattern()}'; sleep 3; pkill -KILL -f -- '{self.pattern()}'; true"
        list(pool.map(lambda node: self.on_node(node, kill), self.nodes))

    def leftover(self, pool: ThreadPoolExecutor) -> dict[str, str]:
        found = pool.map(
            lambda node: self.on_node(node, f"pgrep -a -f -- '{self.pattern()}' || true"), self.nodes
        )
        return {node: out.strip() for node, out in zip(self.nodes, found, strict=True) if out and out.strip()}

    def on_node(self, node: str, command: str) -> str:
        """Run a shell command on a node (here, or over ssh); '' when the node does not answer."""
        if node == self.me:
            argv = ["/bin/sh", "-c", command]
        else:
            argv = ["ssh", "-o", f"ConnectTimeout={self.ssh_timeout}", "-o", "BatchMode=yes", node, command]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            return ""
        return done.stdout


def last_line(path: Path) -> str | None:
    lines = tail(path, 1)
    return lines[0] if lines else None


def tail(path: Path, count: int = TAIL_LINES) -> list[str]:
    text = read_text(path, limit=64 * 1024)
    return [line for line in text.splitlines() if line.strip()][-count:]


def read_text(path: Path, limit: int = 1024 * 1024) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def signal_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ddp_cluster.supervise", description=__doc__.split("\n\n")[0]
    )
    # JOB without a trailing slash: the supervisor's command line must not hold "JOB/", which marks the ranks.
    parser.add_argument("--job-dir", type=Path, required=True, help="the job's directory, with its job.json")
    parser.add_argument(
        "--liveness-every", type=float, default=3.0, help="seconds between ssh probes of nodes"
    )
    parser.add_argument("--tag", default="", help="text in every rank's command line (default: JOB/)")
    args = parser.parse_args(argv)
    try:
        args.spec = jobspec.load(args.job_dir / jobspec.JOB_FILE)
        args.launcher = args.spec.launch_argv()
    except jobspec.JobSpecError as error:
        parser.error(str(error))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    job_dir = args.job_dir
    (job_dir / "hostfile").write_text(args.spec.hostfile())
    supervisor = Supervisor(
        spec=args.spec,
        job_dir=job_dir,
        launcher=args.launcher,
        liveness_every=args.liveness_every,
        tag=args.tag,
    )
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: supervisor._stop.set())
    return supervisor.run()


if __name__ == "__main__":
    raise SystemExit(main())
