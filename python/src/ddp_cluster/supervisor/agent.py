"""One torchrun agent per node under mpirun: ``python -m ddp_cluster.supervisor.agent [--runner R] ARGS...``.

train.yml fans torchrun out with mpirun (one slot per node), so that one failing node makes mpirun stop the
agents of all the others. This sets ``--node-rank`` from the node's mpirun rank and becomes the runner:

- ``torchrun`` (default): ``python -m torch.distributed.run``, with the interpreter that runs this module, so
  it works where torch lives only in the base image's interpreter (CANN images), with no ``torchrun`` on PATH;
- ``torch_npu_run``: ``python -m torch_npu.distributed.run``, torch_npu's launcher for large Ascend clusters
  (the Ascend multi-node checklist): torchrun's arguments, with its "parallel" rendezvous (faster link
  set-up). Ranks under it join with ``init_method="parallel://MASTER_ADDR:MASTER_PORT"``, as the vendor
  documents (``ddp_cluster.runtime.train`` does).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ddp_cluster.errors import DistEnvError

NODE_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_NODEID")
RUNNERS = {"torchrun": "torch.distributed.run", "torch_npu_run": "torch_npu.distributed.run"}
STORE_FRONT = "ddp_cluster.runtime.store"  # run by module name: supervisor/ imports nothing of runtime/


def node_rank(environ: dict[str, str] | os._Environ[str]) -> int:
    for name in NODE_RANK_VARIABLES:
        value = environ.get(name)
        if value is None:
            continue
        if not value.isdigit():
            raise DistEnvError(f"{name}={value!r} is not a node rank (a whole number of 0 or more)")
        return int(value)
    raise DistEnvError(
        f"no node rank: none of {', '.join(NODE_RANK_VARIABLES)} is set; start this under mpirun "
        "with one slot per node (train.yml -e launcher=torchrun does that)"
    )


def split_runner(argv: Sequence[str]) -> tuple[str, list[str]]:
    """``--runner NAME`` (or ``--runner=NAME``) in front of torchrun's arguments, else torchrun."""
    args = list(argv)
    runner = "torchrun"
    if args and args[0].startswith("--runner"):
        if args[0] == "--runner":
            if len(args) < 2:
                raise DistEnvError(f"--runner needs a value: {' or '.join(RUNNERS)}")
            runner, args = args[1], args[2:]
        else:
            runner, args = args[0].split("=", 1)[1], args[1:]
    if runner not in RUNNERS:
        raise DistEnvError(f"--runner {runner!r} is not one of {', '.join(RUNNERS)}")
    return runner, args


def torchrun_argv(
    argv: Sequence[str], environ: dict[str, str] | os._Environ[str], python: str | None = None
) -> list[str]:
    runner, args = split_runner(argv)
    if any(arg == "--node-rank" or arg.startswith(("--node-rank=", "--node_rank")) for arg in args):
        raise DistEnvError("do not pass --node-rank: it comes from the node's mpirun rank")
    # Through ddp_cluster.runtime.store, which binds torchrun's store (node 0's agent) to --master-addr only
    # before it runs the launcher in the same process; torch_npu_run's it runs as it is.
    front = [python or sys.executable, "-m", STORE_FRONT, RUNNERS[runner]]
    return [*front, f"--node-rank={node_rank(environ)}", *args]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        command = torchrun_argv(list(sys.argv[1:] if argv is None else argv), os.environ)
    except DistEnvError as error:
        print(f"ddp_cluster.supervisor.agent: {error}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execv(command[0], command)


if __name__ == "__main__":
    raise SystemExit(main())
