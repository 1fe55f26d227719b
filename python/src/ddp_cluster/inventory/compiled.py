"""The cluster compiled once on the controller: what every host used to recompute from every other host's
variables (an O(N^2) scan of ``hostvars`` per run), computed in one pass over each node's inventory variables.

:func:`compile_cluster` reads each node's variables exactly once and gives the peers the firewall lets through
(every node's address, collapsed into the fewest CIDR networks), the hosts file, the pinned known_hosts (from
the host keys the node records hold), the NPU device-IP plan checked and expanded once with each node's device
settings, ``net.core.somaxconn`` for the cluster's size, and per node a digest of its inventory variables.
:meth:`Compiled.write` keeps them as files under ``~/.ddp-cluster/<cluster>/compiled/`` (a controller cache:
read, compared, written only where the content differs); :meth:`Compiled.fact` is the small cluster-wide fact
``ddp_cluster`` the roles read instead of ``hostvars``. A node's own entry is ``nodes/<node>.json``.

The variables are the inventory's as Ansible holds them (host, group and extra vars), untemplated: the
action (plugins/action/ddp_cluster_compile.py) templates the few names read here when they hold a template.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_cluster.ascend import hccn
from ddp_cluster.files import write_atomic
from ddp_cluster.inventory import hostvars, npu, slurm
from ddp_cluster.inventory.hostvars import InventoryError, host_var, plain

SCHEMA = 1
HEADER_KNOWN_HOSTS = (
    "# Managed by ddp-cluster (ssh_mesh role): every node of the cluster, pinned. Do not edit.\n"
)
HEADER_HOSTS = "# Managed by ddp-cluster: every node of the cluster and its address.\n"
# The variables this module reads (the action templates these when an inventory gives them as templates).
READ_NAMES = (
    "ansible_host",
    "ansible_connection",
    "node_container_address",
    npu.HOST_IP_VAR,
    npu.DEVICE_IPS_VAR,
    npu.SEED_VAR,
    npu.COUNT_VAR,
    "cluster_nproc_per_node",
)
# Ansible's magic variables and what a run adds: none is the inventory's say about a node. group_names is
# kept (a node moved to another group must converge again).
MAGIC_NAMES = frozenset(
    {
        "ansible_check_mode",
        "ansible_collection_name",
        "ansible_config_file",
        "ansible_dependent_role_names",
        "ansible_diff_mode",
        "ansible_facts",
        "ansible_forks",
        "ansible_inventory_sources",
        "ansible_limit",
        "ansible_local",
        "ansible_play_batch",
        "ansible_play_hosts",
        "ansible_play_hosts_all",
        "ansible_play_name",
        "ansible_play_role_names",
        "ansible_playbook_python",
        "ansible_role_name",
        "ansible_role_names",
        "ansible_run_tags",
        "ansible_search_path",
        "ansible_skip_tags",
        "ansible_verbosity",
        "ansible_version",
        "environment",
        "groups",
        "hostvars",
        "inventory_dir",
        "inventory_file",
        "inventory_hostname",
        "inventory_hostname_short",
        "module_setup",
        "omit",
        "play_hosts",
        "playbook_dir",
        "role_name",
        "role_names",
        "role_path",
        "role_uuid",
        "vars",
    }
)
# Extra vars that steer one run and say nothing of what a node should be.
RUN_CONTROL_NAMES = frozenset(
    {
        "force",
        "wait",
        "converge",
        "nodes",
        "max_fail_percent",
        "max_fail_percentage",
        "job",
        "job_id",
        "attach",
        "follow",
    }
)
# The groups site.yml adds the servers to during a run (add_host).
RUN_GROUP_PREFIX = "ddp_converge"
# The largest rank count per node assumed when the inventory gives none (an 8-accelerator server).
DEFAULT_RANKS_PER_NODE = 8
SOMAXCONN_MIN, SOMAXCONN_MAX = 4096, 65535


def inventory_vars(variables: Mapping[str, Any], drop: Collection[str] = ()) -> dict[str, Any]:
    """A node's own say, as plain data, from Ansible's variables of the host (``HostVars.raw_get``): less
    the magic names, private names (``_x``: role internals, registered results), the project's facts
    (``ddp_*``), run-control extra vars and DROP (the names a run set: facts, set_fact, register). The
    groups a run adds a node to (site.yml's ddp_converge, ddp_converge_mesh) are not its say either: a
    compile after them gives the same digest as one before."""
    found = {
        str(name): plain(value)
        for name, value in variables.items()
        if name not in MAGIC_NAMES
        and name not in RUN_CONTROL_NAMES
        and name not in drop
        and not str(name).startswith(("_", "ddp_", "discovered_"))
    }
    if isinstance(found.get("group_names"), list):
        found["group_names"] = [g for g in found["group_names"] if not str(g).startswith(RUN_GROUP_PREFIX)]
    return found


def read_nodes(
    nodes: Sequence[str],
    raw_of: Callable[[str], Mapping[str, Any]],
    templated: Callable[[str, str], Any],
    drop_of: Callable[[str], Collection[str]] = lambda node: (),
) -> dict[str, dict[str, Any]]:
    """Each node's :func:`inventory_vars`, its variables read once (RAW_OF: ``HostVars.raw_get``); a name
    this module reads that holds a template is taken as Ansible templates it (TEMPLATED(node, name)), so an
    inventory's ``ansible_host: "{{ ... }}"`` gives the same address as before. DROP_OF(node): the names a
    run set on the node (facts, set_fact, register)."""
    found = {}
    for node in nodes:
        variables = inventory_vars(raw_of(node), drop_of(node))
        for name in READ_NAMES:
            value = variables.get(name)
            if isinstance(value, str) and ("{{" in value or "{%" in value):
                variables[name] = plain(templated(node, name))
        found[str(node)] = variables
    return found


def digest(value: Any) -> str:
    """sha256 of VALUE's canonical JSON (sorted keys; what JSON cannot hold as its str)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def collapse(addresses: Sequence[str]) -> list[str]:
    """The fewest CIDR networks that hold exactly ADDRESSES (IPv4 first, then IPv6)."""
    networks = [ipaddress.ip_network(address) for address in addresses]
    v4 = [network for network in networks if isinstance(network, ipaddress.IPv4Network)]
    v6 = [network for network in networks if isinstance(network, ipaddress.IPv6Network)]
    collapsed = [str(network) for network in ipaddress.collapse_addresses(v4)]
    collapsed += [str(network) for network in ipaddress.collapse_addresses(v6)]
    return collapsed


def somaxconn(nodes: int, ranks_per_node: int) -> int:
    """The listen backlog a node hosting the job's store needs: two connections per rank, within Linux's
    range (4096, the kernel default since 5.4, to 65535)."""
    return min(SOMAXCONN_MAX, max(SOMAXCONN_MIN, 2 * nodes * ranks_per_node))


@dataclass(frozen=True)
class NpuSettings:
    """The cluster-wide NPU settings (hccn_network's defaults: npu_product, npu_device_netmask,
    npu_device_detect_ips, npu_device_gateways)."""

    product: Any
    netmask: Any
    detect_ips: Any = None
    gateways: Any = None

    @classmethod
    def of(cls, given: Mapping[str, Any] | None, read: Callable[[str, Any], Any]) -> NpuSettings | None:
        """The settings GIVEN (the action's npu argument; None: not an npu cluster), each missing one
        READ(name, default) from the inventory, as hccn_network's defaults take them."""
        if given is None:
            return None
        return cls(
            given.get("product", read("npu_product", None)),
            given.get("netmask", read("npu_device_netmask", None)),
            given.get("detect_ips", read("npu_device_detect_ips", [])),
            given.get("gateways", read("npu_device_gateways", [])),
        )


@dataclass(frozen=True)
class SlurmSettings:
    """The cluster-wide Slurm settings (the slurm role's): its controllers (empty: the first node), the
    accelerator (the GRES), the network mode (bridge: the nodes reach each other by name, no address in
    slurm.conf) and whether jobs are accounted in slurmdbd."""

    controllers: Sequence[str] = ()
    accelerator: str = "cpu"
    network_mode: str = "host"
    accounting: bool = False
    dbd_host: str = ""

    @classmethod
    def of(cls, read: Callable[[str, Any], Any]) -> SlurmSettings:
        """The settings as the inventory gives them, READ(name, default): slurm_controllers (a list, or one
        name), cluster_accelerator, cluster_network_mode."""
        given = read("slurm_controllers", None) or []
        return cls(
            controllers=[str(c) for c in given] if isinstance(given, list) else [str(given)],
            accelerator=str(read("cluster_accelerator", "cpu")),
            network_mode=str(read("cluster_network_mode", "host")),
        )


def _slurm(
    settings: SlurmSettings,
    cluster: str,
    names: Sequence[str],
    variables: Mapping[str, Mapping[str, Any]],
    addresses: Mapping[str, str],
) -> dict[str, Any]:
    """slurm.conf and gres.conf of the cluster (``conf``, ``gres``), or ``errors`` naming each fix."""
    nodes, errors = [], []
    for node in names:
        given = host_var(variables[node], "slurm_node_cpus") or host_var(
            variables[node], "cluster_nproc_per_node"
        )
        try:
            cpus = int(given if given is not None else 1)
            memory = int(host_var(variables[node], "slurm_node_memory_mb") or 0)
        except (TypeError, ValueError):
            errors.append(
                f"{node}: slurm_node_cpus, cluster_nproc_per_node and slurm_node_memory_mb must be numbers"
            )
            continue
        devices = (_ranks(variables[node]) or 0) if settings.accelerator in slurm.DEVICE_FILES else 0
        address = addresses.get(node, "") if settings.network_mode == "host" else ""
        nodes.append(slurm.SlurmNode(node, address, cpus, memory, devices))
    controllers = [str(c) for c in settings.controllers] or list(names[:1])
    described = slurm.SlurmCluster(
        slurm.cluster_name(cluster),
        nodes,
        controllers,
        str(settings.dbd_host or controllers[0] if controllers else ""),
        settings.accelerator,
        accounting=settings.accounting,
    )
    errors += slurm.check(described)
    if errors:
        return {"errors": errors, "controllers": controllers}
    return {
        "errors": [],
        "controllers": controllers,
        "conf": slurm.slurm_conf(described),
        "gres": slurm.gres_conf(described),
    }


@dataclass(frozen=True)
class Compiled:
    """The compiled cluster. ``nodes``: per node (inventory order) its entry for nodes/<node>.json."""

    cluster: str
    directory: Path
    code: str
    peers: list[str]
    addresses: dict[str, str]
    address_errors: list[str]
    somaxconn: int
    hosts: str
    known_hosts: str
    known_hosts_missing: list[str]
    networks: list[str]
    npu: dict[str, Any] | None
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # slurm.conf and gres.conf (``conf``, ``gres``) or the ``errors`` that keep Slurm off; None: not asked.
    slurm: dict[str, Any] | None = None

    def fact(self) -> dict[str, Any]:
        """The cluster-wide fact ``ddp_cluster`` (no per-node map: each host reads its own file)."""
        return {
            "dir": str(self.directory),
            "peers": self.peers,
            "somaxconn": self.somaxconn,
            "hosts_sha256": sha256(self.hosts),
            "known_hosts_sha256": sha256(self.known_hosts),
            "known_hosts_missing": self.known_hosts_missing,
            "address_errors": self.address_errors,
            "networks": self.networks,
            "npu": None if self.npu is None else {k: self.npu[k] for k in ("errors", "warnings")},
            "nodes": len(self.nodes),
            "code": self.code,
            **({} if self.slurm is None else {"slurm": self._slurm_fact()}),
        }

    def _slurm_fact(self) -> dict[str, Any]:
        assert self.slurm is not None
        return {
            "errors": self.slurm["errors"],
            "controllers": self.slurm["controllers"],
            "conf_sha256": sha256(self.slurm.get("conf", "") + self.slurm.get("gres", "")),
        }

    def files(self) -> dict[str, str]:
        """Each file's path relative to the directory, and its text."""
        cluster = {
            "schema": SCHEMA,
            "cluster": self.cluster,
            **self.fact(),
            "addresses": self.addresses,
            "npu": self.npu,
        }
        files = {
            "cluster.json": json.dumps(cluster, indent=1, sort_keys=True) + "\n",
            "hosts": self.hosts,
            "known_hosts": self.known_hosts,
        }
        if self.slurm and not self.slurm["errors"]:
            files["slurm.conf"] = self.slurm["conf"]
            files["gres.conf"] = self.slurm["gres"]
        for name, entry in self.nodes.items():
            files[f"nodes/{name}.json"] = json.dumps(entry, indent=1, sort_keys=True) + "\n"
        return files

    def write(self, directory: Path | None = None) -> bool:
        """Write the files under DIRECTORY (default: the compiled directory) where their content differs,
        and remove the entries of nodes no longer in the inventory; True when anything changed."""
        root = Path(directory or self.directory)
        changed = False
        wanted = self.files()
        for relative, text in wanted.items():
            path = root / relative
            data = text.encode()
            try:
                if path.read_bytes() == data:
                    continue
            except FileNotFoundError:
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomic(path, data)
            os.chmod(path, 0o644)
            changed = True
        for name in ("slurm.conf", "gres.conf"):  # a cluster Slurm cannot take keeps none
            if name not in wanted and (root / name).exists():
                (root / name).unlink()
                changed = True
        stale = root / "nodes"
        if stale.is_dir():
            for path in stale.glob("*.json"):
                if f"nodes/{path.name}" not in wanted:
                    path.unlink()
                    changed = True
        return changed


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _recorded(records_dir: Path, node: str) -> dict[str, Any]:
    """What the containers stage recorded of NODE (records_dir/NODE.json); {} when none or unreadable."""
    try:
        record = json.loads((records_dir / f"{node}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _ranks(variables: Mapping[str, Any]) -> int | None:
    """The most ranks the inventory gives this node (processes per node, device count), None when none."""
    counts = []
    for name in ("cluster_nproc_per_node", npu.COUNT_VAR):
        value = host_var(variables, name)
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            counts.append(int(value))
    device_ips = host_var(variables, npu.DEVICE_IPS_VAR)
    if isinstance(device_ips, list):
        counts.append(len(device_ips))
    return max(counts) if counts else None


def _npu(
    variables: Mapping[str, Mapping[str, Any]], nodes: Sequence[str], settings: NpuSettings
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The plan's errors and warnings, and each node's device settings and TLS devices (an ``error``
    instead when the plan or its settings do not fit)."""
    violations = npu.plan_check(variables, nodes, settings.product, settings.netmask)
    errors = [v for v in violations if v.get("severity", "error") == "error"]
    warnings = [v for v in violations if v.get("severity") == "warning"]
    summary = {
        "product": plain(settings.product),
        "netmask": plain(settings.netmask),
        "errors": errors,
        "warnings": warnings,
    }
    if errors:
        message = "the device-IP plan breaks its rules: " + "; ".join(npu.violation_lines(errors))
        return summary, {node: {"error": message} for node in nodes}
    whole = npu.plan(variables, nodes, settings.product, settings.netmask)
    detect, gateways = plain(settings.detect_ips), plain(settings.gateways)
    entries: dict[str, dict[str, Any]] = {}
    for server in whole["servers"]:
        node = str(server["host"])
        entry: dict[str, Any] = {"tls_devices": [str(d) for d in range(len(server["device_ips"]))]}
        try:
            entry["settings"] = hccn.device_settings(whole, node, detect, gateways)
        except hccn.HccnError as error:
            entry["error"] = str(error)
        entries[node] = entry
    return summary, entries


def compile_cluster(
    raw: Mapping[str, Mapping[str, Any]],
    nodes: Sequence[str],
    *,
    cluster: str,
    records_dir: Path,
    code: str = "",
    ssh_port: int = 22,
    host_key_type: str = "ed25519",
    npu_settings: NpuSettings | None = None,
    slurm_settings: SlurmSettings | None = None,
    directory: Path | None = None,
) -> Compiled:
    """The compiled cluster of NODES (the inventory's order), reading each node's variables in RAW once.

    records_dir: the node records (``~/.ddp-cluster/<cluster>/nodes``): their host keys and networks.
    code: the digest of the code a change of which must converge again. ssh_port, host_key_type: the mesh's
    sshd port and the host key type it pins. npu_settings: the plan's cluster-wide settings on an npu
    cluster, else None. slurm_settings: Slurm's cluster-wide settings (None: no slurm.conf). directory: where
    the files go (default: records_dir's sibling ``compiled``).
    """
    names = [str(node) for node in nodes]
    variables = {node: raw[node] for node in names}  # the one read of each node
    addresses: dict[str, str] = {}
    address_errors: list[str] = []
    for node in names:
        try:
            addresses.update(hostvars.node_addresses(variables, [node]))
        except InventoryError as error:
            address_errors.append(str(error))
    peers = collapse(list(addresses.values()))
    hosts = HEADER_HOSTS + "".join(f"{address} {node}\n" for node, address in addresses.items())

    port = int(ssh_port)
    lines, missing, networks = [HEADER_KNOWN_HOSTS], [], []
    for node in names:
        record = _recorded(records_dir, node)
        key = (record.get("host_keys") or {}).get(host_key_type)
        if key:
            lines.append(f"{node if port == 22 else f'[{node}]:{port}'} {key}\n")
        else:
            missing.append(node)
        network = record.get("network")
        if network and network not in networks:
            networks.append(str(network))

    ranks = [count for count in map(_ranks, variables.values()) if count is not None]
    npu_summary, npu_entries = (
        _npu(variables, names, npu_settings) if npu_settings is not None else (None, {})
    )
    entries = {
        node: {
            "index": index,
            "address": addresses.get(node),
            "inputs": digest(variables[node]),
            "npu": npu_entries.get(node),
        }
        for index, node in enumerate(names)
    }
    return Compiled(
        cluster=cluster,
        directory=Path(directory) if directory else Path(records_dir).parent / "compiled",
        code=code,
        peers=peers,
        addresses=addresses,
        address_errors=address_errors,
        somaxconn=somaxconn(len(names), max(ranks) if ranks else DEFAULT_RANKS_PER_NODE),
        hosts=hosts,
        known_hosts="".join(lines),
        known_hosts_missing=missing,
        networks=networks,
        npu=npu_summary,
        nodes=entries,
        slurm=None
        if slurm_settings is None
        else _slurm(slurm_settings, cluster, names, variables, addresses),
    )
