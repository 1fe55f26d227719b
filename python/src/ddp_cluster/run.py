"""``python -m ddp_cluster.run``: a torchrun-style script under mpirun or srun
(:mod:`ddp_cluster.runtime.run`)."""

from ddp_cluster.runtime.finish import exit_process
from ddp_cluster.runtime.run import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_process(main())  # no interpreter finalization after the collectives (see ddp_cluster.runtime.finish)
