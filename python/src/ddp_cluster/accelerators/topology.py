"""CPU lists and the CPU binding: which CPUs sit next to each device, carried to the ranks as one line.

The vendors' topology tools print, per device, the CPUs of its NUMA node (``CPU Affinity``); each kind's
module reads its own tool (:func:`ddp_cluster.accelerators.npu.npu_affinity`,
:func:`ddp_cluster.accelerators.gpu.gpu_affinity`) into {device: affinity text}, checking each value with
:func:`checked_affinity`. :func:`binding_text` carries that to the ranks as one line
(``0=144-167;1=144-167``), :func:`parse_binding_text` reads it back, :func:`rank_device` finds a local rank's
physical device in its kind's visible-devices list and :func:`rank_cpus` the CPUs of it that the process
may use (:mod:`ddp_cluster.accelerators.binding` puts them together in a rank). Every failure is a
:class:`TopologyError` whose message names what is missing. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ddp_cluster.accelerators.base import TopologyError

# The column every vendor's topology matrix names the CPUs of a device's NUMA node by.
AFFINITY = "CPU Affinity"

__all__ = [
    "AFFINITY",
    "TopologyError",
    "binding_text",
    "checked_affinity",
    "format_cpu_list",
    "parse_binding_text",
    "parse_cpu_list",
    "rank_cpus",
    "rank_device",
]


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


def checked_affinity(tool: str, device: str, value: str) -> str:
    """``value`` when it is a CPU list; else an error naming the device."""
    try:
        parse_cpu_list(value)
    except TopologyError as error:
        raise TopologyError(
            f"{tool}: {device} has CPU Affinity {value!r}, not a CPU list ({error})"
        ) from None
    return value


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
