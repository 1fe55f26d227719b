"""A rank bound to the CPUs of its device's NUMA node, from the binding line node.env carries
(``DDP_CPU_BINDING``, :mod:`ddp_cluster.accelerators.topology`) and its kind's visible-devices variable."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ddp_cluster.accelerators import REGISTRY
from ddp_cluster.accelerators.topology import (
    TopologyError,
    format_cpu_list,
    parse_binding_text,
    rank_cpus,
    rank_device,
)
from ddp_cluster.errors import DeviceError

BINDING_VARIABLE = "DDP_CPU_BINDING"
UNBOUND = "set cluster_cpu_binding: none to run unbound"


def bind_rank(local_rank: int, environ: Mapping[str, str] | None = None) -> str | None:
    """Bind this process to the CPUs of its device's NUMA node: ``DDP_CPU_BINDING`` (device=cpus;..., written
    into node.env from the vendor's topology where cluster_cpu_binding is numa), the device being the
    local_rank-th visible one. Returns what was done, for the rank's log (None: no binding asked for);
    DeviceError naming the device and the CPUs when it cannot be done."""
    environ = os.environ if environ is None else environ
    text = environ.get(BINDING_VARIABLE, "").strip()
    if not text:
        return None
    # The cluster's kind (DDP_ACCELERATOR in node.env) says which variable lists the rank's devices.
    kind = REGISTRY.get(environ.get("DDP_ACCELERATOR", ""))
    visible_name = kind.visible_variable if kind is not None else ""
    try:
        device = rank_device(local_rank, environ.get(visible_name) if visible_name else None)
    except TopologyError as error:
        raise DeviceError(f"{BINDING_VARIABLE}: {error}; {UNBOUND}") from None
    allowed = set(os.sched_getaffinity(0))
    try:
        cpus = rank_cpus(parse_binding_text(text), device, allowed)
    except TopologyError as error:
        raise DeviceError(f"{BINDING_VARIABLE}: {error}; {UNBOUND}") from None
    os.sched_setaffinity(0, cpus)
    return (
        f"local rank {local_rank} on device {device}: bound to CPUs {format_cpu_list(cpus)}"
        f" ({BINDING_VARIABLE})"
    )


def announce_binding(local_rank: int, who: str) -> None:
    """:func:`bind_rank`, and the line that says so in the rank's log, after ``who`` (where the rank is)."""
    said = bind_rank(local_rank)
    if said:
        print(f"{who}: {said}", flush=True)
