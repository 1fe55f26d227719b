"""Which network transport NCCL chose on a node, and whether that is a fallback (standard library only).

The health gate runs its collectives with ``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=INIT,NET`` and
``NCCL_DEBUG_FILE=DIR/nccl.%h.%p.log`` set for itself only, then hands the log text to
:func:`parse_nccl_log`. NCCL prefixes every line with ``host:pid:tid [cudaDev] NCCL INFO`` and says:

- ``NET/IB : No device found.``: its IB transport found no usable HCA (none, no libibverbs, no
  /dev/infiniband, NCCL_IB_DISABLE, or NCCL_IB_HCA matching nothing);
- ``NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:192.168.11.1<0>``: the HCAs and ports it
  may use, each with its link layer (merged devices as ``[0]={[0] mlx5_0:1/RoCE, [1] mlx5_1:1/RoCE}``);
- ``NET/Socket : Using [0]eth0:10.0.0.1<0>``: the interfaces of its socket transport;
- ``Using network IB``: the transport it picked (``IB``, ``Socket``, or a plugin's name: ``IBext_v8``,
  ``AWS Libfabric``), which decides: both ``Using`` lines above can appear in one log;
- ``Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA``: the transport of each inter-node channel.

:func:`ib_devices` reads the node's HCAs and their ports' state from ``/sys/class/infiniband`` (the host's,
also inside a container), and :func:`fabric_problem` names a node whose NCCL fell back to sockets although it
has an HCA with an active port. A log that says nothing about the network is reported as unknown and
judged by nobody: no verdict is better than a guessed one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

SYS_INFINIBAND = Path("/sys/class/infiniband")
DEV_INFINIBAND = Path("/dev/infiniband")
# The files the gate's NCCL_DEBUG_FILE=DIR/nccl.%h.%p.log makes: one per process.
LOG_GLOB = "nccl.*.log"

KIND_IB = "ib"
KIND_SOCKET = "socket"
KIND_OTHER = "other"
KIND_UNKNOWN = "unknown"

_INFO = "NCCL INFO "
_WARN = "NCCL WARN"
_USING_NETWORK = re.compile(r"^Using network (?P<name>\S.*?)\s*$")
_IB_NONE = re.compile(r"^NET/IB\s*:\s*No device found")
_IB_USING = re.compile(r"^NET/IB\s*:\s*Using(?P<devices>.*?)(?:;\s*OOB\s+(?P<oob>\S+))?\s*$")
# One HCA port of NET/IB's list: "[0]mlx5_0:1/IB", "[1] mlx5_1:1/RoCE" (inside a merged device), with
# whatever NCCL puts between the port and the link layer or after it (":rail0", "/SHARP") kept as listed.
_IB_DEVICE = re.compile(r"\[\d+\]\s*(?P<device>[A-Za-z0-9_.\-]+:\d+[^\s,;{}\[\]]*)")
_SOCKET_USING = re.compile(r"^NET/Socket\s*:\s*Using(?P<interfaces>.*?)\s*$")
_SOCKET_INTERFACE = re.compile(r"\[\d+\](?P<name>[^\s:\[\]]+):")
_CHANNEL_NET = re.compile(r"^Channel\s.*\bvia\s+(?P<via>NET/\S+)")


def _network_kind(name: str) -> str:
    """The kind of a network NCCL names: IB (its own) and IBext* (nccl-rdma-sharp-plugins) are InfiniBand or
    RoCE verbs, Socket its socket transport, anything else a plugin (AWS Libfabric for EFA, ...)."""
    if name == "IB" or name.lower().startswith("ibext"):
        return KIND_IB
    if name.lower() == "socket":
        return KIND_SOCKET
    return KIND_OTHER


def _distinct(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


@dataclass(frozen=True)
class Transport:
    """What a node's NCCL log says about its network transport.

    ``network``: the name from ``Using network`` (None: not in the log); where the log holds several
    processes or communicators that disagree, ``Socket`` wins, one rank on sockets holding back every
    collective (all the names are in ``networks``). ``ib_devices``: the HCA ports NET/IB listed
    (``mlx5_0:1/IB``); ``socket_interfaces``: NET/Socket's interfaces (``eth0``); ``channels``: the distinct
    inter-node channel transports (``NET/IB/0/GDRDMA``); ``no_ib_device``: NET/IB said it found none.
    """

    network: str | None = None
    ib_devices: tuple[str, ...] = ()
    socket_interfaces: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    no_ib_device: bool = False
    networks: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        """``ib`` (NCCL's IB transport or an IBext plugin, InfiniBand or RoCE), ``socket``, ``other`` (another
        plugin) or ``unknown`` (the log names no network and no inter-node channel)."""
        if self.network is not None:
            return _network_kind(self.network)
        kinds = {_network_kind(via.split("/")[1]) for via in self.channels if via.count("/") >= 1}
        for kind in (KIND_SOCKET, KIND_IB, KIND_OTHER):
            if kind in kinds:
                return kind
        return KIND_UNKNOWN

    @property
    def seen(self) -> bool:
        """Whether the log said anything about the network at all."""
        return bool(
            self.network or self.ib_devices or self.socket_interfaces or self.channels or self.no_ib_device
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "network": self.network,
            "networks": list(self.networks),
            "ib_devices": list(self.ib_devices),
            "socket_interfaces": list(self.socket_interfaces),
            "channels": list(self.channels),
            "no_ib_device": self.no_ib_device,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Transport:
        """The transport :meth:`as_dict` wrote (health.json); ``kind`` is recomputed, not read."""
        network = data.get("network")
        return cls(
            network=None if network is None else str(network),
            ib_devices=tuple(str(item) for item in data.get("ib_devices") or ()),
            socket_interfaces=tuple(str(item) for item in data.get("socket_interfaces") or ()),
            channels=tuple(str(item) for item in data.get("channels") or ()),
            no_ib_device=bool(data.get("no_ib_device", False)),
            networks=tuple(str(item) for item in data.get("networks") or ()),
        )


def _message(line: str) -> str | None:
    """The message of one log line: what follows ``NCCL INFO`` whatever the prefix (host:pid:tid [dev]); None
    for WARN lines; a line without either is taken whole (a log stripped of its prefixes)."""
    at = line.find(_INFO)
    if at >= 0:
        return line[at + len(_INFO) :].strip()
    if _WARN in line:
        return None
    return line.strip() or None


def parse_nccl_log(text: str) -> Transport:
    """What NCCL's INFO lines in ``text`` (one or several processes' logs, concatenated) say about the
    network: see :class:`Transport`. Unrelated, WARN and blank lines are skipped."""
    networks: list[str] = []
    ib: list[str] = []
    sockets: list[str] = []
    channels: list[str] = []
    no_ib_device = False
    for line in text.splitlines():
        message = _message(line)
        if message is None:
            continue
        if match := _USING_NETWORK.match(message):
            networks.append(match["name"])
        elif _IB_NONE.match(message):
            no_ib_device = True
        elif match := _IB_USING.match(message):
            ib.extend(device["device"] for device in _IB_DEVICE.finditer(match["devices"]))
        elif match := _SOCKET_USING.match(message):
            sockets.extend(interface["name"] for interface in _SOCKET_INTERFACE.finditer(match["interfaces"]))
        elif match := _CHANNEL_NET.match(message):
            channels.append(match["via"])
    distinct = _distinct(networks)
    socket_names = [name for name in distinct if _network_kind(name) == KIND_SOCKET]
    network = socket_names[0] if socket_names else (distinct[0] if distinct else None)
    return Transport(
        network=network,
        ib_devices=_distinct(ib),
        socket_interfaces=_distinct(sockets),
        channels=_distinct(channels),
        no_ib_device=no_ib_device,
        networks=distinct,
    )


def read_nccl_logs(directory: Path, pattern: str = LOG_GLOB) -> str:
    """The text of every NCCL log in ``directory`` (the gate's ``nccl.%h.%p.log`` files), in name order;
    unreadable files and a missing directory give nothing."""
    texts: list[str] = []
    try:
        paths = sorted(directory.glob(pattern))
    except OSError:
        return ""
    for path in paths:
        try:
            texts.append(path.read_text(errors="replace"))
        except OSError:
            continue
    return "\n".join(texts)


class Port(NamedTuple):
    """One port of an HCA: its number, its state as sysfs words it (``ACTIVE``, ``DOWN``; None: unreadable)
    and its link layer (``InfiniBand`` or ``Ethernet``, which is RoCE; None: unreadable)."""

    number: int
    state: str | None
    link_layer: str | None

    @property
    def active(self) -> bool:
        """State 4, ACTIVE: the only state NCCL's IB transport uses a port in."""
        return self.state == "ACTIVE"


@dataclass(frozen=True)
class Hca:
    """An RDMA device of the node (``mlx5_0``) and its ports."""

    name: str
    ports: tuple[Port, ...] = ()

    @property
    def active(self) -> bool:
        """Whether any port is ACTIVE."""
        return any(port.active for port in self.ports)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ports": [
                {"port": port.number, "state": port.state, "link_layer": port.link_layer}
                for port in self.ports
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Hca:
        return cls(
            str(data["name"]),
            tuple(
                Port(int(port["port"]), port.get("state"), port.get("link_layer"))
                for port in data.get("ports") or ()
            ),
        )


def _natural(name: str) -> tuple[Any, ...]:
    """Sort key putting mlx5_2 before mlx5_10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip() or None
    except OSError:
        return None


def _state(text: str | None) -> str | None:
    """``4: ACTIVE`` -> ``ACTIVE``; a bare word is kept."""
    if text is None:
        return None
    return text.split(":", 1)[-1].strip().upper() or None


def ib_devices(root: Path = SYS_INFINIBAND) -> list[Hca]:
    """The node's RDMA devices, from ``root`` (``/sys/class/infiniband``: one directory per HCA, with
    ``ports/N/state`` such as ``4: ACTIVE`` and ``ports/N/link_layer``), in natural name order; a port whose
    files cannot be read has None there. No ``root``: no devices."""
    try:
        entries = [entry for entry in root.iterdir() if entry.is_dir()]
    except OSError:
        return []
    hcas: list[Hca] = []
    for entry in sorted(entries, key=lambda path: _natural(path.name)):
        ports: list[Port] = []
        try:
            port_dirs = [port for port in (entry / "ports").iterdir() if port.name.isdigit()]
        except OSError:
            port_dirs = []
        for port in sorted(port_dirs, key=lambda path: int(path.name)):
            ports.append(Port(int(port.name), _state(_read(port / "state")), _read(port / "link_layer")))
        hcas.append(Hca(entry.name, tuple(ports)))
    return hcas


def has_rdma_devices(dev: Path = DEV_INFINIBAND) -> bool:
    """Whether ``dev`` (``/dev/infiniband``) holds a verbs device (``uverbs0``...): without one, libibverbs
    opens no HCA in this container, whatever sysfs lists."""
    try:
        return any(entry.name.startswith("uverbs") for entry in dev.iterdir())
    except OSError:
        return False


def fabric_problem(
    node: str, transport: Transport, hcas: Sequence[Hca], rdma_devices: bool | None = None
) -> str | None:
    """Why ``node`` fails the gate's fabric check, or None: a node whose NCCL used its socket transport
    while it has an HCA with an ACTIVE port (InfiniBand or RoCE) fell back, and runs its collectives at a
    fraction of the fabric's bandwidth. Nothing is said when the transport is unknown (no verdict on a
    guess), when NCCL used IB or a plugin, or when no HCA port is active. ``rdma_devices``: whether
    /dev/infiniband has verbs devices in the container (:func:`has_rdma_devices`; None: not looked)."""
    if transport.kind != KIND_SOCKET:
        return None
    active = [hca for hca in hcas if hca.active]
    if not active:
        return None
    via = "NET/Socket"
    if transport.socket_interfaces:
        via += f" on {', '.join(transport.socket_interfaces)}"
    said = ""
    if transport.no_ib_device:
        said += "; NCCL's IB transport found no device"
    if rdma_devices is False:
        said += "; the container has no /dev/infiniband/uverbs* device"
    return (
        f"node {node} fell back to NCCL's socket transport ({via}) though it has InfiniBand/RoCE devices "
        f"with active ports ({', '.join(hca.name for hca in active)}){said}: check that /dev/infiniband "
        "is passed to the container, that the image has rdma-core/libibverbs (training_image_os_packages), "
        "that NCCL_IB_DISABLE is unset, and that NCCL_IB_HCA names them"
    )


def render_transport(transport: Transport) -> str:
    """A short text for the gate's table: ``IB (mlx5_0:1/IB, mlx5_1:1/IB)``, ``Socket (eth0)``,
    ``AWS Libfabric``, ``unknown (no NCCL log)``."""
    kind = transport.kind
    if kind == KIND_IB:
        name = transport.network or "IB"
        details = ", ".join(transport.ib_devices) or ", ".join(transport.channels)
        return f"{name} ({details})" if details else name
    if kind == KIND_SOCKET:
        name = transport.network or "Socket"
        return f"{name} ({', '.join(transport.socket_interfaces)})" if transport.socket_interfaces else name
    if kind == KIND_OTHER:
        return transport.network or ", ".join(transport.channels)
    if not transport.seen:
        return "unknown (no NCCL log)"
    hints: list[str] = []
    if transport.no_ib_device:
        hints.append("NET/IB: no device")
    if transport.ib_devices:
        hints.append("NET/IB: " + ", ".join(transport.ib_devices))
    if transport.socket_interfaces:
        hints.append("NET/Socket: " + ", ".join(transport.socket_interfaces))
    return f"unknown ({'; '.join(hints)})"
