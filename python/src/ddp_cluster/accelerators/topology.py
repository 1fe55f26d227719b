"""Which CPUs sit next to each accelerator, and which of them a rank may run on.

The vendors' topology tools print, per device, the CPUs of its NUMA node (``CPU Affinity``):

- ``npu-smi info -t topo`` (Ascend): a whitespace-aligned matrix, rows ``NPU0`` (``Phy-ID12`` on A3 servers),
  link types between chips (``X``, ``HCCS``, ``PXB``, ``SYS``, ...), then the affinity (``144-167``); A3
  servers on ARM print no affinity column at all, and unsupported devices print ``This device does not support
  querying topo.``;
- ``nvidia-smi topo -m``: a tab-separated matrix, rows ``GPU0`` and ``NIC0``, the self cell `` X ``, then the
  ``CPU Affinity`` (``48-63,176-191``), ``NUMA Affinity`` and, on newer drivers, ``GPU NUMA ID`` columns; the
  header may be underlined with ANSI escapes.

:func:`npu_affinity` and :func:`gpu_affinity` read them into {device: affinity text}; :func:`binding_text`
carries that to the ranks as one line (``0=144-167;1=144-167``), :func:`parse_binding_text` reads it back,
:func:`rank_device` finds a local rank's physical device under ``ASCEND_RT_VISIBLE_DEVICES`` /
``CUDA_VISIBLE_DEVICES`` and :func:`rank_cpus` the CPUs of it that the process may use. Every failure is a
:class:`TopologyError` whose message names what is missing. Standard library only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from ddp_cluster.errors import DeviceError

# npu-smi labels its chips NPU<n>, or Phy-ID<n> on A3 servers.
NPU_LABEL = re.compile(r"(?:NPU|Phy-ID)(\d+)")
GPU_LABEL = re.compile(r"GPU(\d+)")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
AFFINITY = "CPU Affinity"
NO_NPU_AFFINITY = (
    "npu-smi info -t topo gives no CPU Affinity column (A3 servers on ARM leave it out): "
    "set cluster_cpu_binding: none"
)
NOT_SUPPORTED = "does not support querying topo"


class TopologyError(ValueError):
    """A topology output, binding or device list that does not say which CPUs a device has; the message names
    what is missing."""


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The CPUs of a Linux CPU list (``0-23,48-71``, ``3``), sorted, each once."""
    cleaned = str(text).strip()
    if not cleaned:
        raise TopologyError("empty CPU list")
    cpus: set[int] = set()
    for part in cleaned.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise TopologyError(
                f"CPU list {cleaned!r}: {part.strip()!r} is not a CPU or a range a-b"
            ) from None
        if low < 0 or high < low:
            raise TopologyError(f"CPU list {cleaned!r}: {part.strip()!r} is not a range of CPUs (low-high)")
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The compact Linux form of ``cpus``: consecutive runs as ranges (``0-23,48-71``); "" for none."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    start = 0
    for index in range(1, len(ordered) + 1):
        if index == len(ordered) or ordered[index] != ordered[index - 1] + 1:
            low, high = ordered[start], ordered[index - 1]
            parts.append(str(low) if low == high else f"{low}-{high}")
            start = index
    return ",".join(parts)


def _checked_affinity(tool: str, device: str, value: str) -> str:
    """``value`` when it is a CPU list; else an error naming the device."""
    try:
        parse_cpu_list(value)
    except TopologyError as error:
        raise TopologyError(
            f"{tool}: {device} has CPU Affinity {value!r}, not a CPU list ({error})"
        ) from None
    return value


def npu_affinity(text: str) -> dict[int, str]:
    """{device id: its ``CPU Affinity`` text} from ``npu-smi info -t topo`` (rows ``NPU n`` or
    ``Phy-ID n``)."""
    tool = "npu-smi info -t topo"
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
        found[int(match.group(1))] = _checked_affinity(tool, tokens[0], tokens[column])
    if header is not None and "CPU_Affinity" not in header:
        raise TopologyError(NO_NPU_AFFINITY)
    if not found:
        raise TopologyError(
            f"{tool} printed no NPU rows (NPU0 ... CPU Affinity): {str(text or '').strip()[:200]!r}"
        )
    return found


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
    tool = "nvidia-smi topo -m"
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
        found[device] = _checked_affinity(tool, f"GPU{device}", value)
    if not found:
        raise TopologyError(f"{tool} printed no GPU rows (GPU0 ... CPU Affinity)")
    return found


