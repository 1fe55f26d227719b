"""Filters of the CPU binding: which CPUs sit next to each accelerator, from the vendor's topology tool."""

from __future__ import annotations

import site
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster import accelerators
from ddp_cluster.accelerators import topology


def ddp_cpu_binding(stdout: Any, accelerator: Any) -> str:
    """The binding line (``0=144-167;1=144-167``) from what the accelerator's topology tool printed (its
    module's ``topology_argv``: ``npu-smi info -t topo`` for 'npu', ``nvidia-smi topo -m`` for 'gpu')."""
    kind = accelerators.REGISTRY.get(str(accelerator))
    if kind is None or kind.affinity is None:
        kinds = accelerators.REGISTRY.values()
        tools = [f"{known.name}: {known.topology_tool}" for known in kinds if known.affinity]
        raise AnsibleFilterError(
            f"ddp_cpu_binding: accelerator {str(accelerator)!r} has no topology tool ({', '.join(tools)})"
        )
    try:
        return topology.binding_text(kind.cpu_affinity(str(stdout or "")))
    except topology.TopologyError as error:
        raise AnsibleFilterError(str(error)) from error


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"ddp_cpu_binding": ddp_cpu_binding}
