"""``python -m ddp_cluster.gate``: the health gate, on every rank (:mod:`ddp_cluster.health.gate`)."""

from ddp_cluster.health.gate import main
from ddp_cluster.runtime.finish import exit_process

__all__ = ["main"]

if __name__ == "__main__":
    exit_process(main())  # no interpreter finalization after the collectives (see ddp_cluster.runtime.finish)
