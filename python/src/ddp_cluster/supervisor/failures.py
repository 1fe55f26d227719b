"""What failed in a job, from what the supervisor can read: the launcher's output, the ranks' logs.

:func:`launcher_failure` reads mpirun's or torchrun's output (real OpenMPI 4.1 and torchrun output in the
tests); :func:`restart_cause` says whether a restart could cure a failure (a node gone, a rank killed, a
collective or the store timed out: the doctor's verdict on the attempt's logs; a stall, which the progress
watchdog found; a device fault, which the telemetry found), and :func:`users_error` tells the program's own
Python error from the collectives' lost peers. The log readers here read the end of a file only, however
large it grew.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddp_cluster.job import doctor
from ddp_cluster.job.spec import JobSpec
from ddp_cluster.supervisor.stall import STALL

TAIL_LINES = 20
# mpirun, when a rank exits non-zero / dies of a signal; torchrun's "Root Cause" block.
MPI_EXIT = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]\s*\n\s*Exit code:\s*(-?\d+)")
MPI_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
TORCHRUN_ROOT = re.compile(r"host\s*:\s*(\S+)\s*\n\s*rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")
# The doctor's verdicts that a restart can cure (a peer vanished, a collective or the store timed out): not a
# Python error in the user's code, not the job's own time bound, not a stop: the rules say which
# (doctor_rules.json's ``restartable``, read as ``Signature.restartable``).
# Of those, a mere lost connection: it follows a rank that exited first, so alone it restarts nothing.
LOST_CONNECTION = ("gloo-connection", "gloo-full-mesh", "mpi-daemon-lost", "nccl-ib-error", "store-refused")
# A Python exception's last line in a rank's log ("[rank1]: ZeroDivisionError: ..."), and the ones that are
# the collectives' (a peer or the store gone) or the launcher's (torchrun's agent stopped by mpirun's SIGTERM
# when another node failed: SignalException): those a restart may cure.
EXCEPTION = re.compile(r"^(?:\[(?:rank|default)\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception))(?::\s*(.*))?$")
COLLECTIVE = re.compile(r"(?:Dist(?:Backend|Network|Store)?Error|ChildFailedError|SignalException)$")
COLLECTIVE_TEXT = re.compile(r"gloo|nccl|hccl|connection|timed out|timeout|peer|socket|store", re.IGNORECASE)
# The cause of a failure the telemetry found: a device of a node turned bad (supervisor.telemetry). A restart
# may cure it, without that node (drained).
DEVICE_FAULT = "device-fault"


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
    cause: str | None = None  # what the supervisor itself found: STALL (the watchdog), DEVICE_FAULT
    device: int | None = None  # DEVICE_FAULT: the device's index on ``node``
    graceful: bool = False  # a stop or the time bound: every rank gets the job's stop_grace after SIGTERM


def lost_nodes(lost: Sequence[str], then: str = "") -> Failure:
    """Nodes that stopped answering ssh, named by the first; ``then``: what failed after (their peers')."""
    reason = f"node {lost[0]} stopped answering ssh (its container or server is down)"
    return Failure(f"{reason}; then {then}" if then else reason, node=lost[0], lost=tuple(lost))


def device_fault(node: str, device: int, problem: str) -> Failure:
    """A device of ``node`` turned bad during the job (the telemetry's finding): the attempt ends, naming
    both."""
    return Failure(
        f"{DEVICE_FAULT}: node {node} device {device}: {problem}",
        node=node,
        device=device,
        cause=DEVICE_FAULT,
    )


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


def restart_cause(failure: Failure, logs: Sequence[str]) -> str | None:
    """Why a restart could cure ``failure``, given the attempt's ``logs`` (the launcher's, the ranks'), or
    None (the user's code failed, the time bound, a stop)."""
    if not failure.restartable:
        return None
    if failure.cause == DEVICE_FAULT:
        return failure.reason
    if failure.cause == STALL:
        return failure.reason if "stall" in failure.reason else f"the job stalled: {failure.reason}"
    if failure.lost:
        return f"node {', '.join(failure.lost)} stopped answering"
    if failure.signal is not None:
        where = f"rank {failure.rank} on {failure.node}" if failure.rank is not None else failure.node
        return f"{where or 'a rank'} was killed by {signal_name(failure.signal)}"
    found: dict[str, doctor.Finding] = {}
    for number, text in enumerate(logs):
        doctor.match_lines(str(number), text.splitlines(), found)
    if any(users_error(text) for text in logs):
        return None  # a Python error of the program: its peers' lost connections follow from it
    # The most likely verdict, if curable; else a timeout found anywhere (a rank's non-zero exit follows
    # one), but not a mere lost connection (it follows a rank that exited first).
    ranked = sorted(found.values(), key=lambda item: -item.signature.weight)
    if ranked and ranked[0].signature.restartable:
        return ranked[0].cause
    timeouts = [
        item for item in ranked if item.signature.restartable and item.signature.id not in LOST_CONNECTION
    ]
    return timeouts[0].cause if timeouts else None


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


def signal_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def last_line(path: Path) -> str | None:
    lines = tail(path, 1)
    return lines[0] if lines else None


def tail(path: Path, count: int = TAIL_LINES) -> list[str]:
    text = read_text(path, limit=64 * 1024)
    # lines end at a newline only: a "\r" (or another break splitlines takes) stays inside its line, shown
    # written out where it is printed, so a rank cannot forge a line of its own under another's prefix
    lines = (line.removesuffix("\r") for line in text.split("\n"))
    return [line for line in lines if line.strip()][-count:]


def read_text(path: Path, limit: int = 1024 * 1024) -> str:
    """The last ``limit`` bytes of a file, as text ('' when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
