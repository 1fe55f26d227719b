"""Run a torchrun-style script under mpirun or srun: ``python -m ddp_cluster.run SCRIPT [ARGS...]``.

The distributed environment is resolved from OpenMPI or Slurm variables (see :mod:`ddp_cluster.distenv`), the
variables torchrun would have set (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
MASTER_PORT) are exported, and SCRIPT runs in this same process as ``__main__`` with ``sys.argv`` set, so an
unmodified script that calls ``init_process_group("env://")`` just works. ``-m MODULE`` runs a module instead.
When ``DDP_DEVICE`` names an accelerator (train.yml exports the cluster's), the rank checks first that it can
use it and stops naming its node, rank and the reason when it cannot. Under torchrun the variables are
torchrun's own.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

from ddp_cluster.distenv import resolve_dist_env
from ddp_cluster.errors import DdpClusterError, DeviceError

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
    # torch_npu 2.5.1 and later registers itself for torch's backend autoload: where it cannot load (a
    # driver library missing), `import torch` itself fails without a word of why. On npu, torch is imported
    # here without the autoload and the device check imports torch_npu itself, naming what stops it; the
    # setting is put back after that import (torch_npu's own import turns it off and only its autoload hook
    # turns it on again), so the script and the processes it starts see the value the rank was given.
    autoload = environ.get(TORCH_AUTOLOAD)
    if device == "npu":
        environ[TORCH_AUTOLOAD] = "0"
    try:
        from ddp_cluster.device import require_device, where  # torch is needed from here on

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
        print(USAGE + "\n\n" + (__doc__ or "").strip())
        return 0 if args else 2
    as_module = args[0] == "-m"
    if as_module and len(args) < 2:
        print(f"ddp_cluster.run: -m needs a module name\n{USAGE}", file=sys.stderr)
        return 2
    target, script_args = (args[1], args[2:]) if as_module else (args[0], args[1:])
    if not as_module and not Path(target).is_file():
        print(f"ddp_cluster.run: error: script {target!r} not found (cwd {os.getcwd()})", file=sys.stderr)
        return 2
    try:
        export_torchrun_variables()
        check_job_device()
    except DdpClusterError as error:
        print(f"ddp_cluster.run: error: {error}", file=sys.stderr)
        return 2
    if as_module:
        sys.argv = [target, *script_args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *script_args]
        # As ``python SCRIPT`` does: the script's directory comes first on the import path.
        sys.path.insert(0, str(Path(target).resolve().parent))
        runpy.run_path(target, run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
