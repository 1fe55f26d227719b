"""Job supervisor: runs the launcher on the first node, watches every node, stops every rank when one fails.

    python -m ddp_cluster.supervise --job-dir JOB      (reads JOB/job.json)

Everything comes from the job's spec (:class:`ddp_cluster.job.spec.JobSpec`, written by train.yml): its
nodes, the launcher's command line and hostfile, whether mpirun's processes are ranks or torchrun agents, the
time bound and the poll. The command line is not the supervisor's own: every rank's command line holds
``JOB/`` (its output dir or script), which is how ranks are found and stopped, and the supervisor's must not.

train.yml starts it detached inside the first node's container. It writes ``JOB/status.json`` (atomically)
as the job goes: ``running`` with the latest progress, then ``succeeded`` or ``failed`` with the reason, the
node, the rank, its exit code or signal and the last lines of that rank's log. A job fails when the launcher
exits non-zero, when a node stops answering ssh (its container or server died: the collectives would otherwise
wait for their own, much longer, timeout), when the time bound passes, or when the supervisor is told to stop
(SIGUSR1 with JOB/stop-reason: a stop asked from the controller; SIGTERM, SIGINT, SIGHUP). Then every rank on
every node that still answers is stopped, and what is left over is reported.

Its parts, each tested on its own: :class:`StatusFile`; :mod:`~ddp_cluster.supervisor.failures` (what
mpirun's or torchrun's output says failed, and whether a restart cures it);
:mod:`~ddp_cluster.supervisor.remote` (the other nodes over the mesh's ssh, and the stop sweep);
:mod:`~ddp_cluster.supervisor.liveness` (which nodes stopped answering, watched along a tree whose cost on
this node does not grow with the node count; a slow node is never declared dead);
:mod:`~ddp_cluster.supervisor.recovery` (the restart); and :class:`Supervisor`, which runs the launcher.

No torch here: the supervisor runs beside the job, in the image's Python.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_cluster.files import write_atomic
from ddp_cluster.job import spec as jobspec
from ddp_cluster.job import status
from ddp_cluster.job.results import find_mpirun_log, mpirun_log
from ddp_cluster.job.spec import JobSpec
from ddp_cluster.job.status import Status
from ddp_cluster.supervisor import recovery
from ddp_cluster.supervisor.failures import (
    TAIL_LINES,
    Failure,
    last_line,
    launcher_failure,
    lost_nodes,
    read_text,
    signal_name,
    tail,
)
from ddp_cluster.supervisor.jobs import STOP_REASON
from ddp_cluster.supervisor.liveness import FANOUT, Watch
from ddp_cluster.supervisor.recovery import BUNDLE, LAUNCHER_LOG
from ddp_cluster.supervisor.remote import POOL, Mesh

STATUS_FILE = status.FILE


class StatusFile:
    """The job's status.json (a :class:`ddp_cluster.job.status.Status`), rewritten whole (atomically) at every
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
        self.mesh = Mesh(socket.gethostname(), self.ssh_timeout)
        self.nodes = list(self.spec.nodes)
        self.wanted = len(self.nodes)  # a restart fills the job up to this many nodes from the spares
        self.status = StatusFile(self.job_dir / STATUS_FILE, self.started)
        self.restarts: list[dict[str, Any]] = []
        self.stop_reason = "the job was stopped (the supervisor received a signal)"
        self.interrupted = ""  # the reason of a stop asked from the controller
        self.progress_at_restart: Any = None
        self._next_ranks_check = 0.0

    @property
    def me(self) -> str:
        return self.mesh.me

    # --- logs and progress ------------------------------------------------------------------------------
    def rank_log(self, process: int) -> Path:
        """The output file of mpirun's process ``process`` (OpenMPI 4.x layout), on this node."""
        return find_mpirun_log(self.job_dir, process) or mpirun_log(self.job_dir, process)

    def rank_log_tail(self, process: int, node: str) -> list[str]:
        """Last lines of a process's log, which mpirun writes on the process's own node."""
        if node == self.me:
            return tail(self.rank_log(process))
        remote = mpirun_log(self.job_dir, process)
        return self.mesh.run(node, f"tail -n {TAIL_LINES} {remote} 2>/dev/null").splitlines()

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
    def tree(self) -> Watch:
        """The nodes watched along a tree (supervisor.liveness): this node holds ``fanout`` ssh sessions,
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
            if self._stop.is_set():  # before the launcher's end: a stop kills ranks on other nodes too
                return Failure(self.stop_reason, restartable=False)
            if returncode is not None:
                if returncode == 0:
                    return None
                failure = launcher_failure(read_text(self.job_dir / LAUNCHER_LOG), self.spec, returncode)
                # A dead node makes its peers' collectives fail first: name the cause.
                if lost := tree.lost() or self.mesh.down_now(others, pool):
                    return lost_nodes(lost, f"{failure.reason} on {failure.node or 'a node'}")
                return failure
            if time.time() - self.started > self.spec.timeout:
                return Failure(
                    f"the job did not finish within job_timeout={self.spec.timeout:g} s", restartable=False
                )
            if lost := tree.lost():
                return lost_nodes(lost)
            self.status.write(progress=self.progress())
            recovery.note_training_again(self)
            if not self.status.status.ranks_running and time.time() >= self._next_ranks_check:
                self._next_ranks_check = time.time() + 1.0
                if self.ranks_running(pool):
                    self.status.write(ranks_running=True)
            time.sleep(self.spec.poll)

    def run(self) -> int:
        for folder in (self.job_dir, self.job_dir / "output", self.job_dir / "logs"):
            folder.mkdir(parents=True, exist_ok=True)
        self.status.write(
            state="running",
            pid=os.getpid(),
            nodes=self.nodes,
            launcher=self.launcher,
            ran_on=self.nodes,
            max_restarts=self.spec.max_restarts,
        )
        with ThreadPoolExecutor(
            max_workers=min(POOL, max(1, len(self.nodes) + len(self.spec.spares)))
        ) as pool:
            bundle = self.job_dir / BUNDLE
            others = [node for node in self.nodes if node != self.me]
            data = bundle.read_bytes() if bundle.is_file() else b""
            failure = self.mesh.give(others, data, self.job_dir, pool)
            if failure is not None:
                self.report(failure, None, {})
                return 1
            while True:
                process = self.launch()
                tree = self.tree()
                try:
                    failure = self.watch(process, pool, tree)
                    if failure is None:
                        tree.stop()
                        self.status.write(state="succeeded", rc=0, progress=self.progress())
                        recovery.record_restarts_in_summary(self)
                        return 0
                    self.stop_everything(process, pool)  # the ranks first, then the watch
                finally:
                    tree.stop()
                if not recovery.recover(self, failure, pool):
                    self.report(failure, process.returncode, self.mesh.leftover(self.nodes, self.tag, pool))
                    return 1

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the launcher (this attempt's), its output appended to JOB/launcher.log."""
        self._next_ranks_check = 0.0
        with open(self.job_dir / LAUNCHER_LOG, "ab") as log:
            return subprocess.Popen(
                self.launcher, stdout=log, stderr=subprocess.STDOUT, cwd=self.job_dir, start_new_session=True
            )

    def ranks_running(self, pool: ThreadPoolExecutor) -> bool:
        """Whether every node runs its processes of the job (ranks, or torchrun's agent); here, mpirun too."""
        counts = self.mesh.counts(self.nodes, self.tag, pool)
        return all(
            counts[node] >= self.spec.processes_per_node + (1 if node == self.me else 0)
            for node in self.nodes
        )

    def report(self, failure: Failure, returncode: int | None, leftover: dict[str, str]) -> None:
        lost = sorted(set(self.status.status.lost_nodes) | set(failure.lost))
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
            lost_nodes=lost,
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
            interrupted=self.interrupted,
        )

    # --- stopping ---------------------------------------------------------------------------------------
    def stop(self, asked: str = "") -> None:
        """End the job (the watch sees it at its next poll); ``asked``: why, when the controller asked."""
        if asked:
            self.stop_reason = self.interrupted = asked
        self._stop.set()

    def stop_everything(self, process: subprocess.Popen[bytes], pool: ThreadPoolExecutor) -> None:
        """The launcher's process group here (TERM, then KILL), then the job's processes on every node."""
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
        self.mesh.sweep(self.nodes, self.tag, pool)


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

    def on_signal(signum: int, _frame: Any) -> None:
        asked = ""
        if signum == signal.SIGUSR1:  # a stop asked from the controller (Ctrl-C in train.yml, jobs.yml)
            reason = job_dir / STOP_REASON
            said = reason.read_text(errors="replace").strip()[:300] if reason.is_file() else ""
            asked = said or "the job was stopped from the controller"
        supervisor.stop(asked)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, on_signal)
    return supervisor.run()


if __name__ == "__main__":
    raise SystemExit(main())
