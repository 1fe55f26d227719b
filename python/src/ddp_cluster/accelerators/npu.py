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
from typing import Any

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


# --- telemetry --------------------------------------------------------------------------------------------
# npu-smi's Health words (the npu-smi manual: OK, Warning, Alarm, Critical, UNKNOWN); drivers print others
# too (Unknown, NA, Abnormal): a device row's health cell is read whatever it says.
HEALTH_WORDS = ("OK", "Warning", "Alarm", "Critical", "UNKNOWN")
TELEMETRY_ARGV = ("npu-smi", "info")
# A chip row's figures: AICore(%), Memory-Usage(MB) used / total, then (training chips) HBM-Usage(MB) used /
# total; npu-smi leaves no space before the slash once a number has five digits (``59356/ 65536``).
CHIP_FIGURES = re.compile(r"^\s*(\d+|NA|-)\s+(\d+)\s*/\s*(\d+)(?:\s+(\d+)\s*/\s*(\d+))?")
LINK_STATUS = re.compile(r"link status:\s*(\w+)", re.IGNORECASE)


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def npu_telemetry(text: str) -> list[dict[str, Any]]:
    """One reading per NPU from ``npu-smi info``'s chip table: its health (lower case, whatever word npu-smi
    printed: ok, warning, alarm, critical, unknown, na, abnormal, ...; none: unknown), temperature (C),
    AICore utilisation (%) and memory (HBM where the chip has it, else its DDR), used and total (MB). A
    device's row (``| 0  910B3 | OK | 101.8  43  0 / 0 |``) is followed by its chips' rows
    (``| 0  | 0000:C1:00.0 | 0  0 / 0  3318 / 65536 |``); the process table after them is not read."""
    found: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in str(text or "").splitlines():
        if "Process id" in line:
            break
        if not line.startswith("|"):
            continue
        cells = _cells(line)
        if len(cells) < 3:
            continue
        first = cells[0].split()
        if _device_row(first, cells[1]):
            figures = cells[2].split()
            current = {
                "index": int(first[0]),
                "kind": "npu",
                "utilization_percent": None,
                "memory_used_mb": None,
                "memory_total_mb": None,
                "temperature_c": float(figures[1]) if len(figures) > 1 and _is_number(figures[1]) else None,
                "health": " ".join(cells[1].split()).lower() or "unknown",
                "ecc_uncorrectable": None,
                "link": None,
            }
            found.append(current)
            continue
        match = CHIP_FIGURES.match(cells[2])
        if current is None or not first or not first[0].isdigit() or match is None:
            continue
        aicore, used, total = (
            match.group(1),
            match.group(4) or match.group(2),
            match.group(5) or match.group(3),
        )
        if aicore.isdigit():
            before = current["utilization_percent"]
            current["utilization_percent"] = max(float(aicore), before if isinstance(before, float) else 0.0)
        for key, value in (("memory_used_mb", used), ("memory_total_mb", total)):
            before = current[key]
            current[key] = float(value) + (before if isinstance(before, float) else 0.0)
    return found


def _device_row(first: list[str], health: str) -> bool:
    """Whether a row is a device's: its first cell holds the device's id and its name (``0  910B3``), where a
    chip's holds its id alone (``0``) or its id and device number (``0  0``); or its health is one of the
    manual's words."""
    if not first or not first[0].isdigit():
        return False
    named = len(first) > 1 and not first[1].isdigit()
    return named or health.upper() in (word.upper() for word in HEALTH_WORDS)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def link_state(text: str) -> str | None:
    """``hccn_tool -i N -link -g``'s ``link status: UP`` as up or down; None when it said neither."""
    match = LINK_STATUS.search(str(text or ""))
    if match is None:
        return None
    word = match.group(1).lower()
    return word if word in ("up", "down") else None
