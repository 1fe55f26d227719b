"""How a rank's process ends: its atexit handlers, its streams flushed, then ``os._exit``, without the
interpreter's finalization.

Seen here (torch 2.13, gloo, 4 local nodes, bench/bench_health.py): after every rank had finished, passed the
final barrier and destroyed the process group, one rank still died of SIGABRT during interpreter finalization
("terminate called without an active exception": a C++ thread of the collectives' runtime torn down with the
interpreter), and mpirun failed the job that had trained. Ending with ``os._exit`` once the work is done and
written skips that teardown; atexit handlers (logging's flush among them) still run first.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn


def exit_process(code: int) -> NoReturn:
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
