"""Device-IP plans for Ascend NPU clusters, checked against the vendor's rules before any device is touched.

A plan is the data the inventory holds about the NPU device network::

    product: atlas-training          # atlas-training | atlas-a2 | atlas-a3
    netmask: 255.255.255.0           # one netmask for every device address, as `hccn_tool -ip -s` takes it
    servers:
      - host: node1                  # optional name, used in messages
        host_ip: 192.168.10.22       # the server's host address (HCCL_IF_IP, rank-table server_id)
        device_ips: [192.168.100.101, 192.168.101.101, ...]   # device 0, 1, ... in order
      - host_ip: 192.168.10.23
        device_ip_seed: 192.168.100.111   # or one address, expanded as below
        device_count: 8                   # with a seed only; default 8

The rules are those of the vendor manuals (the Ascend multi-node checklist, section "configure device IP"; the
Ascend PyTorch DDP manual gives the Atlas training ones too); the short ids are what violations carry:

* Atlas training series: devices 0/4, 1/5, 2/6 and 3/7 of a server share a subnet (``pair-subnet``),
  devices 0-3 are in four different subnets and so are 4-7 (``distinct-subnets``), and in a cluster the
  same device position on every server shares a subnet (``position-subnet``).
* Atlas A2 / A3 training series: "the NPUs of the nodes being in one subnet is enough" -- rule
  ``one-subnet``: every device of the cluster in one subnet (a plan has no gateways, so it cannot describe
  a routed device network).
* Every product: no address may clash (``ip-unique``) and addresses in one subnet must differ in their
  last 8 bits (``last-octet``; this only bites with netmasks wider than /24). Each address must also be a
  valid IPv4 address (``ip-valid``), neither the network nor the broadcast address of its subnet
  (``ip-host-part``), and no server's host address (``ip-is-host``). Host addresses must be valid and
  distinct (``host-ip``, ``host-ip-unique``), host names distinct (``host-unique``).
* Device counts (the Ascend multi-node checklist): collective communication takes 1/2/4/8 devices; Atlas
  training clusters need 1*n, 2*n, 4*n or 8*n NPUs (so 1, 2, 4 or 8 on every server), A2/A3 clusters (1~8)*n,
  where an uneven count per server "degrades performance"; ``hccn_tool -i`` takes 0~7. Rules ``device-count``
  and ``device-count-uniform`` (an error on Atlas training, a warning on A2/A3).

Seed expansion (``device_ip_seed``), as the manuals' own examples lay the addresses out:

* atlas-training, as the Ascend PyTorch DDP manual lays them out: ``192.168.100.101`` gives devices 0-3
  ``192.168.100.101``, ``192.168.101.101``, ``192.168.102.101``, ``192.168.103.101`` and devices 4-7
  ``192.168.100.100`` ... ``192.168.103.100``: device ``i`` lies ``i % 4`` subnets after the seed's subnet
  (the next /24 for 255.255.255.0, the next subnet of the plan's netmask in general), at the seed's host
  number minus ``i // 4``. A seed whose host number is 1 therefore puts devices 4-7 on network addresses; the
  check reports that.
* atlas-a2 / atlas-a3, as the Ascend multi-node checklist does: ``10.x.x.2`` gives devices 0-7 ``10.x.x.2``
  ... ``10.x.x.9``: device ``i`` is the seed plus ``i``.

Structural problems (not a mapping, a missing or unknown key, an unknown product, a netmask that is not a
dotted mask) raise :class:`IpPlanError`, whose message names the key. Problems with the addresses themselves
are :class:`Violation` objects from :func:`check_plan`, so one run reports all of them.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ddp_cluster.errors import DdpClusterError

PRODUCTS = ("atlas-training", "atlas-a2", "atlas-a3")
DEFAULT_DEVICE_COUNT = 8

PLAN_KEYS = ("product", "netmask", "servers")
SERVER_KEYS = ("host", "host_ip", "device_ips", "device_ip_seed", "device_count")

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class ProductRules:
    allowed_device_counts: frozenset[int]
    four_subnet_layout: bool  # True: the Atlas training 0/4, 1/5, 2/6, 3/7 layout; False: one subnet
    uneven_count_severity: str


PRODUCT_RULES: dict[str, ProductRules] = {
    "atlas-training": ProductRules(frozenset({1, 2, 4, 8}), True, ERROR),
    "atlas-a2": ProductRules(frozenset(range(1, 9)), False, WARNING),
    "atlas-a3": ProductRules(frozenset(range(1, 9)), False, WARNING),
}


# A ValueError too: the job's planner and the supervisor take a bad plan for what it is, a bad value.
class IpPlanError(DdpClusterError, ValueError):
    """The plan is not shaped like a plan: the message names the offending key."""


@dataclass(frozen=True)
class Server:
    host_ip: str
    device_ips: tuple[str, ...]
    host: str | None = None

    @property
    def label(self) -> str:
        """How messages name this server: its host name when the plan gives one, else its host address."""
        return self.host if self.host else self.host_ip


@dataclass(frozen=True)
class IpPlan:
    product: str
    netmask: str
    servers: tuple[Server, ...]

    @property
    def prefixlen(self) -> int:
        return netmask_prefixlen(self.netmask)


@dataclass(frozen=True)
class Violation:
    server: str | None  # Server.label; None for the plan as a whole
    device: int | None
    rule: str
    message: str
    severity: str = ERROR

    def as_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "device": self.device,
            "rule": self.rule,
            "message": self.message,
            "severity": self.severity,
        }

    def __str__(self) -> str:
        where = "plan" if self.server is None else f"server {self.server}"
        if self.device is not None:
            where += f", device {self.device}"
        return f"{self.severity} [{self.rule}] {where}: {self.message}"


# --- parsing ---------------------------------------------------------------------------------------------


def netmask_prefixlen(netmask: str) -> int:
    """The prefix length of a dotted netmask such as 255.255.255.0; IpPlanError if it is not one."""
    hint = "use a dotted netmask such as 255.255.255.0"
    try:
        mask = int(ipaddress.IPv4Address(netmask))
    except ValueError:
        raise IpPlanError(f"netmask: {netmask!r} is not a dotted netmask; {hint}") from None
    prefix = 32 - ((~mask & 0xFFFFFFFF).bit_length())
    if mask != (0xFFFFFFFF << (32 - prefix)) & 0xFFFFFFFF:
        raise IpPlanError(f"netmask: {netmask} has non-contiguous bits; {hint}")
    if not 1 <= prefix <= 30:
        raise IpPlanError(f"netmask: {netmask} (/{prefix}) leaves no room for device addresses; {hint}")
    return prefix


def expand_device_ip_seed(
    seed: str, product: str, netmask: str, count: int = DEFAULT_DEVICE_COUNT
) -> list[str]:
    """The device addresses a seed address stands for, laid out as the vendor manuals do.

    atlas-training (the Ascend PyTorch DDP manual): device ``i`` is ``i % 4`` subnets after the seed's subnet,
    at the seed's host number minus ``i // 4`` (192.168.100.101 -> 192.168.100.101, 192.168.101.101,
    192.168.102.101, 192.168.103.101, 192.168.100.100, ..., 192.168.103.100). atlas-a2/a3 (the Ascend
    multi-node checklist): the seed plus ``i``.
    """
    if product not in PRODUCT_RULES:
        raise IpPlanError(f"product: {product!r} is not one of {', '.join(PRODUCTS)}")
    try:
        base = int(ipaddress.IPv4Address(seed))
    except ValueError:
        raise IpPlanError(f"device_ip_seed: {seed!r} is not an IPv4 address") from None
    if count < 1:
        raise IpPlanError(f"device_count: {count} must be at least 1")
    subnet_size = 1 << (32 - netmask_prefixlen(netmask))
    four_subnets = PRODUCT_RULES[product].four_subnet_layout
    addresses = []
    for i in range(count):
        value = base + (i % 4) * subnet_size - i // 4 if four_subnets else base + i
        if not 0 <= value <= 0xFFFFFFFF:
            raise IpPlanError(f"device_ip_seed: {seed} with {count} devices runs past the IPv4 address space")
        addresses.append(str(ipaddress.IPv4Address(value)))
    return addresses


def _reject_unknown_keys(data: Mapping[Any, Any], allowed: Sequence[str], where: str) -> None:
    unknown = [str(key) for key in data if key not in allowed]
    if unknown:
        raise IpPlanError(
            f"{where}: unknown key {', '.join(repr(k) for k in unknown)}; allowed keys: {', '.join(allowed)}"
        )


def _text(data: Mapping[Any, Any], key: str, where: str, required: bool = True) -> str | None:
    if key not in data or data[key] is None:
        if required:
            raise IpPlanError(f"{where}: missing key {key!r}")
        return None
    value = data[key]
    if not isinstance(value, str):
        raise IpPlanError(f"{where}.{key}: expected a string, got {type(value).__name__} {value!r}")
    return value


def _count(value: Any, where: str) -> int:
    # Ansible templating may hand numbers over as strings.
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise IpPlanError(f"{where}: expected a whole number, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise IpPlanError(f"{where}: expected a whole number, got {value!r}") from None


def _server_from_dict(data: Any, index: int, product: str, netmask: str) -> Server:
    where = f"servers[{index}]"
    if not isinstance(data, Mapping):
        raise IpPlanError(f"{where}: expected a mapping with host_ip and device_ips, got {data!r}")
    _reject_unknown_keys(data, SERVER_KEYS, where)
    host = _text(data, "host", where, required=False)
    host_ip = _text(data, "host_ip", where)
    assert host_ip is not None
    seed = _text(data, "device_ip_seed", where, required=False)
    raw_ips = data.get("device_ips")
    if seed is not None:
        if raw_ips is not None:
            raise IpPlanError(f"{where}: give either device_ips or device_ip_seed, not both")
        count = DEFAULT_DEVICE_COUNT
        if data.get("device_count") is not None:
            count = _count(data["device_count"], f"{where}.device_count")
        try:
            device_ips = expand_device_ip_seed(seed, product, netmask, count)
        except IpPlanError as exc:
            raise IpPlanError(f"{where}.{exc}") from None
        return Server(host_ip=host_ip, device_ips=tuple(device_ips), host=host)
    if data.get("device_count") is not None:
        raise IpPlanError(f"{where}.device_count: only used with device_ip_seed; device_ips gives the count")
    if raw_ips is None:
        raise IpPlanError(f"{where}: missing key 'device_ips' (or 'device_ip_seed')")
    if isinstance(raw_ips, str) or not isinstance(raw_ips, Sequence):
        raise IpPlanError(
            f"{where}.device_ips: expected a list of addresses, got {raw_ips!r}; "
            "use device_ip_seed for a single seed address"
        )
    device_ips = []
    for position, address in enumerate(raw_ips):
        if not isinstance(address, str):
            raise IpPlanError(
                f"{where}.device_ips[{position}]: expected an address string, "
                f"got {type(address).__name__} {address!r}"
            )
        device_ips.append(address)
    return Server(host_ip=host_ip, device_ips=tuple(device_ips), host=host)


def plan_from_dict(data: Any) -> IpPlan:
    """Build a IpPlan from plain data (a parsed YAML file, Ansible variables); IpPlanError names a bad key."""
    if not isinstance(data, Mapping):
        raise IpPlanError(f"plan: expected a mapping with keys {', '.join(PLAN_KEYS)}, got {data!r}")
    if any(key in data for key in ("all", "children", "hosts", "ungrouped")) and "servers" not in data:
        raise IpPlanError(
            "this is an Ansible inventory, not a device-IP plan (product, netmask, servers: its format is in"
            " docs/jobs.md, Other entry points); site.yml checks an inventory's npu_device_ips and"
            " npu_device_ip_seed with the same rules: ansible-playbook -i INVENTORY site.yml --tags preflight"
        )
    _reject_unknown_keys(data, PLAN_KEYS, "plan")
    product = _text(data, "product", "plan")
    assert product is not None
    if product not in PRODUCT_RULES:
        raise IpPlanError(f"product: {product!r} is not one of {', '.join(PRODUCTS)}")
    netmask = _text(data, "netmask", "plan")
    assert netmask is not None
    netmask_prefixlen(netmask)
    servers = data.get("servers")
    if servers is None:
        raise IpPlanError("plan: missing key 'servers'")
    if isinstance(servers, str) or not isinstance(servers, Sequence) or not servers:
        raise IpPlanError(f"servers: expected a non-empty list of servers, got {servers!r}")
    return IpPlan(
        product=product,
        netmask=netmask,
        servers=tuple(_server_from_dict(s, i, product, netmask) for i, s in enumerate(servers)),
    )


def load_plan(path: str | Path) -> IpPlan:
    """Read a plan from a YAML file. OSError if it cannot be read, IpPlanError if it is not a valid plan."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:  # one line: where, and what the parser expected
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise IpPlanError(f"{path}: not valid YAML: {where}{problem}") from None
    return plan_from_dict(data)


