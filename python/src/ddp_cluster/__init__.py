"""ddp_cluster: multi-node PyTorch DDP on Ascend NPU, NVIDIA GPU and CPU clusters.

The package is grouped by where its code runs, which says what each part may import (import-linter holds it,
``.importlinter`` at the repository's root):

    errors, files, text     the base: one error class tree, atomic writes, what may reach a terminal
    cli                     ``ddp-cluster SUBCOMMAND``
    accelerators/           cpu, gpu, npu: device kind, backend, visible-devices variable, topology (no torch)
    ascend/                 device-IP plans, rank tables, hccn_tool (``hccn`` ships to servers: stdlib, 3.8)
    image/                  the node image (controller): base image, its probe, where it is built, its tag,
                            the base's pull, the distribution (``distribute`` also ships as module_utils)
    inventory/              the controller's reading of the inventory; the lock of one site.yml at a time
    server/                 a server's own Python (stdlib, 3.8): shipped as the roles' module_utils
    job/                    the controller's job: request, spec, plan, bundle, lifecycle, status, results
    supervisor/             the job's supervisor, its standby: launcher, liveness, checkpoint copies
    runtime/                every rank (torch): training loop, config, dist env, device, checkpoints, data
    health/                 the health gate: rank side (torch) and the controller's judgement

Importing the package needs no torch: only ``runtime`` and ``health.gate`` (and what they import) do.
``python -m ddp_cluster.train``, ``.run``, ``.gate`` and ``.supervise`` are the documented entry points;
``ddp_cluster.heartbeat()`` (:mod:`ddp_cluster.runtime.heartbeat`, no torch) is a rank's sign of progress for
the job's watchdog, imported on first use. :mod:`ddp_cluster.checkpoint` (torch on first use) saves and loads
a user's own script's checkpoints where the job's recovery finds them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddp_cluster.runtime.heartbeat import heartbeat

__version__ = "0.1.0"
__all__ = ["__version__", "heartbeat"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the package's import stays free of the ranks' code.
    if name == "heartbeat":
        from ddp_cluster.runtime.heartbeat import heartbeat

        return heartbeat
    raise AttributeError(f"module 'ddp_cluster' has no attribute {name!r}")
