"""Filters over the ``ddp_cluster`` package: NPU device-IP plans, device NIC settings, port ranges, addresses.

The playbooks call the same code as ``ddp-cluster ip-plan check`` and ``ddp-cluster hccn``. The package is
imported from ``python/src`` next to this file when it is not installed, so the controller needs no install.

Plans built from the inventory (every host of the group contributes one server)::

    {{ hostvars | ddp_npu_plan_check(groups['nodes'], npu_product, npu_device_netmask) }}   -> violations
    {{ hostvars | ddp_npu_plan(groups['nodes'], npu_product, npu_device_netmask) }}   -> plan, seeds expanded
    {{ plan | ddp_hccn_device_settings(inventory_hostname, detect_ips, gateways) }}   -> per-device settings

Per host, the inventory gives ``npu_host_ip`` (default: ``ansible_host``, else the inventory name) and
either ``npu_device_ips`` (one address per device, device 0 first) or ``npu_device_ip_seed`` with
``npu_device_count`` (default 8), expanded as the vendor manuals lay addresses out (see
``ddp_cluster.ascend.ipplan``).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import site
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.ascend import hccn, ipplan

HOST_IP_VAR = "npu_host_ip"
DEVICE_IPS_VAR = "npu_device_ips"
SEED_VAR = "npu_device_ip_seed"
COUNT_VAR = "npu_device_count"


def _plain(value: Any) -> Any:
    """Plain Python data (Ansible hands over tagged and lazy containers)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    return value


def _inventory_violation(host: str | None, message: str) -> dict[str, Any]:
    return ipplan.Violation(host, None, "inventory", message).as_dict()


def _host_var(variables: Mapping[str, Any], name: str) -> Any:
    if name not in variables:
        return None
    value = variables[name]  # HostVarsVars templates on access, in that host's context
    return None if value is None or value == "" else _plain(value)