def plan_to_dict(plan: IpPlan) -> dict[str, Any]:
    """Plain data for a plan, seeds expanded: what Ansible and `ddp-cluster ip-plan expand` hand on."""
    servers: list[dict[str, Any]] = []
    for server in plan.servers:
        entry: dict[str, Any] = {}
        if server.host:
            entry["host"] = server.host
        entry["host_ip"] = server.host_ip
        entry["device_ips"] = list(server.device_ips)
        servers.append(entry)
    return {"product": plan.product, "netmask": plan.netmask, "servers": servers}


# --- checking --------------------------------------------------------------------------------------------


def _ipv4(text: str) -> ipaddress.IPv4Address | None:
    try:
        return ipaddress.IPv4Address(text)
    except ValueError:
        return None


class _Checker:
    """Collects violations with a sort key, so the report reads server by server, device by device."""

    def __init__(self, plan: IpPlan) -> None:
        self.plan = plan
        self.prefix = plan.prefixlen
        self.rules = PRODUCT_RULES[plan.product]
        self.found: list[tuple[tuple[int, int, int], Violation]] = []
        # (server index, device) -> parsed address, for the addresses that parse
        self.addresses: dict[tuple[int, int], ipaddress.IPv4Address] = {}
        for s, server in enumerate(plan.servers):
            for d, text in enumerate(server.device_ips):
                address = _ipv4(text)
                if address is not None:
                    self.addresses[(s, d)] = address

    def add(
        self, server: int | None, device: int | None, rule: str, message: str, severity: str = ERROR
    ) -> None:
        label = None if server is None else self.plan.servers[server].label
        key = (-1 if server is None else server, -1 if device is None else device, len(self.found))
        self.found.append((key, Violation(label, device, rule, message, severity)))

    def subnet(self, address: ipaddress.IPv4Address) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network((int(address), self.prefix), strict=False)

    def name(self, server: int, device: int) -> str:
        return f"device {device} of {self.plan.servers[server].label}"

    def violations(self) -> list[Violation]:
        return [violation for _, violation in sorted(self.found, key=lambda item: item[0])]


