"""The NPU device-IP plan the inventory describes, every host of the group one server, checked and expanded
by :mod:`ddp_cluster.ascend.ipplan` (the same code as ``ddp-cluster ip-plan check``); and what hccn_tool
should set on one host's devices (:func:`ddp_cluster.ascend.hccn.device_settings`).

Per host, the inventory gives ``npu_host_ip`` (default: ``ansible_host``, else the inventory name) and either
``npu_device_ips`` (one address per device, device 0 first) or ``npu_device_ip_seed`` with
``npu_device_count`` (default 8), expanded as the vendor manuals lay addresses out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddp_cluster.ascend import hccn, ipplan
from ddp_cluster.inventory.hostvars import InventoryError, host_var, plain

HOST_IP_VAR = "npu_host_ip"
DEVICE_IPS_VAR = "npu_device_ips"
SEED_VAR = "npu_device_ip_seed"
COUNT_VAR = "npu_device_count"


def _violation(host: str | None, message: str) -> dict[str, Any]:
    return ipplan.Violation(host, None, "inventory", message).as_dict()


def server_of(hostvars: Mapping[str, Any], host: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One plan server from a host's inventory variables, and the problems found on the way (as violations
    with rule ``inventory``)."""
    if host not in hostvars:
        return {}, [_violation(host, "is not a host of the inventory")]
    variables = hostvars[host]
    problems: list[dict[str, Any]] = []
    try:
        host_ip = host_var(variables, HOST_IP_VAR) or host_var(variables, "ansible_host") or host
        device_ips = host_var(variables, DEVICE_IPS_VAR)
        seed = host_var(variables, SEED_VAR)
        count = host_var(variables, COUNT_VAR)
    except Exception as exc:  # an undefined variable inside a template, for example
        return {}, [_violation(host, f"its npu_* variables cannot be read: {exc}")]
    server: dict[str, Any] = {"host": host, "host_ip": str(host_ip)}
    if isinstance(device_ips, str):  # one address: a seed, as the vendors' tools expand it
        device_ips, seed = None, seed or device_ips
    if device_ips is not None and seed is not None:
        problems.append(_violation(host, f"set {DEVICE_IPS_VAR} or {SEED_VAR}, not both"))
    elif seed is not None:
        server["device_ip_seed"] = str(seed)
        if count is not None:
            server["device_count"] = count
    elif device_ips is not None:
        server["device_ips"] = device_ips
        if count is not None and isinstance(device_ips, list) and count != len(device_ips):
            message = f"{COUNT_VAR}={count} but {DEVICE_IPS_VAR} lists {len(device_ips)} addresses"
            problems.append(_violation(host, message))
    else:
        problems.append(
            _violation(
                host,
                f"no device addresses: set {DEVICE_IPS_VAR} (one address per device, device 0 first) "
                f"or {SEED_VAR} (with {COUNT_VAR}, default 8) in its host_vars",
            )
        )
    return server, problems


def raw_plan(
    hostvars: Mapping[str, Any], hosts: Iterable[str], product: Any, netmask: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The plan's plain data as the hosts give it (seeds not expanded), and the problems of the inventory."""
    servers, problems = [], []
    for host in plain(list(hosts)):
        server, found = server_of(hostvars, host)
        servers.append(server)
        problems += found
    return {"product": plain(product), "netmask": plain(netmask), "servers": servers}, problems


def plan_check(
    hostvars: Mapping[str, Any], hosts: Iterable[str], product: Any, netmask: Any
) -> list[dict[str, Any]]:
    """Every problem of the plan the inventory describes (server, device, rule, message, severity); never
    raises."""
    data, problems = raw_plan(hostvars, hosts, product, netmask)
    return problems or ipplan.check_plan_dict(data)


def plan(hostvars: Mapping[str, Any], hosts: Iterable[str], product: Any, netmask: Any) -> dict[str, Any]:
    """The plan the inventory describes, seeds expanded; InventoryError naming the host or key if it is
    malformed."""
    data, problems = raw_plan(hostvars, hosts, product, netmask)
    if problems:
        raise InventoryError("; ".join(f"{p['server']}: {p['message']}" for p in problems))
    try:
        return ipplan.normalize_plan_dict(data)
    except ipplan.IpPlanError as exc:
        raise InventoryError(f"the NPU device-IP plan is malformed: {exc}") from None


def violation_lines(violations: Iterable[Mapping[str, Any]], severity: str | None = None) -> list[str]:
    """One readable line per violation (of SEVERITY, or every one): ``error [rule] server S, device D:
    message``."""
    return [
        str(
            ipplan.Violation(
                v.get("server"), v.get("device"), v["rule"], v["message"], v.get("severity", "error")
            )
        )
        for v in violations
        if severity is None or v.get("severity") == severity
    ]


def violation_report(
    violations: Iterable[Mapping[str, Any]], severity: str | None = "error", indent: str = "  "
) -> str:
    """violation_lines as one text block, each line indented (for an assert's fail_msg)."""
    return "\n".join(indent + line for line in violation_lines(violations, severity))


def device_settings(
    plan: Any, host: str, detect_ips: Any = None, gateways: Any = None
) -> list[dict[str, Any]]:
    """What hccn_tool should set on each device of one host (see ddp_cluster.ascend.hccn.device_settings);
    InventoryError when the plan, the netdetect addresses or the gateways do not fit."""
    try:
        return hccn.device_settings(plain(plan), str(host), plain(detect_ips), plain(gateways))
    except hccn.HccnError as error:
        raise InventoryError(str(error)) from error