def _server_from_hostvars(
    hostvars: Mapping[str, Any], host: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One plan server from a host's inventory variables, and the problems found on the way."""
    if host not in hostvars:
        return {}, [_inventory_violation(host, "is not a host of the inventory")]
    variables = hostvars[host]
    problems: list[dict[str, Any]] = []
    try:
        host_ip = _host_var(variables, HOST_IP_VAR) or _host_var(variables, "ansible_host") or host
        device_ips = _host_var(variables, DEVICE_IPS_VAR)
        seed = _host_var(variables, SEED_VAR)
        count = _host_var(variables, COUNT_VAR)
    except Exception as exc:  # an undefined variable inside a template, for example
        return {}, [_inventory_violation(host, f"its npu_* variables cannot be read: {exc}")]
    server: dict[str, Any] = {"host": host, "host_ip": str(host_ip)}
    if isinstance(device_ips, str):  # one address: a seed, as the vendors' tools expand it
        device_ips, seed = None, seed or device_ips
    if device_ips is not None and seed is not None:
        problems.append(_inventory_violation(host, f"set {DEVICE_IPS_VAR} or {SEED_VAR}, not both"))
    elif seed is not None:
        server["device_ip_seed"] = str(seed)
        if count is not None:
            server["device_count"] = count
    elif device_ips is not None:
        server["device_ips"] = device_ips
        if count is not None and isinstance(device_ips, list) and count != len(device_ips):
            problems.append(
                _inventory_violation(
                    host, f"{COUNT_VAR}={count} but {DEVICE_IPS_VAR} lists {len(device_ips)} addresses"
                )
            )
    else:
        problems.append(
            _inventory_violation(
                host,
                f"no device addresses: set {DEVICE_IPS_VAR} (one address per device, device 0 first) "
                f"or {SEED_VAR} (with {COUNT_VAR}, default 8) in its host_vars",
            )
        )
    return server, problems


def _raw_plan(
    hostvars: Mapping[str, Any], hosts: Iterable[str], product: Any, netmask: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    servers, problems = [], []
    for host in _plain(list(hosts)):
        server, found = _server_from_hostvars(hostvars, host)
        servers.append(server)
        problems += found
    return {"product": _plain(product), "netmask": _plain(netmask), "servers": servers}, problems


def npu_plan_check(
    hostvars: Mapping[str, Any], hosts: Iterable[str], product: Any, netmask: Any
) -> list[dict[str, Any]]:
    """Every problem of the plan the inventory describes (server, device, rule, message, severity); never
    raises."""
    plan, problems = _raw_plan(hostvars, hosts, product, netmask)
    if problems:
        return problems
    return ipplan.check_plan_dict(plan)


def npu_plan(hostvars: Mapping[str, Any], hosts: Iterable[str], product: Any, netmask: Any) -> dict[str, Any]:
    """The plan the inventory describes, seeds expanded; an error naming the host or key if it is
    malformed."""
    plan, problems = _raw_plan(hostvars, hosts, product, netmask)
    if problems:
        raise AnsibleFilterError("; ".join(f"{p['server']}: {p['message']}" for p in problems))
    try:
        return ipplan.normalize_plan_dict(plan)
    except ipplan.PlanError as exc:
        raise AnsibleFilterError(f"the NPU device-IP plan is malformed: {exc}") from None


def violation_lines(violations: Iterable[Mapping[str, Any]], severity: str | None = None) -> list[str]:
    """One readable line per violation: ``error [rule] server S, device D: message``."""
    lines = []
    for v in violations:
        if severity is not None and v.get("severity") != severity:
            continue
        lines.append(
            str(
                ipplan.Violation(
                    v.get("server"), v.get("device"), v["rule"], v["message"], v.get("severity", "error")
                )
            )
        )
    return lines


def violation_report(
    violations: Iterable[Mapping[str, Any]], severity: str | None = "error", indent: str = "  "
) -> str:
    """violation_lines as one text block, each line indented (for an assert's fail_msg)."""
    return "\n".join(indent + line for line in violation_lines(violations, severity))


def hccn_device_settings(
    plan: Any, host: str, detect_ips: Any = None, gateways: Any = None
) -> list[dict[str, Any]]:
    """What hccn_tool should set on each device of one host (see ddp_cluster.ascend.hccn.device_settings)."""
    try:
        return hccn.device_settings(_plain(plan), str(host), _plain(detect_ips), _plain(gateways))
    except hccn.HccnError as error:
        raise AnsibleFilterError(str(error)) from error


_PORT_ITEM = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def port_ranges(*specs: Any) -> str:
    """The union of port lists (``"8080,60000-60015"``, a port, a list of either), as the kernel writes it.

    net.ipv4.ip_local_reserved_ports reads back as sorted, merged ranges joined by commas, single ports alone;
    producing the same text keeps the sysctl task idempotent.
    """
    ports: set[int] = set()
    for spec in specs:
        items: Sequence[Any] = spec if isinstance(spec, (list, tuple)) else [spec]
        for item in items:
            for part in str("" if item is None else item).replace(" ", ",").split(","):
                if not part.strip():
                    continue
                match = _PORT_ITEM.match(part)
                if not match:
                    raise AnsibleFilterError(f"{part!r} is not a port or a port range (such as 60000-60015)")
                low = int(match.group(1))
                high = int(match.group(2) or low)
                if not 0 < low <= high <= 65535:
                    raise AnsibleFilterError(f"{part!r} is not a port range within 1-65535")
                ports.update(range(low, high + 1))
    ranges: list[str] = []
    ordered = sorted(ports)
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        low, high = ordered[start], ordered[end]
        ranges.append(str(low) if low == high else f"{low}-{high}")
        start = end + 1
    return ",".join(ranges)


def node_addresses(hostvars: Mapping[str, Any], hosts: Iterable[str]) -> dict[str, str]:
    """Where each node is reached on a host network, as an IP address: its node_container_address, else
    ansible_host, else its name; a name is resolved on the controller (IPv4 first), since /etc/hosts entries
    and firewall rules take addresses. Preflight then checks on each server that the address is on its
    interface.

    A node on the controller's own engine (connection local) with no address of its own shares the
    controller's network namespace: its address is the loopback's.

    Role defaults are not in hostvars, so an inventory's own setting is read here with the role's fallback
    order.
    """
    addresses = {}
    for host in hosts:
        variables = hostvars[host]
        given = _host_var(variables, "node_container_address") or _host_var(variables, "ansible_host")
        if given is None and _host_var(variables, "ansible_connection") == "local":
            addresses[str(host)] = "127.0.0.1"
            continue
        addresses[str(host)] = _resolve(str(host), str(given or host))
    return addresses


def _resolve(host: str, address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except OSError as error:
        raise AnsibleFilterError(
            f"{host}: its address {address!r} (node_container_address, else ansible_host, else the host's "
            f"name) does not resolve on the controller ({error}): give the server's IP address"
        ) from error
    found.sort(key=lambda entry: entry[0] != socket.AF_INET)
    return str(found[0][4][0])


def ssh_targets(hostvars: Mapping[str, Any], hosts: Iterable[str]) -> list[dict[str, Any]]:
    """How the controller's own ssh reaches each server as Ansible does: ansible_host, ansible_port,
    ansible_user, ansible_ssh_private_key_file, ansible_ssh_common_args and ansible_ssh_extra_args, the target
    last. Host-key checking stays on (a server's key must be pinned, as for Ansible); the rest comes from
    ~/.ssh/config."""
    targets = []
    for host in hosts:
        variables = hostvars[host]
        argv = ["ssh", "-o", "StrictHostKeyChecking=yes"]
        port = _host_var(variables, "ansible_port") or _host_var(variables, "ansible_ssh_port")
        if port is not None:
            argv += ["-p", str(port)]
        user = _host_var(variables, "ansible_user") or _host_var(variables, "ansible_ssh_user")
        if user is not None:
            argv += ["-l", str(user)]
        key = _host_var(variables, "ansible_ssh_private_key_file") or _host_var(
            variables, "ansible_private_key_file"
        )
        if key is not None:
            argv += ["-i", os.path.expanduser(str(key))]
        for name in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
            argv += shlex.split(str(_host_var(variables, name) or ""))
        argv.append(str(_host_var(variables, "ansible_host") or host))
        targets.append({"name": str(host), "ssh": argv})
    return targets


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "ddp_npu_plan_check": npu_plan_check,
            "ddp_npu_plan": npu_plan,
            "ddp_ip_plan_lines": violation_lines,
            "ddp_ip_plan_report": violation_report,
            "ddp_hccn_device_settings": hccn_device_settings,
            "ddp_port_ranges": port_ranges,
            "ddp_node_addresses": node_addresses,
            "ddp_ssh_targets": ssh_targets,
        }
