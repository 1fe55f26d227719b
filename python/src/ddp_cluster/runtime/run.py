"""Run a torchrun-style script under mpirun or srun: ``python -m ddp_cluster.run SCRIPT [ARGS...]``.

The distributed environment is resolved from OpenMPI or Slurm variables (see
:mod:`ddp_cluster.runtime.distenv`), the
variables torchrun would have set (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
MASTER_PORT) are exported, and SCRIPT runs in this same process as ``__main__`` with ``sys.argv`` set, so an
unmodified script that calls ``init_process_group("env://")`` just works. ``-m MODULE`` runs a module instead.
When ``DDP_DEVICE`` names an accelerator (train.yml exports the cluster's), the rank checks first that it can
use it and stops naming its node, rank and the reason when it cannot. Under torchrun the variables are
torchrun's own. Inside a job, SIGUSR2 dumps the rank's Python stacks into ``JOB/stacks/`` (the progress
watchdog's: :mod:`ddp_cluster.runtime.heartbeat`). The job's secrets (``JOB/secrets.json``) are put into the
environment first (:mod:`ddp_cluster.runtime.secrets`).

When the script ends (returns, calls ``sys.exit``, or raises: its traceback printed as Python prints it,
status 1; a KeyboardInterrupt is left to the interpreter), the process ends as
``ddp_cluster.runtime.finish`` says:
other threads waited for, atexit handlers run, streams flushed, then ``os._exit`` with the script's status,
without the interpreter's finalization that killed a finished rank by SIGABRT under torch 2.13 and gloo.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

from ddp_cluster import accelerators
from ddp_cluster.accelerators.binding import announce_binding
from ddp_cluster.errors import DdpClusterError, DeviceError
from ddp_cluster.runtime.distenv import resolve_dist_env
from ddp_cluster.runtime.finish import exit_process
from ddp_cluster.runtime.heartbeat import install_stack_dump
from ddp_cluster.runtime.secrets import load_secrets
from ddp_cluster.runtime.store import rank_store
from ddp_cluster.text import plain

USAGE = "usage: python -m ddp_cluster.run SCRIPT [ARGS...] | -m MODULE [ARGS...]"


def export_torchrun_variables() -> dict[str, str]:
    """Resolve this process's place in the job and export it the way torchrun does; returns what was set."""
    variables = resolve_dist_env().torchrun_variables()
    os.environ.update(variables)
    return variables


TORCH_AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def check_job_device() -> None:
    """When the job names its device (DDP_DEVICE, exported by train.yml), check that this rank can use it
    before the script runs: a rank that cannot fails naming its node, its rank and the reason, instead of
    a script quietly training on cpu. Imports torch only for an accelerator."""
    environ = os.environ
    device = environ.get("DDP_DEVICE", "").strip()
    if device in ("", "cpu", "auto"):
        return
    # A device adapter (torch_npu 2.5.1 and later) registers itself for torch's backend autoload: where it
    # cannot load (a driver library missing), `import torch` itself fails without a word of why. For a kind
    # with an adapter, torch is imported here without the autoload and the device check imports the adapter
    # itself, naming what stops it; the setting is put back after that import (torch_npu's own import turns it
    # off and only its autoload hook turns it on again), so the script and the processes it starts see the
    # value the rank was given.
    autoload = environ.get(TORCH_AUTOLOAD)
    if device in accelerators.DEVICE_BACKEND and accelerators.by_device(device).adapter:
        environ[TORCH_AUTOLOAD] = "0"
    try:
        from ddp_cluster.runtime.device import require_device, where  # torch is needed from here on

        env = resolve_dist_env()
        try:
            require_device(device, env)
        except DdpClusterError as error:
            raise DeviceError(
                f"{where(env)}: the job's device is {device} (DDP_DEVICE) but {error}"
            ) from error
    finally:
        if autoload is None:
            environ.pop(TORCH_AUTOLOAD, None)
        else:
            environ[TORCH_AUTOLOAD] = autoload


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + plain(__doc__).strip())
        return 0 if args else 2
    as_module = args[0] == "-m"
    if as_module and len(args) < 2:
        print(f"ddp_cluster.run: -m needs a module name\n{USAGE}", file=sys.stderr)
        return 2
    target, script_args = (args[1], args[2:]) if as_module else (args[0], args[1:])
    if not as_module and not Path(target).is_file():
        print(
            f"ddp_cluster.run: error: script {target!r} not found (cwd {os.getcwd()})",
            file=sys.stderr,
        )
        return 2
    try:
        load_secrets()  # before the script, the device check and anything that reads the environment
        variables = export_torchrun_variables()
        install_stack_dump(variables["RANK"])  # before the device check and the script: both may hang
        announce_binding(int(variables["LOCAL_RANK"]), f"ddp_cluster.run: rank {variables['RANK']}")
        check_job_device()
        # Rank 0 of an mpirun job: the rendezvous store on MASTER_ADDR:MASTER_PORT only, which the script's
        # init_process_group then uses (ddp_cluster.runtime.store); kept while the script runs.
        store = rank_store(resolve_dist_env())
    except DdpClusterError as error:
        print(f"ddp_cluster.run: error: {error}", file=sys.stderr)
        return 2
    sys.argv = [target, *script_args]
    if not as_module:
        # As ``python SCRIPT`` does: the script's directory comes first on the import path.
        sys.path.insert(0, str(Path(target).resolve().parent))
    try:
        return run_script(target, as_module)
    finally:
        del store


def run_script(target: str, as_module: bool) -> int:
    """Run the script as ``__main__`` and return the status ``python SCRIPT`` would have exited with."""
    try:
        if as_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as stop:
        return exit_status(stop.code)
    except Exception:  # printed as the interpreter prints an uncaught exception
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def exit_status(code: object) -> int:
    """``sys.exit(code)``'s status, as the interpreter computes it: None is 0, an int is itself, anything else
    is printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    exit_process(main())  # no interpreter finalization after the collectives (see ddp_cluster.runtime.finish)