def _majority(values: Iterable[Any]) -> Any:
    """The most common value; on a tie the one seen first (Counter keeps insertion order)."""
    return Counter(values).most_common(1)[0][0]


def _check_hosts(c: _Checker) -> None:
    seen_ips: dict[str, int] = {}
    seen_names: dict[str, int] = {}
    for s, server in enumerate(c.plan.servers):
        if _ipv4(server.host_ip) is None:
            c.add(s, None, "host-ip", f"host_ip {server.host_ip!r} is not a valid IPv4 address")
        elif server.host_ip in seen_ips:
            other = c.plan.servers[seen_ips[server.host_ip]].label
            c.add(s, None, "host-ip-unique", f"host_ip {server.host_ip} is also the host_ip of {other}")
        else:
            seen_ips[server.host_ip] = s
        if server.host:
            if server.host in seen_names:
                c.add(s, None, "host-unique", f"host name {server.host!r} appears twice in the plan")
            seen_names.setdefault(server.host, s)


def _check_device_counts(c: _Checker) -> None:
    allowed = sorted(c.rules.allowed_device_counts)
    counts = [len(server.device_ips) for server in c.plan.servers]
    for s, count in enumerate(counts):
        if count not in c.rules.allowed_device_counts:
            c.add(
                s,
                None,
                "device-count",
                f"{count} devices; {c.plan.product} allows {', '.join(map(str, allowed))} per server",
            )
    usual = _majority(counts)
    for s, count in enumerate(counts):
        if count != usual:
            consequence = (
                "Atlas training clusters need the same number (1*n, 2*n, 4*n or 8*n NPUs)"
                if c.rules.uneven_count_severity == ERROR
                else "uneven counts degrade performance (the Ascend multi-node checklist)"
            )
            c.add(
                s,
                None,
                "device-count-uniform",
                f"{count} devices while most servers have {usual}; {consequence}",
                c.rules.uneven_count_severity,
            )


