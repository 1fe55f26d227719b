"""Job supervisor: runs the launcher on the first node, watches every node, stops every rank when one fails.

    python -m ddp_cluster.supervise --job-dir JOB      (reads JOB/job.json)

Everything comes from the job's spec (:class:`ddp_cluster.job.spec.JobSpec`, written by train.yml): its
nodes, the
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
output says failed), :class:`ddp_cluster.supervisor.liveness.Watch` (which nodes stopped answering, watched
along a tree
whose cost on this node does not grow with the node count; a slow node is never declared dead),
and :class:`Supervisor`, which runs the launcher and stops everything.

No torch here: the supervisor runs beside the job, in the image's Python.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ddp_cluster.ascend import ranktable
from ddp_cluster.files import add_file, write_atomic
from ddp_cluster.job import doctor, status
from ddp_cluster.job import spec as jobspec
from ddp_cluster.job.results import find_mpirun_log, mpirun_log
from ddp_cluster.job.spec import JobSpec
from ddp_cluster.job.status import Status
from ddp_cluster.supervisor.liveness import FANOUT, Watch, probe_verdict

# ssh sessions the supervisor keeps in flight to the other nodes (hand-out, probes, stop sweeps), and the
# grace between the TERM and the KILL sweep of a stop.
POOL = 64
STOP_GRACE = 3.0

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
# The doctor's verdicts that a restart can cure (a peer vanished, a collective or the store timed out): not a
# Python error in the user's code, not the job's own time bound, not a stop.
RESTARTABLE = ("node-down", "store-timeout", "nccl-timeout", "hccl-EI0002", "hccl-EI0006", "gloo-connection")
# Where a restarted job's earlier attempts keep their logs (JOB/attempts/<n>/), on every node.
ATTEMPTS = "attempts"
CHECKPOINT = re.compile(r"^epoch-(\d+)(?:[.]step-(\d+))?[.]ckpt$")


@dataclass
class Failure:
    reason: str
    node: str | None = None
    rank: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    lost: tuple[str, ...] = ()  # the nodes that stopped answering
    at: float = field(default_factory=time.time)  # when the supervisor found it
    restartable: bool = True  # False: the time bound or a stop (never restarted)


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
        self.wanted = len(self.nodes)  # a restart fills the job up to this many nodes from the spares
        self.status = StatusFile(self.job_dir / STATUS_FILE, self.started)
        self.restarts: list[dict[str, Any]] = []
        self.stop_reason = "the job was stopped (the supervisor received a signal)"
        self.interrupted = ""  # the reason of a stop asked from the controller
        self._progress_at_restart: Any = None
        self._next_ranks_check = 0.0

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
                if lost := tree.lost() or down_now(others, self.probe, pool):
                    return Failure(
                        f"node {lost[0]} stopped answering ssh (its container or server is down); "
                        f"then {failure.reason} on {failure.node or 'a node'}",
                        node=lost[0],
                        lost=tuple(lost),
                    )
                return failure
            if time.time() - self.started > self.spec.timeout:
                return Failure(
                    f"the job did not finish within job_timeout={self.spec.timeout:g} s", restartable=False
                )
            if lost := tree.lost():
                return Failure(
                    f"node {lost[0]} stopped answering ssh (its container or server is down)",
                    node=lost[0],
                    lost=tuple(lost),
                )
            self.status.write(progress=self.progress())
            self.note_training_again()
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
            failure = self.distribute(pool, others, bundle.read_bytes() if bundle.is_file() else b"")
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
                        self.record_restarts_in_summary()
                        return 0
                    self.stop_everything(process, pool)  # the ranks first, then the watch
                finally:
                    tree.stop()
                if not self.recover(failure, pool):
                    self.report(failure, process.returncode, self.leftover(pool))
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
        count = f"pgrep -c -f -- '{self.pattern()}' || true"
        found = pool.map(lambda node: self.on_node(node, count), self.nodes)
        for node, text in zip(self.nodes, found, strict=True):
            want = self.spec.processes_per_node + (1 if node == self.me else 0)
            if not text.strip().isdigit() or int(text.strip()) < want:
                return False
        return True

    # --- recovering -------------------------------------------------------------------------------------
    def restart_cause(self, failure: Failure) -> str | None:
        """Why a restart could cure ``failure`` (a node gone, a rank killed, a collective or the store timed
        out: the doctor's verdict on this attempt's logs), or None (the user's code failed, the time bound,
        a stop)."""
        if not failure.restartable:
            return None
        if failure.lost:
            return f"node {', '.join(failure.lost)} stopped answering"
        if failure.signal is not None:
            where = f"rank {failure.rank} on {failure.node}" if failure.rank is not None else failure.node
            return f"{where or 'a rank'} was killed by {signal_name(failure.signal)}"
        found: dict[str, doctor.Finding] = {}
        logs = sorted(path for path in (self.job_dir / "logs").rglob("*") if path.is_file())
        texts = [read_text(self.job_dir / LAUNCHER_LOG), *(read_text(log, 256 * 1024) for log in logs)]
        if failure.node in self.nodes and failure.node != self.me:  # the failing rank's log is on its node
            process = self.nodes.index(failure.node) if self.spec.agents else failure.rank
            texts.append("\n".join(self.rank_log_tail(process or 0, failure.node)))
        for number, text in enumerate(texts):
            doctor.match_lines(str(number), text.splitlines(), found)
        if any(users_error(text) for text in texts):
            return None  # a Python error of the program: its peers' lost connections follow from it
        # The most likely verdict, if curable; else a timeout found anywhere (a rank's non-zero exit follows
        # one), but not a mere lost connection (it follows a rank that exited first).
        ranked = sorted(found.values(), key=lambda item: -item.signature.weight)
        if ranked and ranked[0].signature.id in RESTARTABLE:
            return ranked[0].cause
        timeouts = [
            item
            for item in ranked
            if item.signature.id in RESTARTABLE and item.signature.id != "gloo-connection"
        ]
        return timeouts[0].cause if timeouts else None

    def recover(self, failure: Failure, pool: ThreadPoolExecutor) -> bool:
        """After a failure, restart the job if it may be (max_restarts, the cause, enough nodes): on the nodes
        that still answer, a free spare in place of each lost node (else fewer, down to min_nodes), from the
        newest checkpoint; the restart is recorded in the status. False (the reason says why) when it is not
        restarted. Everything here runs on the cluster: no controller is needed."""
        spec, done = self.spec, len(self.restarts)
        cause = self.restart_cause(failure)
        lost_before = [item for record in self.restarts for item in record.get("lost", [])]
        if cause is None or not spec.max_restarts:
            if spec.max_restarts and failure.restartable:
                failure.reason += "; not restarted: a restart does not cure this (the job's own error)"
            return False
        if done >= spec.max_restarts:
            failure.reason += (
                f"; not restarted again: max_restarts={spec.max_restarts} reached"
                f" (lost before: {', '.join(lost_before) or 'none'})"
            )
            return False
        others = [node for node in self.nodes if node != self.me]
        down = set(failure.lost) | set(down_now(others, self.probe, pool))
        healthy = [node for node in self.nodes if node not in down]
        if leftover := self.leftover(pool, healthy):
            failure.reason += (
                f"; not restarted: processes of the job outlived the stop on {', '.join(leftover)}"
            )
            return False
        taken: list[str] = []
        for node in spec.spares:
            if len(healthy) + len(taken) >= self.wanted:
                break
            if node not in self.nodes and node not in lost_before and self.spare_free(node):
                taken.append(node)
        nodes = healthy + taken
        fewest = spec.min_nodes or self.wanted
        if len(nodes) < fewest:
            failure.reason += (
                f"; not restarted: {len(nodes)} node(s) left ({', '.join(nodes)}), fewer than"
                f" min_nodes={fewest}, and no spare up and free"
                + (f" among {', '.join(spec.spares)}" if spec.spares else " (the inventory has none)")
            )
            return False
        number = done + 1
        last_step = _step(self.progress())
        self.archive_attempt(number - 1, [node for node in self.nodes if node not in down], pool)
        checkpoint, resume_step = newest_checkpoint(self.job_dir / "output")
        resume_from = f"{spec.job_dir}/output/checkpoints/{checkpoint}" if checkpoint else ""
        self.spec = replace(
            spec,
            nodes=tuple(nodes),
            spares=tuple(node for node in spec.spares if node not in nodes),
            restart=number,
            resume=spec.kind == "train" and not spec.script,
            resume_from=resume_from,
        )
        self.nodes = list(nodes)
        self.launcher = self.spec.launch_argv()
        update = self.write_plan_files()
        error = self.distribute(pool, taken, (self.job_dir / BUNDLE).read_bytes()) if taken else None
        error = error or self.distribute(pool, [node for node in nodes if node != self.me], update)
        if error is not None:
            failure.reason += f"; not restarted: {error.reason}"
            return False
        record = {
            "restart": number,
            "cause": cause,
            "lost": sorted(down),
            "nodes_before": list(spec.nodes),
            "nodes_after": nodes,
            "spares_taken": taken,
            "lost_at": round(failure.at, 2),
            "restarted_at": round(time.time(), 2),
            "training_again_s": None,
            "checkpoint": checkpoint or None,
            "resume_step": resume_step,
            "last_step": last_step,
            "steps_redone": max(0, last_step - resume_step) if last_step is not None else None,
        }
        self.restarts.append(record)
        self._progress_at_restart = self.progress()
        ran_on = list(dict.fromkeys([*self.status.status.ran_on, *nodes]))
        self.status.write(
            nodes=nodes,
            launcher=self.launcher,
            ran_on=ran_on,
            restarts=self.restarts,
            lost_nodes=sorted(set(self.status.status.lost_nodes) | down),
            ranks_running=False,
        )
        return True

    def spare_free(self, node: str) -> bool:
        """A spare is a node that answers and runs no job (no process of any job's directory)."""
        if self.probe(node) != "up":
            return False
        jobs = str(Path(self.spec.job_dir).parent).rstrip("/") + "/"
        pattern = f"[{jobs[0]}]{jobs[1:]}"
        answer = self.on_node(node, f"pgrep -f -- '{pattern}' >/dev/null && echo busy || echo free")
        return answer.strip() == "free"

    def archive_attempt(self, number: int, nodes: Sequence[str], pool: ThreadPoolExecutor) -> None:
        """Move an attempt's logs to JOB/attempts/<number>/ on each node that answers (here: its launcher.log
        too), so that the next attempt starts with empty logs and the report keeps both."""
        where = shlex.quote(str(self.job_dir))
        target = f"{where}/{ATTEMPTS}/{number}"
        move = f"mkdir -p {target} && if [ -d {where}/logs ]; then mv {where}/logs {target}/; fi"
        move += f" && mkdir -p {where}/logs"
        move += f" && if [ -f {where}/{LAUNCHER_LOG} ]; then mv {where}/{LAUNCHER_LOG} {target}/; fi; true"
        list(pool.map(lambda node: self.on_node(node, move), nodes))

    def write_plan_files(self) -> bytes:
        """This attempt's job.json, hostfile and (npu, rank_table) rank table, here; the tar of what the other
        nodes need (job.json, the rank table)."""
        files = {jobspec.JOB_FILE: self.spec.dumps().encode()}
        spec = self.spec
        if spec.accelerator == "npu" and spec.hccl_init == "rank_table" and spec.recovery.get("npu_plan"):
            table = ranktable.job_rank_table_dict(
                spec.recovery["npu_plan"], list(spec.nodes), spec.nproc_per_node, spec.recovery.get("visible")
            )
            files["rank_table.json"] = ranktable.dumps(table).encode()
        for name, data in files.items():
            write_atomic(self.job_dir / name, data)
        (self.job_dir / "hostfile").write_text(spec.hostfile())
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for name, data in files.items():
                add_file(tar, name, data)
        return buffer.getvalue()

    def note_training_again(self) -> None:
        """After a restart, the seconds from the loss to the first progress past the resumed step."""
        if not self.restarts or self.restarts[-1].get("training_again_s") is not None:
            return
        record, progress = self.restarts[-1], self.progress()
        step = _step(progress)
        if progress is None or progress == self._progress_at_restart:
            return
        if step is not None and step <= int(record.get("resume_step") or 0):
            return
        record["training_again_s"] = round(time.time() - float(record["lost_at"]), 1)
        self.status.write(restarts=self.restarts)

    def record_restarts_in_summary(self) -> None:
        """The restarts, in the job's summary.json too (when the program wrote one)."""
        summary = self.job_dir / "output" / "summary.json"
        if not self.restarts or not summary.is_file():
            return
        try:
            data = json.loads(summary.read_text())
        except ValueError:
            return
        data["restarts"] = self.restarts
        write_atomic(summary, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())

    def distribute(self, pool: ThreadPoolExecutor, nodes: Sequence[str], data: bytes) -> Failure | None:
        """Unpack ``data`` (a tar.gz: JOB/job.tar.gz with job.json, the script or the project, the rank
        table; or a restart's new job.json and rank table) into the job's directory on ``nodes``, over the
        mesh's ssh, all at once; the failure naming the first node that did not take them. The playbook
        puts the job's files on this node only, after every node's check passed, so that a refused job
        leaves nothing behind."""
        if not data or not nodes:
            return None
        where = shlex.quote(str(self.job_dir))
        command = f"mkdir -p {where} && tar -xzf - -C {where}"

        def give(node: str) -> str:
            argv = ["ssh", "-o", f"ConnectTimeout={self.ssh_timeout}", "-o", "BatchMode=yes", node, command]
            try:
                done = subprocess.run(
                    argv, input=data, capture_output=True, timeout=DISTRIBUTE_TIMEOUT, check=False
                )
            except subprocess.TimeoutExpired:
                return f"no answer within {DISTRIBUTE_TIMEOUT} s"
            if done.returncode == 0:
                return ""
            said = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
            return (said[-1] if said else "") or f"ssh exited with status {done.returncode}"

        for node, error in zip(nodes, pool.map(give, nodes), strict=True):
            if error:
                down = probe_verdict(None, "") if error.startswith("no answer") else self.probe(node)
                return Failure(
                    f"the job's files could not be copied to node {node} ({error[:300]})",
                    node=node,
                    lost=(node,) if down == "down" else (),
                )
        return None

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
        # One TERM sweep of every node, one grace period for all, then a KILL sweep of the nodes where
        # something was left: the grace is paid once (not once per node, pool threads at a time), and not at
        # all when nothing was left.
        term = f"pkill -TERM -f -- '{self.pattern()}' && echo left; true"
        found = pool.map(lambda node: self.on_node(node, term), self.nodes)
        left = [node for node, out in zip(self.nodes, found, strict=True) if "left" in out]
        if left:
            time.sleep(STOP_GRACE)
            list(
                pool.map(lambda node: self.on_node(node, f"pkill -KILL -f -- '{self.pattern()}'; true"), left)
            )

    def leftover(self, pool: ThreadPoolExecutor, nodes: Sequence[str] | None = None) -> dict[str, str]:
        nodes = list(self.nodes if nodes is None else nodes)
        found = pool.map(lambda node: self.on_node(node, f"pgrep -a -f -- '{self.pattern()}' || true"), nodes)
        return {node: out.strip() for node, out in zip(nodes, found, strict=True) if out and out.strip()}

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


# A Python exception's last line in a rank's log ("[rank1]: ZeroDivisionError: ..."), and the ones that are
# the collectives' (a peer or the store gone): those a restart may cure.
EXCEPTION = re.compile(r"^(?:\[(?:rank|default)\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception))(?::\s*(.*))?$")
COLLECTIVE = re.compile(r"(?:Dist(?:Backend|Network|Store)?Error|ChildFailedError)$")
COLLECTIVE_TEXT = re.compile(r"gloo|nccl|hccl|connection|timed out|timeout|peer|socket|store", re.IGNORECASE)


def users_error(text: str) -> bool:
    """Whether a log holds a Python exception raised by the program itself (not by the collectives)."""
    for line in text.splitlines():
        match = EXCEPTION.match(line.strip())
        if match is None:
            continue
        name, said = match.group(1), match.group(2) or ""
        if COLLECTIVE.search(name) or (name.endswith("RuntimeError") and COLLECTIVE_TEXT.search(said)):
            continue
        return True
    return False


def _step(progress: Any) -> int | None:
    if isinstance(progress, Mapping) and isinstance(progress.get("step"), int):
        return int(progress["step"])
    return None


def newest_checkpoint(output: Path) -> tuple[str, int]:
    """The newest complete checkpoint's file name in OUTPUT/checkpoints and its step ('' and 0 when none): a
    mid-epoch checkpoint (epoch-E.step-S.ckpt) names its step; an epoch's is found in metrics.jsonl's record
    of that epoch. Names sort in training order; temporary files are not checkpoints."""
    folder = output / "checkpoints"
    names = (
        sorted(path.name for path in folder.iterdir() if CHECKPOINT.match(path.name))
        if folder.is_dir()
        else []
    )
    if not names:
        return "", 0
    match = CHECKPOINT.match(names[-1])
    assert match is not None
    if match.group(2):
        return names[-1], int(match.group(2))
    epoch = int(match.group(1))
    for line in read_text(output / "metrics.jsonl", limit=16 * 1024 * 1024).splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") == "epoch" and record.get("epoch") == epoch:
            return names[-1], int(record.get("step") or 0)
    return names[-1], 0


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

    def stop(signum: int, _frame: Any) -> None:
        # SIGUSR1: a stop asked from the controller (Ctrl-C in train.yml, jobs.yml -e stop=ID)
        if signum == signal.SIGUSR1:
            supervisor.stop_reason = "the job was stopped from the controller"
            reason = job_dir / "stop-reason"
            if reason.is_file():
                supervisor.stop_reason = (
                    reason.read_text(errors="replace").strip()[:300] or supervisor.stop_reason
                )
            supervisor.interrupted = supervisor.stop_reason
        supervisor._stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, stop)
    return supervisor.run()


if __name__ == "__main__":
    raise SystemExit(main())
