"""``python -m ddp_cluster.supervise``: the job supervisor, on the first node
(:mod:`ddp_cluster.supervisor.loop`)."""

from ddp_cluster.supervisor.loop import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