def _check_addresses(c: _Checker) -> None:
    host_ips = {server.host_ip: server.label for server in c.plan.servers}
    first_use: dict[ipaddress.IPv4Address, tuple[int, int]] = {}
    for s, server in enumerate(c.plan.servers):
        for d, text in enumerate(server.device_ips):
            address = c.addresses.get((s, d))
            if address is None:
                c.add(s, d, "ip-valid", f"{text!r} is not a valid IPv4 address")
                continue
            subnet = c.subnet(address)
            if address in (subnet.network_address, subnet.broadcast_address):
                kind = "network" if address == subnet.network_address else "broadcast"
                c.add(s, d, "ip-host-part", f"{address} is the {kind} address of {subnet}")
            if text in host_ips:
                c.add(s, d, "ip-is-host", f"{address} is the host_ip of {host_ips[text]}")
            if address in first_use:
                c.add(s, d, "ip-unique", f"{address} is also {c.name(*first_use[address])}")
            else:
                first_use[address] = (s, d)
    # The Ascend multi-node checklist: addresses of one subnet must differ in their last 8 bits.
    by_subnet_octet: dict[tuple[ipaddress.IPv4Network, int], tuple[int, int]] = {}
    for (s, d), address in c.addresses.items():
        if first_use[address] != (s, d):
            continue  # a duplicate, already reported as ip-unique
        key = (c.subnet(address), int(address) & 0xFF)
        if key in by_subnet_octet:
            other = by_subnet_octet[key]
            c.add(
                s,
                d,
                "last-octet",
                f"{address} and {c.addresses[other]} ({c.name(*other)}) are both in {key[0]} and end in "
                f"{key[1]}; addresses in one subnet must differ in their last 8 bits",
            )
        else:
            by_subnet_octet[key] = (s, d)


