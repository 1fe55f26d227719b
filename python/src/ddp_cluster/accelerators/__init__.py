"""Accelerator kinds: one module per kind (``cpu``, ``gpu``, ``npu``), each declaring one
:class:`~ddp_cluster.accelerators.base.Accelerator`, and this registry of them.

A kind's module owns every fact about it: the torch device type, the collective backends, the
visible-devices variables, the container runtime and device files, the topology tool and its reader, the
processes per node its collective library accepts, and the roles that prepare and check its servers.
The roles read the facts through the ``ddp_accelerator`` filter (``plugins/filter/ddp_accelerator.py``),
the job and the ranks through :func:`get` and :func:`by_device`. Adding a kind is a module here, its host role
and docs (``docs/add-an-accelerator.md``).

Runs anywhere (controller, node, rank) with no torch: imports only the base modules (errors, files).
"""

from __future__ import annotations

from ddp_cluster.accelerators.base import Accelerator, TopologyError, UnknownAccelerator
from ddp_cluster.accelerators.cpu import CPU
from ddp_cluster.accelerators.gpu import GPU
from ddp_cluster.accelerators.npu import NPU

# Every kind, in the order the documentation and preflight's messages list them.
REGISTRY: dict[str, Accelerator] = {kind.name: kind for kind in (CPU, NPU, GPU)}
# The accelerator kinds an inventory names (cluster_accelerator), in name order.
ACCELERATORS = tuple(sorted(REGISTRY))
# The collective backend that goes with each torch device type, by device name.
DEVICE_BACKEND = {
    kind.device: kind.backend for kind in sorted(REGISTRY.values(), key=lambda kind: kind.device)
}

__all__ = [
    "ACCELERATORS",
    "DEVICE_BACKEND",
    "REGISTRY",
    "Accelerator",
    "TopologyError",
    "UnknownAccelerator",
    "by_device",
    "get",
]


def get(name: str) -> Accelerator:
    """The kind ``name`` (cluster_accelerator); UnknownAccelerator naming the kinds there are."""
    try:
        return REGISTRY[str(name)]
    except KeyError:
        raise UnknownAccelerator(f"accelerator {name!r} is unknown: use {', '.join(REGISTRY)}") from None


def by_device(device: str) -> Accelerator:
    """The kind whose torch device type is ``device`` (cpu, cuda, npu); UnknownAccelerator otherwise."""
    for kind in REGISTRY.values():
        if kind.device == device:
            return kind
    raise UnknownAccelerator(f"device {device!r} is unknown: use {', '.join(sorted(DEVICE_BACKEND))}")
