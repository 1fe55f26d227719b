"""``python -m ddp_cluster.train``: the DDP training entrypoint (:mod:`ddp_cluster.runtime.train`)."""

from ddp_cluster.runtime.finish import exit_process
from ddp_cluster.runtime.train import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_process(main())  # no interpreter finalization after the collectives (see ddp_cluster.runtime.finish)