def _check_four_subnet_layout(c: _Checker) -> None:
    for s, server in enumerate(c.plan.servers):
        count = len(server.device_ips)
        for d in range(4, min(count, 8)):
            low, high = c.addresses.get((s, d - 4)), c.addresses.get((s, d))
            if low is not None and high is not None and c.subnet(low) != c.subnet(high):
                c.add(
                    s,
                    d,
                    "pair-subnet",
                    f"{high} is in {c.subnet(high)} but device {d - 4} ({low}) is in {c.subnet(low)}; "
                    "devices 0/4, 1/5, 2/6 and 3/7 must share a subnet",
                )
        for group in (range(0, 4), range(4, 8)):
            seen: dict[ipaddress.IPv4Network, int] = {}
            for d in group:
                address = c.addresses.get((s, d))
                if address is None:
                    continue
                subnet = c.subnet(address)
                if subnet in seen:
                    c.add(
                        s,
                        d,
                        "distinct-subnets",
                        f"{address} is in {subnet} like device {seen[subnet]}; devices "
                        f"{group.start}-{group.stop - 1} must be in {len(group)} different subnets",
                    )
                else:
                    seen[subnet] = d
    # The same position on every server shares a subnet: compare each with the majority of the servers.
    if len(c.plan.servers) < 2:
        return
    positions = max(len(server.device_ips) for server in c.plan.servers)
    # On a tie (two servers), trust the device that keeps its own server's layout: the odd one out is the
    # device already reported for breaking it, not its healthy counterpart on the other server.
    suspect = {
        (s, v.device)
        for (s, _, _), v in c.found
        if v.rule in ("pair-subnet", "distinct-subnets", "ip-unique", "ip-host-part")
    }
    for d in range(positions):
        subnets = {s: c.subnet(a) for (s, dev), a in c.addresses.items() if dev == d}
        if len(set(subnets.values())) < 2:
            continue
        counts = Counter(subnets[s] for s in sorted(subnets))
        sound = Counter(subnets[s] for s in sorted(subnets) if (s, d) not in suspect)
        usual = max(counts, key=lambda subnet: (counts[subnet], sound[subnet]))
        for s in sorted(subnets):
            if subnets[s] != usual:
                c.add(
                    s,
                    d,
                    "position-subnet",
                    f"{c.addresses[(s, d)]} is in {subnets[s]} but device {d} of the other servers is in "
                    f"{usual}; the same device on every server must share a subnet",
                )


