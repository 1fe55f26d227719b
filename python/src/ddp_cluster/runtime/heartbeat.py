"""A rank's signs of progress for the supervisor's watchdog, and its stack dump on demand. Standard library
only: ``import ddp_cluster; ddp_cluster.heartbeat()`` needs no torch.

With ``-e stall_timeout=SECONDS`` the supervisor stops a job that makes no progress for that long: no new line
in any rank's log, no new step in the entrypoint's metrics, no heartbeat. A script that prints rarely (a long
evaluation, a step that takes minutes) calls :func:`heartbeat` as often as it likes; it touches
``$DDP_JOB_DIR/heartbeat/rank.<RANK>`` at most once a second. Outside a job (no ``DDP_JOB_DIR``) it does
nothing.

When the watchdog fires it sends SIGUSR2 to every rank. :func:`install_stack_dump`, called early by the
entrypoint and by ``ddp_cluster.run`` (so by every rank of a job, torchrun's workers too), makes that signal
append the Python stacks of every thread to ``JOB/stacks/rank.<R>.txt`` (``faulthandler``), and writes
``JOB/stacks/rank.<R>.pid``: ``PID START MAIN_THREAD``, the process's start time (``/proc/PID/stat``) so that
a reused pid is never signalled, and the main thread's id, which names its stack in the dump.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

JOB_DIR_VARIABLE = "DDP_JOB_DIR"
HEARTBEAT_DIR = "heartbeat"  # the supervisor's liveness reads the same folder name
STACKS_DIR = "stacks"
STACK_SIGNAL = signal.SIGUSR2
HEARTBEAT_EVERY = 1.0  # seconds: the supervisor's checks are seconds apart, a touch per step would be waste
# The launchers' rank variables, in the order distenv reads them; a job's process has one of them.
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")

_last_beat: float | None = None  # monotonic time of the last call that touched (or had no job)
_beat_path: Path | None = None
_beat_failed = False
# faulthandler writes to this file's descriptor: it stays open for the process's life.
_stack_file: TextIO | None = None


def job_rank(environ: Mapping[str, str]) -> str:
    """This process's global rank as the launcher set it ('0' for a lone process)."""
    for name in RANK_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return value
    return "0"


def heartbeat() -> None:
    """Tell the job's progress watchdog (``-e stall_timeout=SECONDS``) that this rank is making progress.

    Call it from a loop that prints rarely, as often as you like (every step is fine: the file is touched at
    most once a second, a call in between costs a clock read). Any rank's heartbeat counts as the job's
    progress, as does a new line in any rank's output. Outside a job started by train.yml (no
    ``DDP_JOB_DIR``) it does nothing; it never raises (a failed touch is reported once on stderr).
    """
    global _last_beat, _beat_path, _beat_failed
    now = time.monotonic()
    if _last_beat is not None and now - _last_beat < HEARTBEAT_EVERY:
        return
    _last_beat = now
    job_dir = os.environ.get(JOB_DIR_VARIABLE)
    if not job_dir:
        return
    path = Path(job_dir) / HEARTBEAT_DIR / f"rank.{job_rank(os.environ)}"
    try:
        if path != _beat_path:
            path.parent.mkdir(parents=True, exist_ok=True)
            _beat_path = path
        with open(path, "a"):
            pass
        os.utime(path)  # opening for append leaves an existing file's time as it was
    except OSError as error:
        if not _beat_failed:
            _beat_failed = True
            print(f"ddp_cluster.heartbeat: cannot touch {path}: {error}", file=sys.stderr, flush=True)


def process_start_time(pid: int | str = "self") -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), '-' where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "-"
    # Field 2, the command's name in parentheses, may hold spaces: count from the last ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else "-"


def install_stack_dump(
    rank: int | str | None = None, environ: Mapping[str, str] | None = None
) -> Path | None:
    """Inside a job (``DDP_JOB_DIR`` set): make SIGUSR2 append every thread's Python stack to
    ``JOB/stacks/rank.<rank>.txt`` and write ``JOB/stacks/rank.<rank>.pid``; returns the dump's path.
    ``rank``: the global rank (default: the launcher's variable). Outside a job: nothing, None."""
    global _stack_file
    environ = os.environ if environ is None else environ
    job_dir = environ.get(JOB_DIR_VARIABLE)
    if not job_dir:
        return None
    rank = job_rank(environ) if rank is None else str(rank)
    folder = Path(job_dir) / STACKS_DIR
    dump = folder / f"rank.{rank}.txt"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(dump, "a")  # noqa: SIM115  # open for the process's life: the signal writes to it
        faulthandler.register(STACK_SIGNAL, file=handle, all_threads=True)
        main_thread = threading.main_thread().ident or 0
        pid_file = folder / f"rank.{rank}.pid"
        temporary = pid_file.with_name(f".{pid_file.name}.{os.getpid()}")
        temporary.write_text(f"{os.getpid()} {process_start_time()} {main_thread:#x}\n")
        os.replace(temporary, pid_file)  # the supervisor never reads half a line
    except OSError as error:  # a rank trains without it rather than not at all
        print(f"ddp_cluster: no stack dump on SIGUSR2 ({dump}: {error})", file=sys.stderr, flush=True)
        return None
    if _stack_file is not None and _stack_file is not handle:
        _stack_file.close()
    _stack_file = handle
    return dump
