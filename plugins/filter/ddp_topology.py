"""Filters of the CPU binding: which CPUs sit next to each accelerator, from the vendor's topology tool."""

from __future__ import annotations

import site
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.accelerators import topology

READERS = {"npu": topology.npu_affinity, "gpu": topology.gpu_affinity}
TOOLS = {"npu": "npu-smi info -t topo", "gpu": "nvidia-smi topo -m"}


def ddp_cpu_binding(stdout: Any, accelerator: Any) -> str:
    """The binding line (``0=144-167;1=144-167``) from what the accelerator's topology tool printed:
    ``npu-smi info -t topo`` for 'npu', ``nvidia-smi topo -m`` for 'gpu'."""
    kind = str(accelerator)
    if kind not in READERS:
        raise AnsibleFilterError(
            f"ddp_cpu_binding: accelerator {kind!r} has no topology tool "
            f"(npu: {TOOLS['npu']}, gpu: {TOOLS['gpu']})"
        )
    try:
        return topology.binding_text(READERS[kind](str(stdout or "")))
    except topology.TopologyError as error:
        raise AnsibleFilterError(str(error)) from error


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"ddp_cpu_binding": ddp_cpu_binding}
