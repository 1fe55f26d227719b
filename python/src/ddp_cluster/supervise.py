"""Job supervisor: runs the launcher on the first node, watches every node, stops every rank when one fails.

    python -m ddp_cluster.supervise --job-dir DIR --nodes node0,node1 --nproc-per-node P --timeout S

The launch is read from ``DIR/launch.json``: ``{"argv": [...], "files": {"hostfile": "..."}}``, the launcher's
command line and the files it reads (written into DIR first). The command line is not the supervisor's own:
every rank's command line holds ``DIR/`` (its output dir or script), which is how ranks are found and stopped,
and the supervisor's must not.

train.yml starts it detached inside the first node's container. It writes ``DIR/status.json`` (atomically)
as the job goes: ``running`` with the latest progress, then ``succeeded`` or ``failed`` with the reason, the
node, the rank, its exit code or signal and the last lines of that rank's log. A job fails when the launcher
exits non-zero, when a node stops answering ssh (its container or server died: the collectives would otherwise
wait for their own, much longer, timeout), when the time bound passes, or when the supervisor is told to stop.
Then every rank on every node that still answers is stopped, and what is left over is reported.

No torch here: the supervisor runs beside the job, in the image's Python.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

from ddp_cluster.results import find_mpirun_log, mpirun_log

LAUNCHER_LOG = "launcher.log"
STATUS_FILE = "status.json"
TAIL_LINES = 20
# mpirun, when a rank exits non-zero / dies of a signal; torchrun's "Root Cause" block.
MPI_EXIT = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]\s*\n\s*Exit code:\s*(-?\d+)")
MPI_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
# ssh's words when the node's TCP stack answered but its sshd did not finish the login in time (MaxStartups,
# load): the node is alive, only slow, e.g. while its ranks import torch on a loaded machine.
SSH_SLOW = re.compile(r"banner exchange|kex_exchange_identification|Connection closed by|Connection reset by")
TORCHRUN_ROOT = re.compile(r"host\s*:\s*(\S+)\s*\n\s*rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")


@dataclass
class Failure:
    reason: str
    node: str | None = None
    rank: int | None = None
    exit_code: int | None = None
    signal: int | None = None


@dataclass
class Supervisor:
    job_dir: Path
    nodes: list[str]
    nproc_per_node: int
    timeout: float
    launcher: list[str]
    poll: float = 1.0
    liveness_every: float = 3.0
    liveness_misses: int = 2
    ssh_timeout: int = 3
    tag: str = ""
    started: float = field(default_factory=time.time)
    status: dict[str, Any] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.tag = self.tag or str(self.job_dir).rstrip("/") + "/"
        self.me = socket.gethostname()

    # --- status ---------------------------------------------------------------------------------------
    def write_status(self, **fields: Any) -> None:
        self.status.update(fields, elapsed=round(time.time() - self.started, 1), updated=time.time())
        target = self.job_dir / STATUS_FILE
        scratch = target.with_name(f".{STATUS_FILE}.tmp")
        scratch.write_text(json.dumps(self.status, indent=1, sort_keys=True) + "\n")
        os.replace(scratch, target)

    def progress(self) -> Any:
        metrics = self.job_dir / "output" / "metrics.jsonl"
        line = last_line(metrics) if metrics.exists() else last_line(self.rank_log(0))
        if line is None:
            return None
        try:
            return json.loads(line)
        except ValueError:
            return line[-300:]

    # --- logs -----------------------------------------------------------------------------------------
    def rank_log(self, rank: int) -> Path:
        """Per-rank output file that mpirun --output-filename writes (OpenMPI 4.x layout), on this node."""
        return find_mpirun_log(self.job_dir, rank) or mpirun_log(self.job_dir, rank)

    def rank_log_tail(self, rank: int, node: str) -> list[str]:
        """Last lines of a rank's log, which mpirun writes on the rank's own node."""
        if node == self.me:
            return tail(self.rank_log(rank))
        remote = mpirun_log(self.job_dir, rank)
        return self.on_node(node, f"tail -n {TAIL_LINES} {remote} 2>/dev/null").splitlines()

    def node_of(self, rank: int, per_node: int) -> str:
        index = rank // per_node
        return self.nodes[index] if 0 <= index < len(self.nodes) else f"rank {rank}"

    # --- watching -------------------------------------------------------------------------------------
    def probe(self, node: str) -> str:
        """'up', 'slow' or 'down' (see probe_verdict); only 'down' counts towards declaring a node dead."""
        if node == self.me:
            return "up"
        probe = ["ssh", "-o", f"ConnectTimeout={self.ssh_timeout}", "-o", "BatchMode=yes", node, "true"]
        try:
            bound = self.ssh_timeout + 5
            done = subprocess.run(probe, capture_output=True, text=True, timeout=bound, check=False)
        except subprocess.TimeoutExpired:
            return probe_verdict(None, "")
        return probe_verdict(done.returncode, done.stderr)

    def failure_from_log(self, returncode: int) -> Failure:
        text = read_text(self.job_dir / LAUNCHER_LOG)
        # A node's log tells which rank of it failed; with torchrun every mpirun "rank" is a node's agent.
        agents = self.launcher_is_torchrun()
        per_node = 1 if agents else self.nproc_per_node
        if match := TORCHRUN_ROOT.search(text):
            node, rank, code = match.group(1), int(match.group(2)), int(match.group(3))
            failure = Failure("a rank exited with an error", node=node, rank=rank)
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
            rank = int(match.group(1))
            node = self.node_of(rank, per_node)
            failure = Failure(
                "a rank exited with an error", node=node, rank=rank, exit_code=int(match.group(2))
            )
            if agents:  # the mpirun rank is the node's torchrun agent, not a training rank
                failure.rank = None
            return failure
        return Failure(f"the launcher exited with status {returncode}", exit_code=returncode)

    def launcher_is_torchrun(self) -> bool:
        agent = "ddp_cluster.torchrun_agent"
        return agent in self.launcher or any(Path(part).name == "torchrun" for part in self.launcher)

    def run(self) -> int:
        for folder in (self.job_dir, self.job_dir / "output", self.job_dir / "logs"):
            folder.mkdir(parents=True, exist_ok=True)
        self.write_status(state="running", pid=os.getpid(), nodes=self.nodes, launcher=self.launcher)
        with open(self.job_dir / LAUNCHER_LOG, "ab") as log:
            process = subprocess.Popen(
                self.launcher, stdout=log, stderr=subprocess.STDOUT, cwd=self.job_dir, start_new_session=True
            )
        failure: Failure | None = None
        misses = dict.fromkeys(self.nodes, 0)
        next_liveness = time.monotonic() + self.liveness_every
        others = [node for node in self.nodes if node != self.me]
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(others)))) as pool:
            while True:
                returncode = process.poll()
                if returncode is not None:
                    if returncode != 0:
                        failure = self.failure_from_log(returncode)
                        # A dead node makes its peers' collectives fail first: name the cause.
                        lost = [
                            node
                            for node, verdict in zip(others, pool.map(self.probe, others), strict=True)
                            if verdict == "down"
                        ]
                        if lost:
                            failure = Failure(
                                f"node {lost[0]} stopped answering ssh (its container or server is down); "
                                f"then {failure.reason} on {failure.node or 'a node'}",
                                node=lost[0],
                            )
                    break
                if self._stop.is_set():
                    failure = Failure("the job was stopped (the supervisor received a signal)")
                    break
                if time.time() - self.started > self.timeout:
                    failure = Failure(f"the job did not finish within job_timeout={self.timeout:g} s")
                    break
                if others and time.monotonic() >= next_liveness:
                    for node, verdict in zip(others, pool.map(self.probe, others), strict=True):
                        # A slow node neither counts as a miss nor clears the misses of a node going down.
                        if verdict == "up":
                            misses[node] = 0
                        elif verdict == "down":
                            misses[node] += 1
                    lost = [node for node in others if misses[node] >= self.liveness_misses]
                    if lost:
                        failure = Failure(
                            f"node {lost[0]} stopped answering ssh (its container or server is down)",
                            node=lost[0],
                        )
                        break
                    next_liveness = time.monotonic() + self.liveness_every
                self.write_status(progress=self.progress())
                time.sleep(self.poll)
            if failure is None:
                self.write_status(state="succeeded", rc=0, progress=self.progress())
                return 0
            self.stop_everything(process, pool)
            leftover = self.leftover(pool)
            log_node = failure.node if failure.node in self.nodes and failure.rank is not None else self.me
            # mpirun names log files after its own ranks: with torchrun those are the nodes' agents.
            if self.launcher_is_torchrun():
                log_rank = self.nodes.index(log_node)
            else:
                log_rank = failure.rank if failure.rank is not None else 0
            self.write_status(
                state="failed",
                rc=process.returncode,
                reason=failure.reason,
                failed_node=failure.node,
                failed_rank=failure.rank,
                exit_code=failure.exit_code,
                signal=failure.signal,
                signal_name=signal_name(failure.signal),
                log_file=f"{log_node}:{mpirun_log(self.job_dir, log_rank)}",
                log_tail=self.rank_log_tail(log_rank, log_node) or tail(self.job_dir / LAUNCHER_LOG),
                launcher_tail=tail(self.job_dir / LAUNCHER_LOG),
                leftover=leftover,
                progress=self.progress(),
            )
            return 1

    # --- stopping -------------------------------------------------------------------------------------
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


def probe_verdict(returncode: int | None, stderr: str) -> str:
    """A liveness probe's outcome: 'up' (logged in), 'slow' (the node's TCP stack answered but sshd did not
    finish in time, or ssh ran past its bound after connecting: alive), 'down' (refused, no route, a name that
    no longer resolves, no TCP answer at all: the container or the server is gone)."""
    if returncode == 0:
        return "up"
    if returncode is None or SSH_SLOW.search(stderr):
        return "slow"
    return "down"


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


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m ddp_cluster.supervise", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--job-dir", type=Path, required=True, help="the job's directory on this node")
    parser.add_argument("--nodes", required=True, help="the job's nodes, comma-separated, this one first")
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--timeout", type=float, required=True, help="seconds the job may run")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between status updates")
    parser.add_argument(
        "--liveness-every", type=float, default=3.0, help="seconds between ssh probes of nodes"
    )
    parser.add_argument("--tag", default="", help="text in every rank's command line (default: JOB_DIR/)")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout={args.timeout} must be positive")
    launch_file = args.job_dir / "launch.json"
    try:
        launch = json.loads(launch_file.read_text())
    except (OSError, ValueError) as error:
        parser.error(f"cannot read the launch from {launch_file}: {error}")
    launcher = launch.get("argv") if isinstance(launch, dict) else None
    files = launch.get("files", {}) if isinstance(launch, dict) else None
    if not (isinstance(launcher, list) and launcher and all(isinstance(part, str) for part in launcher)):
        parser.error(f"{launch_file}: 'argv' must be a non-empty list of strings")
    if not (
        isinstance(files, dict)
        and all(isinstance(text, str) and "/" not in name for name, text in files.items())
    ):
        parser.error(f"{launch_file}: 'files' must map plain file names to their text")
    for name, text in files.items():
        (args.job_dir / name).write_text(text)
    return args, launcher


def main(argv: Sequence[str] | None = None) -> int:
    args, launcher = parse_args(list(sys.argv[1:] if argv is None else argv))
    supervisor = Supervisor(
        job_dir=args.job_dir,
        nodes=[node for node in args.nodes.split(",") if node],
        nproc_per_node=args.nproc_per_node,
        timeout=args.timeout,
        launcher=launcher,
        poll=args.poll,
        liveness_every=args.liveness_every,
        tag=args.tag,
    )
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: supervisor._stop.set())
    return supervisor.run()


if __name__ == "__main__":
    raise SystemExit(main())
