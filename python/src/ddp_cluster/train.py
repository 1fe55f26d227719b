"""``python -m ddp_cluster.train``: the DDP training entrypoint (:mod:`ddp_cluster.runtime.train`)."""

import sys

try:
    from ddp_cluster.runtime.train import main
except ImportError as missing:  # a machine without torch (the controller): one line, not a traceback
    if __name__ != "__main__":
        raise
    print(
        f"python -m ddp_cluster.train: {missing}; its options are in docs/jobs.md"
        " (Training: python -m ddp_cluster.train)",
        file=sys.stderr,
    )
    raise SystemExit(1) from None

from ddp_cluster.runtime.finish import exit_process

__all__ = ["main"]

if __name__ == "__main__":
    exit_process(main())  # no interpreter finalization after the collectives (see ddp_cluster.runtime.finish)
