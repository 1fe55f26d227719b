"""NVIDIA GPUs: torch's cuda device and NCCL, ``CUDA_VISIBLE_DEVICES``, InfiniBand passed through,
``nvidia-smi topo -m``, and the host role gpu_host.

``nvidia-smi topo -m`` prints a tab-separated matrix: rows ``GPU0`` and ``NIC0``, the self cell `` X ``, then
the ``CPU Affinity`` (``48-63,176-191``), ``NUMA Affinity`` and, on newer drivers, ``GPU NUMA ID`` columns;
the header may be underlined with ANSI escapes.
"""

from __future__ import annotations

import re
from typing import Any

from ddp_cluster.accelerators.base import Accelerator, TopologyError
from ddp_cluster.accelerators.topology import AFFINITY, checked_affinity

TOPOLOGY_ARGV = ("nvidia-smi", "topo", "-m")
TOPOLOGY_TOOL = " ".join(TOPOLOGY_ARGV)
GPU_LABEL = re.compile(r"GPU(\d+)")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _cells(line: str) -> list[str]:
    """A ``nvidia-smi topo -m`` line's cells: tab-separated as printed; split on runs of spaces when the tabs
    were lost on the way (the multi-word column names kept whole)."""
    if "\t" in line:
        return [cell.strip() for cell in line.split("\t")]
    for name in (AFFINITY, "NUMA Affinity", "GPU NUMA ID"):
        line = line.replace(name, name.replace(" ", "\0"))
    cells = [cell.replace("\0", " ") for cell in line.split()]
    return ["", *cells] if line[:1].isspace() else cells


def gpu_affinity(text: str) -> dict[int, str]:
    """{GPU index: its ``CPU Affinity`` text} from ``nvidia-smi topo -m``: GPU rows only, the column found by
    its header name, ANSI escapes ignored."""
    tool = TOPOLOGY_TOOL
    lines = ANSI_ESCAPE.sub("", str(text or "")).splitlines()
    header = next((_cells(line) for line in lines if AFFINITY in line), None)
    if header is None:
        raise TopologyError(
            f"{tool} printed no header with a {AFFINITY} column: {str(text or '').strip()[:200]!r}"
        )
    column = header.index(AFFINITY)
    found: dict[int, str] = {}
    for line in lines:
        cells = _cells(line)
        match = GPU_LABEL.fullmatch(cells[0]) if cells else None
        if match is None:
            continue
        device = int(match.group(1))
        value = cells[column] if len(cells) > column else ""
        if value in ("", "N/A"):
            raise TopologyError(
                f"{tool} gives no CPU affinity for GPU{device} ({value or 'empty'}; the driver knows no "
                "NUMA node for it, as in many virtual machines): set cluster_cpu_binding: none"
            )
        found[device] = checked_affinity(tool, f"GPU{device}", value)
    if not found:
        raise TopologyError(f"{tool} printed no GPU rows (GPU0 ... CPU Affinity)")
    return found


GPU = Accelerator(
    name="gpu",
    device="cuda",
    backends=("nccl", "gloo"),
    visible_variable="CUDA_VISIBLE_DEVICES",
    interface_variables=("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"),
    topology_argv=TOPOLOGY_ARGV,
    affinity=gpu_affinity,
    host_devices=("/dev/infiniband",),
    shares_host_ipc=True,
    host_roles=("gpu_host",),
)


# --- telemetry --------------------------------------------------------------------------------------------
# What the supervisor asks every GPU node for at each sample (one line per GPU, in this order), and how.
TELEMETRY_FIELDS = (
    "index",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "ecc.errors.uncorrected.volatile.total",
)
TELEMETRY_ARGV = (
    "nvidia-smi",
    f"--query-gpu={','.join(TELEMETRY_FIELDS)}",
    "--format=csv,noheader,nounits",
)
# nvidia-smi's words for a value it does not have (a GPU without ECC, a field the driver lacks). Any other
# text where a number belongs is the driver's error about the GPU (``[GPU requires reset]``,
# ``[GPU is lost]``, ``[Unknown Error]``).
NOT_AVAILABLE = {"[n/a]", "n/a", "[not supported]", "not supported", ""}
# What nvidia-smi prints instead of a GPU's row when it cannot reach the GPU (``Unable to determine the
# device handle for GPU 0000:3B:00.0: GPU is lost. Reboot the system to recover this GPU``).
GPU_ERROR = re.compile(r"GPU is lost|requires? reset|Unable to determine the device handle", re.IGNORECASE)


def _number(cell: str) -> float | None:
    text = cell.strip()
    if text.lower() in NOT_AVAILABLE:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _is_error(cell: str) -> bool:
    return _number(cell) is None and cell.strip().lower() not in NOT_AVAILABLE


def gpu_telemetry(text: str) -> list[dict[str, Any]]:
    """One reading per GPU from :data:`TELEMETRY_ARGV`'s output (``0, 97, 72908, 81559, 61, 0``): index,
    utilisation (%), memory used and total (MiB), temperature (C), uncorrectable ECC errors since the driver
    loaded (None without ECC: ``[N/A]``), health: ``critical`` for a row whose values are all missing or
    hold the driver's error text (``[GPU requires reset]``: the GPU answers no query), else ``ok``. Lines
    that are no GPU's (the driver's error message) are left out (:func:`tool_errors`)."""
    found: list[dict[str, Any]] = []
    for line in str(text or "").splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(TELEMETRY_FIELDS) or not cells[0].isdigit():
            continue
        utilization, used, total, temperature, ecc = (_number(cell) for cell in cells[1:])
        broken = any(_is_error(cell) for cell in cells[1:]) or all(
            value is None for value in (utilization, used, total, temperature, ecc)
        )
        found.append(
            {
                "index": int(cells[0]),
                "kind": "gpu",
                "utilization_percent": utilization,
                "memory_used_mb": used,
                "memory_total_mb": total,
                "temperature_c": temperature,
                "health": "critical" if broken else "ok",
                "ecc_uncorrectable": None if ecc is None else int(ecc),
                "link": None,
            }
        )
    return found


def tool_errors(text: str) -> list[str]:
    """nvidia-smi's lines about a GPU it cannot reach (:data:`GPU_ERROR`), as printed."""
    return [line.strip() for line in str(text or "").splitlines() if GPU_ERROR.search(line)]
