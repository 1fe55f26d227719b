"""The Ascend device NICs as hccn_tool sees them: what to set, what a device reports, what differs, what is
wrong.

One module for the playbooks' filters (through :mod:`ddp_cluster.inventory.npu`), the ``hccn_network`` role's
Ansible module (``ddp_hccn``, which ships this file to the servers as module_utils, so it uses the standard
library only and runs on Python 3.8) and ``ddp-cluster hccn``:

- :func:`device_settings`: from a device-IP plan (plain data, as :mod:`ddp_cluster.ascend.ipplan` expands
  it), what each device of one server should be set to: address, netmask, netdetect address, gateway;
- :func:`fields`, :func:`net_health_name`, :func:`healthy`: hccn_tool's ``-g`` outputs, as the manuals print
  them (the Ascend PyTorch DDP manual, the Ascend multi-node checklist): ``ipaddr:A`` / ``netmask:M``,
  ``netdetect address: A``, ``default gateway:G, Iface:ethN``, ``link status: UP``, ``net health status:
  Success`` (some versions print the code);
- :func:`changes`: read-compare-set: only the ``-s`` calls whose setting a device reports differently,
  addresses before the detection and gateway that rely on them;
- :func:`problems`: the health verdict per device (address, net_health, link, LLDP);
- :func:`configure`, :func:`verify`: the module's two modes, reading and setting through a ``run`` callable
  (the module's ``run_command``; the command's ``subprocess``; a fake in tests).

``readings`` everywhere is what the module reads: {device id (str): {query ("-ip", ...): {"stdout": text}}}.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

SETTING_ORDER = ("ip", "netdetect", "gateway")

# The Ascend multi-node checklist, table 2: "0:Success;1:Socket fail;2:Receive timeout;3:Unreachable;
# 4:Time exceeded;5:Fault;6:Init;7:Thread error;8:Detect ip set;其它:Unknown"
NET_HEALTH_NAMES = {
    0: "Success",
    1: "Socket fail",
    2: "Receive timeout",
    3: "Unreachable",
    4: "Time exceeded",
    5: "Fault",
    6: "Init",
    7: "Thread error",
    8: "Detect ip set",
}


# Travels alone to the servers, so it cannot derive from ddp_cluster.errors.DdpClusterError; the controller's
# callers (ddp_cluster.inventory.npu, the hccn command) turn it into theirs.
class HccnError(ValueError):
    """Settings that cannot be worked out (a host outside the plan, a malformed address list)."""


def fields(text: str | None) -> dict[str, str]:
    """``key: value`` lines of hccn_tool output as a dict (``ipaddr``, ``netmask``, ``net health status``
    ...); the first value of a key wins."""
    found: dict[str, str] = {}
    for line in str(text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and key.strip() not in found:
            found[key.strip()] = value.strip()
    return found


def net_health_name(text: str | None) -> str:
    """The status of ``-net_health -g`` output by name; a bare code (some versions print one) is mapped."""
    status = fields(text).get("net health status", str(text or "").strip())
    if status.isdigit():
        return NET_HEALTH_NAMES.get(int(status), "Unknown")
    return status or "no answer"


def healthy(text: str | None) -> bool:
    return net_health_name(text) == "Success"


def _per_device(value: Any, count: int, host: str, what: str) -> list[str | None]:
    if value is None or value == "" or value == []:
        return [None] * count
    if isinstance(value, str):
        return [value] * count
    if not isinstance(value, (list, tuple)) or len(value) != count:
        raise HccnError(
            f"{host}: {what} must be one address or a list of {count} (one per device), got {value!r}"
        )
    return [str(item) for item in value]


def device_settings(
    plan: Mapping[str, Any], host: str, detect_ips: Any = None, gateways: Any = None
) -> list[dict[str, Any]]:
    """What hccn_tool should set on each device of one host: device, address, netmask, detect, gateway.

    detect_ips: one address per device, or one address for all devices, or empty: then each device probes
    the device at the same position on the next server of the plan (the Ascend PyTorch DDP manual: "the IP
    of device i of the other machine"), which the plan rules put in the same subnet. gateways: the same
    forms; empty: none set.
    """
    servers = list(plan["servers"])
    names = [server.get("host") for server in servers]
    if host not in names:
        raise HccnError(f"{host} is not a server of the NPU device-IP plan ({', '.join(map(str, names))})")
    index = names.index(host)
    device_ips = [str(address) for address in servers[index]["device_ips"]]
    count = len(device_ips)
    detects = _per_device(detect_ips, count, host, "the netdetect addresses (npu_device_detect_ips)")
    gateway_list = _per_device(gateways, count, host, "the gateways (npu_device_gateways)")
    settings = []
    for device, address in enumerate(device_ips):
        detect = detects[device]
        if detect is None:
            others = servers[index + 1 :] + servers[:index]
            peers = [server["device_ips"] for server in others if len(server["device_ips"]) > device]
            if not peers:
                raise HccnError(
                    f"{host}: device {device} has no netdetect address and no other server has a device "
                    f"{device} to probe: set npu_device_detect_ips (one address per device, usually each "
                    "subnet's gateway)"
                )
            detect = str(peers[0][device])
        for what, value in (("netdetect address", detect), ("gateway", gateway_list[device])):
            if value is not None:
                try:
                    ipaddress.IPv4Address(value)
                except ValueError:
                    raise HccnError(
                        f"{host}: device {device}: {what} {value!r} is not an IPv4 address"
                    ) from None
        settings.append(
            {
                "device": device,
                "address": address,
                "netmask": str(plan["netmask"]),
                "detect": detect,
                "gateway": gateway_list[device],
            }
        )
    return settings


def reading(readings: Mapping[str, Any], device: int, query: str) -> str:
    """One query's output for one device ('' when it was not read)."""
    entry = (readings.get(str(device)) or {}).get(query) or {}
    return str(entry.get("stdout") or "")


def changes(settings: Sequence[Mapping[str, Any]], readings: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The hccn_tool ``-s`` calls that bring each device to its settings, only where the device differs.

    Each change: device, setting (ip, netdetect, gateway), current, wanted, args (after ``-i DEVICE``).
    Addresses are set before detection and gateway, which rely on them.
    """
    found: list[dict[str, Any]] = []

    def change(device: int, setting: str, current: str | None, wanted: str, args: list[str]) -> None:
        found.append(
            {
                "device": device,
                "setting": setting,
                "current": current or "unset",
                "wanted": wanted,
                "args": args,
            }
        )

    for wanted in settings:
        device = int(wanted["device"])
        ip = fields(reading(readings, device, "-ip"))
        if ip.get("ipaddr") != wanted["address"] or ip.get("netmask") != wanted["netmask"]:
            current = f"{ip.get('ipaddr', '')} {ip.get('netmask', '')}".strip()
            new = f"{wanted['address']} {wanted['netmask']}"
            args = ["-ip", "-s", "address", str(wanted["address"]), "netmask", str(wanted["netmask"])]
            change(device, "ip", current, new, args)
        detect = fields(reading(readings, device, "-netdetect")).get("netdetect address")
        if wanted.get("detect") and detect != wanted["detect"]:
            change(
                device,
                "netdetect",
                detect,
                wanted["detect"],
                ["-netdetect", "-s", "address", wanted["detect"]],
            )
        if wanted.get("gateway"):
            gateway = (
                fields(reading(readings, device, "-gateway")).get("default gateway", "").split(",")[0].strip()
            )
            if gateway != wanted["gateway"]:
                change(
                    device,
                    "gateway",
                    gateway,
                    wanted["gateway"],
                    ["-gateway", "-s", "gateway", wanted["gateway"]],
                )
    return sorted(found, key=lambda item: (SETTING_ORDER.index(item["setting"]), item["device"]))


def change_line(change: Mapping[str, Any]) -> str:
    """``device 1 ip: 192.168.1.50 255.255.0.0 -> 192.168.101.101 255.255.255.0``"""
    return f"device {change['device']} {change['setting']}: {change['current']} -> {change['wanted']}"


def problems(
    settings: Sequence[Mapping[str, Any]], readings: Mapping[str, Any], check_lldp: bool = True
) -> list[str]:
    """Why each device is not ready, one line per device with a problem: address, net_health, link, LLDP."""
    found = []
    for wanted in settings:
        device = int(wanted["device"])
        reasons = []
        ip = fields(reading(readings, device, "-ip"))
        if ip.get("ipaddr") != wanted["address"] or ip.get("netmask") != wanted["netmask"]:
            current = f"{ip.get('ipaddr', '')} {ip.get('netmask', '')}".strip() or "none"
            reasons.append(f"address is {current}, planned {wanted['address']} {wanted['netmask']}")
        health = net_health_name(reading(readings, device, "-net_health"))
        if health != "Success":
            reasons.append(f"net health {health} (netdetect address {wanted.get('detect')})")
        link = fields(reading(readings, device, "-link")).get("link status", "").upper()
        if link != "UP":
            reasons.append(f"link {link or 'unknown'}")
        if check_lldp and not reading(readings, device, "-lldp").strip():
            reasons.append("no LLDP neighbour (-lldp -g is empty: check the switch port)")
        if reasons:
            found.append(f"device {device}: " + "; ".join(reasons))
    return found


# --- reading and setting the devices (the role's module; the hccn command reads with the same code) ---------


def read(
    tool: str, device: int, query: str, run: Callable[[list[str]], tuple[int, str, str]]
) -> dict[str, Any]:
    """One ``TOOL -i DEVICE QUERY -g`` call through RUN (argv -> rc, stdout, stderr): its cmd, rc, stdout
    and stderr."""
    argv = [tool, "-i", str(device), query, "-g"]
    rc, out, err = run(argv)
    return {"cmd": argv, "rc": rc, "stdout": out, "stderr": err}


def read_devices(
    tool: str,
    devices: Sequence[int],
    queries: Sequence[str],
    run: Callable[[list[str]], tuple[int, str, str]],
) -> dict[str, dict[str, dict[str, Any]]]:
    """Every query of every device, query by query (each device read once before the next query):
    the readings, {device id (str): {query: entry}}."""
    readings: dict[str, dict[str, dict[str, Any]]] = {str(device): {} for device in devices}
    for query in queries:
        for device in devices:
            readings[str(device)][query] = read(tool, device, query, run)
    return readings


def failed_reads(readings: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The reads that exited non-zero: device, query, cmd, rc, stdout and stderr."""
    return [
        {"device": int(device), "query": query, **entry}
        for device, by_query in readings.items()
        for query, entry in by_query.items()
        if entry["rc"] != 0
    ]


def _outcome(readings: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    return {
        "devices": readings,
        "failed_reads": failed_reads(readings),
        "changes": [],
        "applied": [],
        "problems": [],
        "health_seconds": 0.0,
    }


def verify(
    tool: str,
    settings: Sequence[Mapping[str, Any]],
    run: Callable[[list[str]], tuple[int, str, str]],
    check_lldp: bool = True,
    health_timeout: float = 0,
    health_delay: float = 3,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Read address, link and LLDP, then poll net_health until every device reads Success (one deadline for
    the server; 0 reads it once); the outcome's ``problems``, one line per device that is not ready."""
    devices = [int(setting["device"]) for setting in settings]
    readings = read_devices(tool, devices, ("-ip", "-link", "-lldp"), run)
    start = clock()
    deadline = start + max(0, health_timeout)
    pending = list(devices)
    while True:
        for device in pending:
            readings[str(device)]["-net_health"] = read(tool, device, "-net_health", run)
        pending = [
            device for device in pending if not healthy(readings[str(device)]["-net_health"]["stdout"])
        ]
        if not pending or clock() + health_delay > deadline:
            break
        sleep(max(0, health_delay))
    outcome = _outcome(readings)
    outcome["health_seconds"] = round(clock() - start, 1)
    outcome["problems"] = problems(settings, readings, check_lldp)
    return outcome


def configure(
    tool: str,
    settings: Sequence[Mapping[str, Any]],
    run: Callable[[list[str]], tuple[int, str, str]],
    check: bool,
) -> tuple[dict[str, Any], str]:
    """Read every device's address, netdetect address and gateway (all before any is set), then run the
    ``-s`` calls for what differs, in order, stopping at the first that fails; in check mode none.

    Returns the outcome (``changed``, ``diff``, the readings, the changes needed and the calls applied) and
    why a call failed (empty when none did). A read that fails sets nothing: see ``failed_reads``."""
    devices = [int(setting["device"]) for setting in settings]
    queries = ["-ip", "-netdetect"] + (
        ["-gateway"] if any(setting.get("gateway") for setting in settings) else []
    )
    outcome = _outcome(read_devices(tool, devices, queries, run))
    if outcome["failed_reads"]:
        return dict(outcome, changed=False), ""
    needed = [dict(change, line=change_line(change)) for change in changes(settings, outcome["devices"])]
    outcome["changes"] = needed
    diff = {
        "before": "".join(f"device {c['device']} {c['setting']}: {c['current']}\n" for c in needed),
        "after": "".join(f"device {c['device']} {c['setting']}: {c['wanted']}\n" for c in needed),
    }
    if check or not needed:
        return dict(outcome, changed=bool(needed), diff=diff), ""
    for change in needed:
        argv = [tool, "-i", str(change["device"]), *[str(arg) for arg in change["args"]]]
        rc, out, err = run(argv)
        if rc != 0:
            why = f"device {change['device']}: `{' '.join(argv)}` failed (rc {rc}): {(err or out).strip()}"
            return dict(outcome, changed=bool(outcome["applied"])), why
        outcome["applied"].append(argv)
    return dict(outcome, changed=True, diff=diff), ""
