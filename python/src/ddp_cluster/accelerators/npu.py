"""Ascend NPUs: torch_npu's npu device and HCCL, ``ASCEND_RT_VISIBLE_DEVICES`` in a rank and
``ASCEND_VISIBLE_DEVICES`` for ascend-docker-runtime, the davinci device files, ``npu-smi info -t topo``, a
device-IP plan, and the host roles npu_host and hccn_network.

``npu-smi info -t topo`` prints a whitespace-aligned matrix: rows ``NPU0`` (``Phy-ID12`` on A3 servers),
link types between chips (``X``, ``HCCS``, ``PXB``, ``SYS``, ...), then the ``CPU Affinity`` (``144-167``); A3
servers on ARM print no affinity column at all, and unsupported devices print ``This device does not support
querying topo.``
"""

from __future__ import annotations

import re
from types import MappingProxyType

from ddp_cluster.accelerators.base import Accelerator, TopologyError
from ddp_cluster.accelerators.topology import AFFINITY, checked_affinity

TOPOLOGY_ARGV = ("npu-smi", "info", "-t", "topo")
TOPOLOGY_TOOL = " ".join(TOPOLOGY_ARGV)
# npu-smi labels its chips NPU<n>, or Phy-ID<n> on A3 servers.
NPU_LABEL = re.compile(r"(?:NPU|Phy-ID)(\d+)")
NO_NPU_AFFINITY = (
    "npu-smi info -t topo gives no CPU Affinity column (A3 servers on ARM leave it out): "
    "set cluster_cpu_binding: none"
)
NOT_SUPPORTED = "does not support querying topo"


def npu_affinity(text: str) -> dict[int, str]:
    """{device id: its ``CPU Affinity`` text} from ``npu-smi info -t topo`` (rows ``NPU n`` or
    ``Phy-ID n``)."""
    tool = TOPOLOGY_TOOL
    lines = str(text or "").splitlines()
    if any(NOT_SUPPORTED in line for line in lines):
        raise TopologyError(
            f"{tool}: This device does not support querying topo. (no CPU affinity to bind to)"
        )
    header: list[str] | None = None
    found: dict[int, str] = {}
    for line in lines:
        tokens = line.replace(AFFINITY, "CPU_Affinity").split()
        match = NPU_LABEL.fullmatch(tokens[0]) if tokens else None
        if match is None:
            continue
        if "CPU_Affinity" in tokens or all(NPU_LABEL.fullmatch(token) for token in tokens):
            header = tokens if header is None else header
            continue
        if header is None:
            raise TopologyError(
                f"{tool}: row {tokens[0]} comes before the header line (NPU0 NPU1 ... CPU Affinity)"
            )
        if "CPU_Affinity" not in header:
            raise TopologyError(NO_NPU_AFFINITY)
        column = header.index("CPU_Affinity") + 1  # the row's label comes first
        if len(tokens) <= column:
            raise TopologyError(f"{tool}: {tokens[0]} has no CPU Affinity cell: {line.strip()!r}")
        found[int(match.group(1))] = checked_affinity(tool, tokens[0], tokens[column])
    if header is not None and "CPU_Affinity" not in header:
        raise TopologyError(NO_NPU_AFFINITY)
    if not found:
        raise TopologyError(
            f"{tool} printed no NPU rows (NPU0 ... CPU Affinity): {str(text or '').strip()[:200]!r}"
        )
    return found


NPU = Accelerator(
    name="npu",
    device="npu",
    backends=("hccl",),
    visible_variable="ASCEND_RT_VISIBLE_DEVICES",
    container_runtime="ascend",
    runtime_visible_variable="ASCEND_VISIBLE_DEVICES",
    interface_variables=("GLOO_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME"),
    topology_argv=TOPOLOGY_ARGV,
    affinity=npu_affinity,
    # ascend-docker-runtime's devices: one davinci<id> per chip and its manager devices.
    device_file_prefix="/dev/davinci",
    manager_devices=("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"),
    driver_mounts=True,
    shares_host_ipc=True,
    # HCCL's rank tables take 1, 2, 4 or 8 devices of a server (the Ascend PyTorch DDP manual).
    nproc_choices=(1, 2, 4, 8),
    device_ip_plan=True,
    host_roles=("npu_host", "hccn_network"),
    preflight=(("npu_host", "preflight"), ("hccn_network", "tls")),
    adapter="torch_npu",
    adapter_about="the Ascend adapter for PyTorch, with CANN",
    adapter_fix="check the CANN base image and the driver mounts (LD_LIBRARY_PATH)",
    launchers=("torch_npu_run",),
    # The Ascend PyTorch DDP manual turns HCCL's trust list off for multi-node jobs.
    rank_environment=MappingProxyType({"HCCL_WHITELIST_DISABLE": "1"}),
)