def binding_text(mapping: Mapping[int, str]) -> str:
    """The binding as one line for the ranks' environment: ``0=144-167;1=144-167`` (sorted by device, each
    CPU list in compact form)."""
    if not mapping:
        raise TopologyError("no devices to bind: the topology gave no device with a CPU affinity")
    return ";".join(
        f"{int(device)}={format_cpu_list(parse_cpu_list(mapping[device]))}" for device in sorted(mapping)
    )


def parse_binding_text(text: str) -> dict[int, tuple[int, ...]]:
    """{device: its CPUs} from :func:`binding_text`'s line."""
    entries = [entry.strip() for entry in str(text or "").split(";") if entry.strip()]
    if not entries:
        raise TopologyError("empty CPU binding (expected device=cpus;... such as 0=144-167;1=144-167)")
    binding: dict[int, tuple[int, ...]] = {}
    for entry in entries:
        device_text, equals, cpus = entry.partition("=")
        if not equals:
            raise TopologyError(f"CPU binding entry {entry!r} is not device=cpus (such as 0=144-167)")
        try:
            device = int(device_text.strip())
        except ValueError:
            raise TopologyError(
                f"CPU binding entry {entry!r}: {device_text.strip()!r} is not a device number"
            ) from None
        if device < 0:
            raise TopologyError(f"CPU binding entry {entry!r}: device {device} is negative")
        if device in binding:
            raise TopologyError(f"CPU binding names device {device} twice: {text!r}")
        try:
            binding[device] = parse_cpu_list(cpus)
        except TopologyError as error:
            raise TopologyError(f"CPU binding entry {entry!r} (device {device}): {error}") from None
    return binding


def rank_device(local_rank: int, visible: str | None) -> int:
    """The physical device of ``local_rank``: the local_rank-th entry of ``visible`` (the comma list of
    ``ASCEND_RT_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES``), or local_rank itself when that is unset or
    empty."""
    if local_rank < 0:
        raise TopologyError(f"local rank {local_rank} is negative")
    if visible is None or not visible.strip():
        return local_rank
    entries = [entry.strip() for entry in visible.split(",")]
    devices: list[int] = []
    for entry in entries:
        if not re.fullmatch(r"[0-9]+", entry):
            raise TopologyError(
                f"visible devices {visible!r}: {entry!r} is not a device number (UUIDs and MIG names "
                "cannot be matched to the topology's device numbers)"
            )
        devices.append(int(entry))
    if local_rank >= len(devices):
        raise TopologyError(
            f"local rank {local_rank} has no device: only {len(devices)} visible ({visible!r})"
        )
    return devices[local_rank]


def rank_cpus(binding: Mapping[int, tuple[int, ...]], device: int, allowed: set[int]) -> tuple[int, ...]:
    """The CPUs of ``device`` in ``binding`` that ``allowed`` (the process's current affinity) holds."""
    if device not in binding:
        known = ",".join(str(known) for known in sorted(binding)) or "none"
        raise TopologyError(f"device {device} is not in the CPU binding (devices {known})")
    cpus = tuple(cpu for cpu in binding[device] if cpu in allowed)
    if not cpus:
        raise TopologyError(
            f"device {device}'s CPUs {format_cpu_list(binding[device])} are all outside the CPUs this "
            f"process may use ({format_cpu_list(allowed) or 'none'})"
        )
    return cpus


BINDING_VARIABLE = "DDP_CPU_BINDING"
UNBOUND = "set cluster_cpu_binding: none to run unbound"
# The variable that lists a rank's devices, by the accelerator of the cluster (DDP_ACCELERATOR in node.env).
VISIBLE_VARIABLE = {"npu": "ASCEND_RT_VISIBLE_DEVICES", "gpu": "CUDA_VISIBLE_DEVICES"}


def bind_rank(local_rank: int, environ: Mapping[str, str] | None = None) -> str | None:
    """Bind this process to the CPUs of its device's NUMA node: ``DDP_CPU_BINDING`` (device=cpus;..., written
    into node.env from the vendor's topology where cluster_cpu_binding is numa), the device being the
    local_rank-th visible one. Returns what was done, for the rank's log (None: no binding asked for);
    DeviceError naming the device and the CPUs when it cannot be done."""
    environ = os.environ if environ is None else environ
    text = environ.get(BINDING_VARIABLE, "").strip()
    if not text:
        return None
    accelerator = environ.get("DDP_ACCELERATOR", "")
    visible_name = VISIBLE_VARIABLE.get(accelerator, "")
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