def _check_one_subnet(c: _Checker) -> None:
    subnets = {key: c.subnet(address) for key, address in sorted(c.addresses.items())}
    if len(set(subnets.values())) < 2:
        return
    usual = _majority(subnets.values())
    for (s, d), subnet in subnets.items():
        if subnet != usual:
            c.add(
                s,
                d,
                "one-subnet",
                f"{c.addresses[(s, d)]} is in {subnet} but the cluster's devices are in {usual}; "
                f"{c.plan.product} puts every NPU of the cluster in one subnet",
            )


CHECKS: tuple[Callable[[_Checker], None], ...] = (_check_hosts, _check_device_counts, _check_addresses)


def check_plan(plan: IpPlan) -> list[Violation]:
    """Every rule the plan breaks, ordered by server then device; empty when the plan is valid."""
    checker = _Checker(plan)
    for check in CHECKS:
        check(checker)
    if checker.rules.four_subnet_layout:
        _check_four_subnet_layout(checker)
    else:
        _check_one_subnet(checker)
    return checker.violations()


def errors(violations: Iterable[Violation]) -> list[Violation]:
    return [v for v in violations if v.severity == ERROR]


def check_plan_dict(data: Any) -> list[dict[str, Any]]:
    """check_plan for plain data, as an Ansible filter plugin calls it; never raises for bad input.

    Returns one dict per violation (server, device, rule, message, severity). A plan that is not shaped
    like a plan gives a single violation with rule ``plan-format`` and the IpPlanError message.
    """
    try:
        plan = plan_from_dict(data)
    except IpPlanError as exc:
        return [Violation(None, None, "plan-format", str(exc)).as_dict()]
    return [violation.as_dict() for violation in check_plan(plan)]


def normalize_plan_dict(data: Any) -> dict[str, Any]:
    """A plan's plain data with every seed expanded (IpPlanError for a malformed plan)."""
    return plan_to_dict(plan_from_dict(data))


# --- command line ----------------------------------------------------------------------------------------


def _summary(plan: IpPlan) -> str:
    counts = sorted({len(server.device_ips) for server in plan.servers})
    per_server = "/".join(map(str, counts))
    total = sum(len(server.device_ips) for server in plan.servers)
    return (
        f"{plan.product}, {len(plan.servers)} server(s) x {per_server} device(s), "
        f"{total} device addresses, netmask {plan.netmask}"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddp-cluster ip-plan",
        description="Check an Ascend NPU device-IP plan against the product's rules.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = commands.add_parser(
        "check", help="print every rule the plan breaks; exit 1 if any error, 0 if none, 2 on bad input"
    )
    check.add_argument("plan", metavar="PLAN.yml")
    expand = commands.add_parser("expand", help="print the plan with device_ip_seed entries expanded (YAML)")
    expand.add_argument("plan", metavar="PLAN.yml")
    return parser


def read_plan_or_report(path: str, prog: str) -> IpPlan | None:
    """load_plan for the command lines: on failure print why to stderr and return None."""
    try:
        return load_plan(path)
    except OSError as exc:
        print(f"{prog}: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
    except IpPlanError as exc:
        said = str(exc)
        print(f"{prog}: {said if said.startswith(f'{path}:') else f'{path}: {said}'}", file=sys.stderr)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help and on usage errors
        return exc.code if isinstance(exc.code, int) else 2
    plan = read_plan_or_report(args.plan, "ddp-cluster ip-plan")
    if plan is None:
        return 2
    violations = check_plan(plan)
    if args.command == "expand":
        print(yaml.safe_dump(plan_to_dict(plan), sort_keys=False, default_flow_style=False), end="")
        # the expansion is printed either way; a plan that breaks a rule is said so, and fails
        for violation in errors(violations):
            print(violation, file=sys.stderr)
        if broken := len(errors(violations)):
            print(f"{args.plan}: {broken} error(s): ddp-cluster ip-plan check says each", file=sys.stderr)
        return 1 if broken else 0
    for violation in violations:
        print(violation)
    n_errors = len(errors(violations))
    n_warnings = len(violations) - n_errors
    if n_errors:
        print(f"{args.plan}: {n_errors} error(s), {n_warnings} warning(s)")
        return 1
    print(f"OK {args.plan}: {_summary(plan)}" + (f", {n_warnings} warning(s)" if n_warnings else ""))
    return 0
