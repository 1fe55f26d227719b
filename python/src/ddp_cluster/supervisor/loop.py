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
(SIGUSR1 with JOB/stop-reason: a stop asked from the controller; SIGTERM, SIGINT, SIGHUP), or, with
stall_timeout, when no rank made progress for that long, or when the telemetry found a device of a node
turned bad (a device fault: that node is drained, and a restart goes on without it). Then every rank on every
node that still answers is stopped, and what is left over is reported. It holds the job's claim on each node
and releases it at its end; the launcher dies with it (a parent-death signal); a status it cannot write ends
the job, its last words left where the controller reads them. With ``--took-over-from NODE`` it is the job's
standby taking the job over from its lost first node (:meth:`Supervisor.take_over`).

Its parts, each tested on its own: :class:`StatusFile`; :mod:`~ddp_cluster.supervisor.failures` (what
mpirun's or torchrun's output says failed, and whether a restart cures it);
:mod:`~ddp_cluster.supervisor.remote` (the other nodes over the mesh's ssh, and the stop sweep);
:mod:`~ddp_cluster.supervisor.liveness` (which nodes stopped answering, watched along a tree whose cost on
this node does not grow with the node count; a node unheard for liveness_timeout is lost, a shorter blip is
not); :mod:`~ddp_cluster.supervisor.recovery` (the restart); :mod:`~ddp_cluster.supervisor.replicas` (rank 0's
checkpoints copied off this node); :mod:`~ddp_cluster.supervisor.stall` (the progress watchdog);
:mod:`~ddp_cluster.supervisor.standby` (the second node's standby, which takes the job over when this node is
lost); :mod:`~ddp_cluster.supervisor.telemetry` (every node sampled into JOB/telemetry/, device faults);
:mod:`~ddp_cluster.supervisor.drain` (a node kept out of the next jobs); and :class:`Supervisor`, which runs
the launcher.

No torch here: the supervisor runs beside the job, in the image's Python.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.files import add_file, write_atomic
from ddp_cluster.job import node_jobs, secrets, status
from ddp_cluster.job import spec as jobspec
from ddp_cluster.job.queue import SUBMITTED_ON
from ddp_cluster.job.results import find_mpirun_log, mpirun_log
from ddp_cluster.job.spec import JobSpec
from ddp_cluster.job.status import Status
from ddp_cluster.runtime import checkpoint_names
from ddp_cluster.supervisor import allocation, drain, fence, recovery, replicas, stall, standby, telemetry
from ddp_cluster.supervisor import jobs as node_claims
from ddp_cluster.supervisor.failures import (
    DEVICE_FAULT,
    TAIL_LINES,
    Failure,
    device_fault,
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
from ddp_cluster.supervisor.replicas import MeshTransport, Replicator

STATUS_FILE = status.FILE
# A file of fixed size made when the supervisor starts, overwritten in place with its last words when it must
# end without a status (a full disk: writing in place needs no new space); the controller reads it.
LAST_WORDS = "last-words"
LAST_WORDS_SIZE = 4096
# The supervisor's own output, in the job's directory (job.control.SUPERVISOR_LOG).
SUPERVISOR_LOG = "supervisor.log"
PR_SET_PDEATHSIG = 1
# Seconds a job's end waits for the checkpoint copies under way (the newest one off this node).
REPLICAS_WAIT = 120.0


class StatusWriteError(DdpClusterError):
    """status.json could not be written (a full disk, a read-only folder): the job cannot be followed."""


def die_with_parent() -> None:
    """In the launcher's child, before exec: SIGTERM when the supervisor dies (mpirun then stops every rank
    on every node), so that a killed supervisor leaves no job behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def last_words_files(job_dir: Path) -> list[Path]:
    """Where the last words go: the job's directory, and the container's /tmp (a full disk under the job's
    directory, or a mount over it, leaves that one readable)."""
    return [job_dir / LAST_WORDS, Path("/tmp/ddp-cluster", f"{job_dir.name}.{LAST_WORDS}")]


def last_words(job_dir: Path, text: str = "") -> None:
    """Make the last-words files (``text`` empty), or overwrite them with ``text``, in place."""
    data = text.encode("utf-8", "replace")[: LAST_WORDS_SIZE - 1]
    for path in last_words_files(job_dir):
        try:
            if not text:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b" " * LAST_WORDS_SIZE)
                continue
            descriptor = os.open(path, os.O_WRONLY)
            try:
                os.pwrite(descriptor, data + b"\n" + b" " * (LAST_WORDS_SIZE - len(data) - 1), 0)
            finally:
                os.close(descriptor)
        except OSError:
            continue


class StatusFile:
    """The job's status.json (a :class:`ddp_cluster.job.status.Status`), rewritten whole (atomically) at every
    change; ``elapsed`` since ``started``. What it is given (log tails, progress lines: a rank's output) has
    the job's secret values masked (``masked``)."""

    def __init__(self, path: Path, started: float, masked: Sequence[str] = ()) -> None:
        self.path = path
        self.started = started
        self.masked = secrets.maskable(masked)
        self.status = Status()

    def write(self, **fields: Any) -> None:
        self.status = self.status.update(
            **secrets.mask_all(fields, self.masked),
            elapsed=round(time.time() - self.started, 1),
            updated=time.time(),
        )
        try:
            write_atomic(self.path, self.status.dumps().encode())
        except OSError as error:
            raise StatusWriteError(f"{self.path} could not be written ({error.strerror or error})") from error


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
        # The job's secret values (JOB/secrets.json, the start's on this node, the hand-out's on a standby):
        # masked in what status.json quotes of a rank's output.
        self.secrets = secrets.read(self.job_dir)
        self.status = StatusFile(self.job_dir / STATUS_FILE, self.started, list(self.secrets.values()))
        self.restarts: list[dict[str, Any]] = []
        self.stop_reason = "the job was stopped (the supervisor received a signal)"
        self.interrupted = ""  # the reason of a stop asked from the controller
        self.progress_at_restart: Any = None
        self.outlived = False  # another node took this job over while this one was cut off
        # The fence (supervisor.fence): the generation this supervisor won (0: the start's), whether it holds
        # the job (the first node from the start; a standby once it won its takeover), and the election it
        # lost, when it lost one (it then steps down).
        self.generation = fence.read(self.job_dir).generation
        self.holder = False
        self.lost_election: fence.Election | None = None
        self._next_ranks_check = 0.0
        # Every node of the current attempt sampled every telemetry_interval seconds (0: never), in a thread.
        self.telemetry = telemetry.Sampler(
            self.job_dir,
            lambda: list(self.nodes),
            self.spec.accelerator,
            self.tag,
            self.spec.telemetry_interval,
            lambda node, command, timeout: self.mesh.run(node, command),  # the mesh's own bound
        )
        # Rank 0's checkpoints copied off this node (supervisor.replicas), to the job's next nodes.
        self.replicator = Replicator(
            self.job_dir,
            self.replica_nodes(),
            self.spec.checkpoint_dir,
            self.spec.id,
            MeshTransport(self.mesh),
        )

    def replica_nodes(self) -> list[str]:
        return [node for node in self.nodes if node != self.me][: self.spec.checkpoint_replicas]

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
        # Open MPI pads the number among 10 or more processes (rank.03): else the file numbered ``process``.
        logs = shlex.quote(str(self.job_dir / "logs"))
        remote = shlex.quote(str(mpirun_log(self.job_dir, process)))
        command = (
            f"tail -n {TAIL_LINES} {remote} 2>/dev/null ||"
            f" for f in {logs}/*/rank.*/stdout; do n=${{f%/stdout}}; n=${{n##*rank.}};"
            f' [ "$(expr "$n" + 0)" = {int(process)} ] && exec tail -n {TAIL_LINES} "$f";'
            " done 2>/dev/null; true"
        )
        return self.mesh.run(node, command).splitlines()

    def launcher_failure(self, returncode: int) -> Failure:
        """What failed, from mpirun's own lines in JOB/launcher.log (the ranks' output stays on their nodes:
        ``--output-filename DIR:nocopy``). With torchrun, mpirun names the failing node's agent, whose log (on
        that node) holds torchrun's Root Cause block, which names the rank."""
        failure = launcher_failure(read_text(self.job_dir / LAUNCHER_LOG), self.spec, returncode)
        if self.spec.agents and failure.rank is None and failure.node in self.nodes:
            agent = self.rank_log_tail(self.nodes.index(failure.node), failure.node)
            named = launcher_failure("\n".join(agent), self.spec, returncode)
            if named.rank is not None:
                return named
        return failure

    def progress(self) -> Any:
        metrics = self.job_dir / "output" / "metrics.jsonl"
        line = last_line(metrics) if metrics.exists() else last_line(self.rank_log(0))
        if line is None:  # nothing here yet (a node that took the job over): the last progress known
            return self.status.status.progress
        try:
            return json.loads(line)
        except ValueError:
            return line[-300:]

    # --- watching ---------------------------------------------------------------------------------------
    def tree(self) -> Watch:
        """The nodes watched along a tree (supervisor.liveness): this node holds ``fanout`` ssh sessions,
        however many nodes the job has."""
        order = [self.me, *(node for node in self.nodes if node != self.me)]
        return Watch(
            order,
            0,
            self.fanout,
            self.liveness_every,
            self.ssh_timeout,
            timeout=self.spec.liveness_timeout,
            job_dir=self.job_dir,
            tag=self.tag,
        ).start()

    def watch(
        self, process: subprocess.Popen[bytes], pool: ThreadPoolExecutor, tree: Watch
    ) -> Failure | None:
        """Wait for the launcher, the time bound, a stop, or a lost node; the failure, or None on success."""
        others = [node for node in self.nodes if node != self.me]
        watchdog = stall.Watchdog(self.spec.stall_timeout, self.spec.stall_start_timeout, time.time())
        while True:
            returncode = process.poll()
            if self._stop.is_set():  # before the launcher's end: a stop kills ranks on other nodes too
                return Failure(self.stop_reason, restartable=False, graceful=True)
            if returncode is not None:
                if returncode == 0:
                    return None
                failure = self.launcher_failure(returncode)
                # A dead or frozen node makes its peers' collectives (and mpirun's daemons) fail first: wait
                # for the watch's verdict on a node it has not heard from lately, then name the cause.
                deadline = time.time() + self.spec.liveness_timeout + 2 * self.liveness_every
                while not tree.lost() and tree.suspects() and time.time() < deadline:
                    time.sleep(0.5)
                if lost := tree.lost() or self.mesh.down_now(others, pool):
                    self.forget(lost)
                    return lost_nodes(lost, f"{failure.reason} on {failure.node or 'a node'}")
                # A device that went bad makes its ranks fail too, often within milliseconds, before the
                # next periodic sample: the telemetry's finding, else one sample now (bounded: see
                # Sampler.check), names the cause, so that the restart leaves the node out.
                if fault := self.telemetry.check():
                    found = device_fault(fault.node, fault.device, fault.problem)
                    found.reason += f"; then {failure.reason} on {failure.node or 'a node'}"
                    return found
                return failure
            if time.time() - self.started > self.spec.timeout:
                return Failure(
                    f"the job did not finish within job_timeout={self.spec.timeout:g} s",
                    restartable=False,
                    graceful=True,
                )
            if lost := tree.lost():
                self.forget(lost)
                return lost_nodes(lost)
            if stalled := self.stalled(watchdog, tree):
                return stalled
            if fault := self.telemetry.fault():
                return device_fault(fault.node, fault.device, fault.problem)
            for copy in self.replicator.poll():
                if copy.get("error"):
                    print(
                        f"checkpoint copy to {copy.get('place')}: {copy['error']}",
                        file=sys.stderr,
                        flush=True,
                    )
            self.status.write(
                progress=self.progress(), replicas=self.replicator.state(), **self.checkpoint_steps()
            )
            recovery.note_training_again(self)
            if not self.status.status.ranks_running and time.time() >= self._next_ranks_check:
                self._next_ranks_check = time.time() + 1.0
                if self.ranks_running(pool):
                    self.status.write(ranks_running=True)
            time.sleep(self.spec.poll)

    def renew_claims(self, pool: ThreadPoolExecutor) -> list[str]:
        """The job's claim on each of its nodes, taken again before a launch (its grace starts anew); the
        nodes another job took meanwhile. Not before the first launch of a job its start claimed moments
        ago (that claim stands for half its grace): after a restart, a takeover or a long hand-out."""
        fresh = time.time() - self.started < node_claims.CLAIM_GRACE / 2
        if fresh and not self.restarts:
            return []
        jobs_dir = node_jobs.jobs_dir(str(self.job_dir))
        refused = node_claims.renew_all(self.mesh, self.nodes, self.spec.id, jobs_dir, pool)
        return sorted(node for node, answer in refused.items() if answer.get("job"))

    def release_claims(self) -> None:
        """The job's claims released on every node it ran on (a node that does not answer: stale later);
        not by a supervisor another node took the job over from (the claims are the new supervisor's)."""
        if self.outlived:
            return
        ran_on = list(dict.fromkeys([*self.status.status.ran_on, *self.nodes]))
        with contextlib.suppress(Exception), self.pool() as pool:
            node_claims.release_all(
                self.mesh, ran_on, self.spec.id, node_jobs.jobs_dir(str(self.job_dir)), pool
            )

    def checkpoint_steps(self) -> dict[str, Any]:
        """The step of rank 0's newest checkpoint here, added to the status when a new one appears (read from
        metrics.jsonl once per checkpoint); {} when nothing changed."""
        folder = self.job_dir / "output" / checkpoint_names.FOLDER
        try:
            names = [name for name in os.listdir(folder) if checkpoint_names.NAME.match(name)]
        except OSError:
            return {}
        newest = max(names, default="")
        known = dict(self.status.status.checkpoint_steps)
        if not newest or newest in known:
            return {}
        name, step = recovery.newest_checkpoint(self.job_dir / "output")
        known[name] = step
        return {"checkpoint_steps": dict(sorted(known.items())[-8:])}

    def forget(self, lost: Sequence[str]) -> None:
        for node in lost:
            self.replicator.forget(node)
            self.mesh.drop(node)

    def stalled(self, watchdog: stall.Watchdog, tree: Watch) -> Failure | None:
        """The progress watchdog: on a stall, every rank's stacks kept and the ranks outside a collective
        named (the failure's cause STALL: a restart may cure it)."""
        if self.spec.stall_timeout <= 0:
            return None
        reason = watchdog.check(time.time(), tree.activity_age())
        if reason is None:
            return None
        captured = stall.capture(self.mesh.run, self.nodes, str(self.job_dir))
        self.status.write(stalled=captured)
        failure = Failure(f"the job stalled: {reason}; {stall.summary(captured)}", cause=stall.STALL)
        if outside := captured.get("not_in_collective"):  # the report shows that rank's log
            failure.rank = int(outside[0])
            failure.node = str(captured["ranks"][outside[0]]["node"])
        return failure

    def run(self) -> int:
        """The job from its start (this is its first node): every node gets its files, then the attempts."""
        for folder in (self.job_dir, self.job_dir / "output", self.job_dir / "logs"):
            folder.mkdir(parents=True, exist_ok=True)
        last_words(self.job_dir)
        self.holder = True  # the start's supervisor holds the job (generation 0) until a newer one wins
        self.replicator.guard = self.guard()
        try:
            self.status.write(
                state="running",
                pid=os.getpid(),
                nodes=self.nodes,
                launcher=self.launcher,
                ran_on=self.nodes,
                max_restarts=self.spec.max_restarts,
                supervisor_node=self.me,
                start_id=self.spec.start_id,
            )
            with self.pool() as pool:
                others = [node for node in self.nodes if node != self.me]
                failure = self.mesh.give(others, self.files_for_others(), self.job_dir, pool)
                if failure is not None:
                    self.report(failure, None, {})
                    return 1
                return self.attempts(pool)
        except StatusWriteError as error:
            return self.cannot_write(error)
        finally:
            self.telemetry.stop()
            self.drain_after_gate()
            self.release_claims()
            self.mesh.close()

    def take_over(self, first: str) -> int:
        """The job, taken over on this node (its standby) after its first node ``first`` was lost: what is
        left of the attempt stopped, then a restart here (rank 0 and the master address move here) within
        max_restarts; else the job ends, every rank stopped, the checkpoint copies kept."""
        last_words(self.job_dir)
        mirrored = status.read(self.job_dir / standby.FOLDER / STATUS_FILE) or Status()
        self.restarts = [dict(record) for record in mirrored.restarts]
        self.status.status = mirrored.update(state="running", pid=os.getpid(), supervisor_node=self.me)
        self.started = self.status.started = time.time() - mirrored.elapsed
        survivors = [node for node in self.nodes if node != first]
        won = False
        try:
            with self.pool() as pool:
                # the job is this node's only once it won the fence on a majority of the job's voters: a first
                # node that was cut off from this one only keeps it otherwise
                election = self.elect(pool, unheard=[first])
                if not election.won:
                    return self.stand_down(election, first, pool)
                won = True
                self.mesh.sweep(survivors, self.tag, pool, guard=self.guard())
                failure = lost_nodes([first])
                failure.reason = (
                    f"node {first}, the job's first node (its supervisor and rank 0), stopped answering;"
                    f" {self.me} took the job over"
                )
                self.status.write(
                    lost_nodes=sorted({*mirrored.lost_nodes, first}), supervisor_node=self.me, standby=""
                )
                if not recovery.recover(self, failure, pool):
                    self.keep_copies(failure)
                    self.report(failure, None, self.mesh.leftover(survivors, self.tag, pool))
                    return 1
                self.replicator.retarget(self.replica_nodes())
                self.restarts[-1]["supervisor_moved"] = f"{first} -> {self.me}"
                self.status.write(restarts=self.restarts)
                return self.attempts(pool)
        except StatusWriteError as error:
            return self.cannot_write(error)
        finally:
            self.telemetry.stop()
            self.release_claims()
            self.mesh.close()
            if won:  # the job ended here: Slurm's batch host went with the first node
                allocation.end_in_slurm(self.spec.id)

    def keep_copies(self, failure: Failure) -> None:
        """A job that ends after its first node was lost: say where the checkpoint copies are kept."""
        # the newest one that is whole (the one a resume would take), not merely the newest name
        kept = replicas.newest_verified(self.job_dir, self.spec.checkpoint_dir, self.spec.id)[0]
        shared = f" and in {self.spec.checkpoint_dir}/{self.spec.id}" if self.spec.checkpoint_dir else ""
        failure.reason += (
            f"; every rank was stopped; the checkpoint copies are kept on {self.me}"
            + (f" (newest: {kept})" if kept else " (none was made)")
            + f"{shared}: ansible-playbook train.yml -e resume=true -e resume_from={self.spec.id}"
        )

    def attempts(self, pool: ThreadPoolExecutor) -> int:
        """Launch, watch, and restart while a restart may cure the failure; the supervisor's exit status."""
        self.telemetry.start()
        while True:
            if taken := self.renew_claims(pool):
                said = f"another job claimed {', '.join(taken)} before the launch (its claim lapsed)"
                self.report(Failure(said, restartable=False), None, {})
                return 1
            # The watch first: each node's new watcher pings before this attempt's ranks exist there, so that
            # a watcher left from the last attempt stands down instead of sweeping them.
            tree = self.tree()
            process = self.launch()
            self.ensure_standby()
            ending = True  # tell the watchers the attempt ended (they sweep their node)
            try:
                failure = self.watch(process, pool, tree)
                if failure is None:
                    tree.stop()
                    self.replicator.finish(timeout=REPLICAS_WAIT)
                    self.status.write(
                        state="succeeded", rc=0, progress=self.progress(), replicas=self.replicator.state()
                    )
                    recovery.record_restarts_in_summary(self)
                    return 0
                if winner := self.superseded(pool):
                    # another node took the job over while this one was cut off: this node's ranks stopped,
                    # nothing touched elsewhere (the other nodes are the new supervisor's)
                    ending = False
                    self.stop_everything(process, pool, [node for node in self.nodes if node != self.me])
                    return self.step_down(winner, f"{winner} holds a newer generation of the job")
                # the ranks first, then the watch; a stop gives every rank its grace
                grace = self.spec.stop_grace if failure.graceful else 0.0
                self.stop_everything(process, pool, failure.lost, grace)
            finally:
                tree.stop(end=ending)
            drained = self.leave_faulty_node(failure) if failure.cause == DEVICE_FAULT else ""
            if recovery.recover(self, failure, pool):
                self.replicator.retarget(self.replica_nodes())
                if drained:
                    self.restarts[-1]["drained"] = [drained]
                    self.status.write(restarts=self.restarts)
            elif self.lost_election is not None:  # another supervisor holds the job, or may: step down
                election = self.lost_election
                winner = election.winner() or self.status.status.standby
                return self.step_down(winner, failure.reason)  # the reason names the election
            else:
                self.replicator.finish(timeout=REPLICAS_WAIT)
                answering = [node for node in self.nodes if node not in failure.lost]
                self.report(failure, process.returncode, self.mesh.leftover(answering, self.tag, pool))
                return 1

    def leave_faulty_node(self, failure: Failure) -> str:
        """After a device fault on ``failure.node``: the node drained (kept out of the next jobs, with the
        fault as the reason) and left out of the restart, which fills its place from the spares; the node
        left ('' when it is this one: the job's supervisor and rank 0 cannot leave it, so no restart)."""
        node = failure.node or ""
        reason = f"{failure.reason} (job {self.spec.id})"
        jobs_dir = node_jobs.jobs_dir(str(self.job_dir))
        if not drain.drain_remote(self.mesh, node, jobs_dir, reason, f"supervisor on {self.me}"):
            failure.reason += f"; {node} could not be drained: drain it with jobs.yml -e drain={node}"
        self.telemetry.forget(node)
        if node == self.me:
            failure.restartable = False
            failure.reason += (
                f"; not restarted: {node} is the job's first node (its supervisor and rank 0), which a"
                " restart cannot leave: start the job again (the plan skips the drained node)"
            )
            return ""
        self.status.write(failed_node=node)
        self.nodes = [item for item in self.nodes if item != node]
        return node

    def drain_after_gate(self) -> None:
        """A health gate's end: the nodes its verdict names slow drained (supervisor.drain), said in the
        supervisor's log."""
        if self.spec.kind == "train" or self.outlived:
            return
        jobs_dir = node_jobs.jobs_dir(str(self.job_dir))
        with contextlib.suppress(Exception):
            for line in drain.drain_gate(
                self.mesh, self.job_dir, jobs_dir, self.spec.id, f"supervisor on {self.me}"
            ):
                print(f"health gate {self.spec.id}: {line}", file=sys.stderr, flush=True)

    def pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=min(POOL, max(1, len(self.nodes) + len(self.spec.spares))))

    def files_for_others(self) -> bytes:
        """What the other nodes get: the job's files (the bundle's members), its secrets (mode 0600: the
        ranks' wrapper reads them on every node) and the bundle itself, so that a node that takes the job
        over can hand it to a spare."""
        bundle = self.job_dir / BUNDLE
        if not bundle.is_file():
            return b""
        data = bundle.read_bytes()
        buffer = io.BytesIO()
        with (
            tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as source,
            tarfile.open(fileobj=buffer, mode="w:gz") as target,
        ):
            for member in source.getmembers():
                target.addfile(member, source.extractfile(member) if member.isfile() else None)
            if self.secrets:
                content = secrets.dumps(self.secrets)
                info = tarfile.TarInfo(secrets.FILE)
                info.size, info.mode, info.mtime = len(content), 0o600, int(time.time())
                target.addfile(info, io.BytesIO(content))
            add_file(target, BUNDLE, data)
        return buffer.getvalue()

    def ensure_standby(self) -> None:
        """The standby runs on the job's second node (started unless it runs; in the background, so that the
        watch starts at once)."""
        node = next((node for node in self.nodes if node != self.me), "")
        if not node:
            return
        command = standby.start_command(
            str(self.job_dir), self.me, self.spec.liveness_timeout, node_jobs.NODE_ENV
        )
        threading.Thread(target=self.mesh.run, args=(node, command), daemon=True).start()
        if self.status.status.standby != node:
            self.status.write(standby=node)

    def guard(self) -> str:
        """The shell prefix that makes another node refuse this supervisor's command once a newer one holds
        the job there (supervisor.fence.guard)."""
        return fence.guard(str(self.job_dir), self.generation, self.me)

    def elect(self, pool: ThreadPoolExecutor, unheard: Sequence[str] = ()) -> fence.Election:
        """Ask the job's voters for the next generation (supervisor.fence), but ``unheard`` (taken for lost:
        silent without being asked); won, it is this supervisor's."""
        known = max(self.generation, fence.read(self.job_dir).generation)
        election = fence.elect(
            lambda nodes, command: self.mesh.run_on(nodes, command, pool),
            str(self.job_dir),
            self.me,
            known + 1,
            fence.voters(self.spec.nodes, self.spec.spares),
            self.holder,
            self.mesh.proven_gone,
            unheard,
        )
        verdict = "won" if election.won else "lost"
        print(f"fence of job {self.spec.id}: {election.describe()}: {verdict}", file=sys.stderr, flush=True)
        if election.won:
            self.generation, self.holder = election.generation, True
            self.replicator.guard = self.guard()
        else:
            self.lost_election = election
        return election

    def superseded(self, pool: ThreadPoolExecutor) -> str:
        """The node that holds a newer generation of the job than this supervisor, by the fence's record on
        the job's other voters that answer ('' when none does)."""
        others = [node for node in fence.voters(self.spec.nodes, self.spec.spares) if node != self.me]
        path = shlex.quote(f"{self.job_dir}/{fence.RECORD}")
        for text in pool.map(lambda node: self.mesh.run(node, f"cat {path} 2>/dev/null"), others):
            held = fence.parse_record(text)
            if held.node and held.node != self.me and held.generation > self.generation:
                return held.node
        return ""

    def step_down(self, winner: str, why: str) -> int:
        """Another supervisor holds the job (``winner``), or may: this one's ranks here are stopped (by the
        caller), nothing else is touched, the status says whose the job is (the controller follows it there)
        and the job's claims are left to it."""
        self.outlived = True
        said = f"the supervisor on {self.me} stepped down: {why}"
        print(said, file=sys.stderr, flush=True)
        self.leave_job_here()
        if winner and winner != self.me:
            self.status.write(supervisor_node=winner, standby=winner, ranks_running=False, reason=said)
        else:
            self.status.write(state="failed", reason=f"{said}; no other node is known to hold the job")
        return 1

    def leave_job_here(self) -> None:
        """This node is out of the job (its supervisor lost the fence: the job, wherever it goes on, goes on
        without it): its claim released and the job's end recorded here, so that the next job may take the
        node at once and what is left of this job here is a stray."""
        with contextlib.suppress(Exception):
            node_claims.release(node_jobs.jobs_dir(str(self.job_dir)), self.spec.id, ended=True)

    def stand_down(self, election: fence.Election, first: str, pool: ThreadPoolExecutor) -> int:
        """This standby lost its takeover: its first node (or another) holds the job. Its own ranks are
        stopped; its status says why (what the controller reads when it follows the job here)."""
        self.outlived = True
        self.mesh.sweep([self.me], self.tag, pool)
        self.leave_job_here()
        two = len(election.voters) == 2
        reason = (
            f"{self.me}, the job's standby, did not take the job over from {first}: {election.describe()}"
            + (
                f"; with two voters the standby takes the job over only when {first} is proven gone (its"
                " name or address no longer answers), never on silence alone: add a spare (a third voter)"
                " to the inventory for a job of two nodes to survive its first node's silence"
                if two and not election.refused
                else ""
            )
        )
        print(reason, file=sys.stderr, flush=True)
        self.status.write(state="failed", reason=reason, supervisor_node=self.me)
        return 1

    def cannot_write(self, error: StatusWriteError) -> int:
        """status.json cannot be written: every rank stopped, the last words left where the controller reads
        them, a non-zero exit."""
        words = f"the supervisor on {self.me} ended the job: {error}; every rank was stopped"
        print(words, file=sys.stderr, flush=True)
        last_words(self.job_dir, words)
        with contextlib.suppress(Exception), self.pool() as pool:
            self.mesh.sweep(self.nodes, self.tag, pool)
        with contextlib.suppress(StatusWriteError):
            self.status.write(state="failed", reason=words)
        return 3

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the launcher (this attempt's), its output appended to JOB/launcher.log; it dies with the
        supervisor. The ranks' variables are in its environment, named on its command line (``-x NAME``:
        :meth:`JobSpec.launch_argv`), so that no value shows in ``ps``."""
        self._next_ranks_check = 0.0
        with open(self.job_dir / LAUNCHER_LOG, "ab") as log:
            return subprocess.Popen(
                self.launcher,
                env={**os.environ, **self.spec.variables()},
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.job_dir,
                start_new_session=True,
                preexec_fn=die_with_parent,
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

    def stop_everything(
        self,
        process: subprocess.Popen[bytes],
        pool: ThreadPoolExecutor,
        lost: Sequence[str] = (),
        grace: float = 0.0,
    ) -> None:
        """The launcher's process group here (TERM, then KILL), then the job's processes on every node but
        the ``lost`` ones (a frozen node would hold each command to its bound; its own watcher stops its
        ranks when it finds its parent gone). With ``grace`` (a stop: the job's stop_grace), every rank on
        those nodes gets SIGTERM first, and up to that long to end."""
        if grace > 0 and process.poll() is None:
            # mpirun held still meanwhile: a rank that ends first (non-zero) would make it abort the others,
            # SIGKILL a second after a SIGTERM, within their grace
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGSTOP)
            try:
                answering = [node for node in self.nodes if node not in lost]
                self.mesh.term_ranks(answering, self.spec.id, pool, grace, guard=self.guard())
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)
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
        self.mesh.sweep([node for node in self.nodes if node not in lost], self.tag, pool, guard=self.guard())


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
    parser.add_argument(
        "--took-over-from",
        default="",
        metavar="NODE",
        help="this node is the job's standby and takes the job over from its lost first node NODE",
    )
    args = parser.parse_args(argv)
    # Slurm started the job here (its batch script names the node whose staged folder holds its files)
    if submitted_on := os.environ.pop(SUBMITTED_ON, ""):
        if allocation.start_here(args.job_dir, submitted_on):
            raise SystemExit(1)  # why, on stderr (Slurm's output) and in the job's last words
        # Slurm is the job's allocator only: neither the launcher nor a rank may take the batch step's
        # variables for its own (mpirun would start its daemons with srun, inside the step, and a restart's
        # srun waits for a lost node; the run wrapper would read SLURM_PROCID as the rank)
        allocation.forget_slurm(os.environ)
        # the supervisor's own output, in the job's directory as when train.yml starts it
        log = os.open(args.job_dir / SUPERVISOR_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        for stream in (1, 2):
            os.dup2(log, stream)
        os.close(log)
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
    if args.took_over_from:
        return supervisor.take_over(args.took_over_from)
    return supervisor.run()


if __name__ == "__main__":
    raise SystemExit(main())
