"""How a rank's process ends: its atexit handlers, its streams flushed, then ``os._exit``, without the
interpreter's finalization.

Seen here (torch 2.13, gloo, 4 local nodes, bench/bench_health.py): after every rank had finished, passed the
final barrier and destroyed the process group, one rank still died of SIGABRT during interpreter finalization
("terminate called without an active exception": a C++ thread of the collectives' runtime torn down with the
interpreter), and mpirun failed the job that had trained. The same was seen with a user's own script run
unmodified by ``ddp_cluster.runtime.run`` (tests/projects/tiny, 2 nodes, rank 1, after its barrier and
``destroy_process_group``). Ending with ``os._exit`` once the work is done and written skips that teardown;
what a normal exit does first still happens: the program's other (non-daemon) threads are waited for, atexit
handlers (logging's flush, ``weakref.finalize``, multiprocessing's cleanup) run, and the streams are flushed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def join_other_threads() -> None:
    """Wait for the threads a normal exit waits for: every non-daemon thread but this one."""
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon and thread.is_alive():
            thread.join()


def exit_process(code: int) -> NoReturn:
    try:
        join_other_threads()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
