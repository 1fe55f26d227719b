"""One torchrun agent per node under mpirun: ``python -m ddp_cluster.torchrun_agent TORCHRUN_ARGS...``.

train.yml fans torchrun out with mpirun (one slot per node), so that one failing node makes mpirun stop the
agents of all the others. This sets ``--node-rank`` from the node's mpirun rank and becomes torchrun.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence

from ddp_cluster.errors import DistEnvError

NODE_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_NODEID")


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


def torchrun_argv(argv: Sequence[str], environ: dict[str, str] | os._Environ[str]) -> list[str]:
    if any(arg == "--node-rank" or arg.startswith(("--node-rank=", "--node_rank")) for arg in argv):
        raise DistEnvError("do not pass --node-rank: it comes from the node's mpirun rank")
    torchrun = shutil.which("torchrun") or "torchrun"
    return [torchrun, f"--node-rank={node_rank(environ)}", *argv]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        command = torchrun_argv(list(sys.argv[1:] if argv is None else argv), os.environ)
    except DistEnvError as error:
        print(f"ddp_cluster.torchrun_agent: {error}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execv(command[0], command)


if __name__ == "__main__":
    raise SystemExit(main())
