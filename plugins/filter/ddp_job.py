"""Filters of the job launcher: argument splitting, the node probe, the launcher's command line, the job's rank
table."""

from __future__ import annotations

import ipaddress
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

try:
    from ddp_cluster import job, ranktable
except ImportError:  # a checkout without the package installed: use the sources next to this plugin
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "src"))
    from ddp_cluster import job, ranktable


def ddp_split_args(value: Any) -> list[str]:
    """A script's arguments as a list: a list stays, a string is split the way a shell would."""
    if value is None or value == "":
        return []
    if isinstance(value, (list, tuple)):
        return [str(part) for part in value]
    try:
        return shlex.split(str(value))
    except ValueError as error:
        raise AnsibleFilterError(f"script_args={value!r} cannot be split like a shell would: {error}") from error


def ddp_job_probe(text: Any) -> dict[str, Any]:
    """What the node probe printed (``key: value`` lines): the node's interface, its IPv4 addresses on it (CIDR
    form), whatever listens on the master port, and the CPUs each device's ranks are bound to (DDP_CPU_BINDING,
    empty when unbound)."""
    probe: dict[str, Any] = {"interface": "", "addresses": [], "listening": "", "cpu_binding": ""}
    for line in str(text or "").splitlines():
        key, _, value = line.partition(": ")
        if key == "interface":
            probe["interface"] = value.strip()
        elif key == "address" and value.strip():
            probe["addresses"].append(value.strip())
        elif key == "cpu-binding":
            probe["cpu_binding"] = value.strip()
        elif key == "listening":
            probe["listening"] = (probe["listening"] + "\n" + value.strip()).strip()
    return probe


def ddp_job_networks(addresses: Sequence[Any]) -> list[str]:
    """The networks (CIDR) of the job's nodes' cluster addresses, in order, each once: what mpirun's
    ``btl_tcp_if_include`` / ``oob_tcp_if_include`` take, so that every node uses its own interface, whatever
    its name."""
    networks: list[str] = []
    for address in addresses:
        try:
            network = str(ipaddress.ip_interface(str(address)).network)
        except ValueError as error:
            raise AnsibleFilterError(f"{address!r} is not an address with a prefix (10.0.0.5/24): {error}") from error
        if network not in networks:
            networks.append(network)
    return networks


def ddp_job_rank_table(
    plan: Mapping[str, Any], nodes: Sequence[str], nproc_per_node: Any, visible: Mapping[str, Any] | None = None
) -> str:
    """The job's own HCCL rank table (JSON text): its nodes in job order, the first as master, and on each the
    first ``nproc_per_node`` visible devices (see :func:`ddp_cluster.ranktable.job_rank_table`)."""
    try:
        table = ranktable.job_rank_table_dict(plan, [str(node) for node in nodes], int(nproc_per_node), visible)
    except (ValueError, TypeError) as error:
        raise AnsibleFilterError(f"the job's rank table cannot be made: {error}") from error
    return ranktable.dumps(table)


def ddp_job_visible_devices(hostvars: Mapping[str, Any], nodes: Sequence[str]) -> dict[str, str]:
    """Each node's ASCEND_RT_VISIBLE_DEVICES from its ``node_container_env`` (empty: every device)."""
    visible: dict[str, str] = {}
    for node in nodes:
        variables = hostvars.get(str(node), {})
        env = variables.get("node_container_env") if hasattr(variables, "get") else None
        value = env.get("ASCEND_RT_VISIBLE_DEVICES", "") if isinstance(env, Mapping) else ""
        visible[str(node)] = str(value or "")
    return visible


def ddp_hccn_ping_targets(
    plan: Mapping[str, Any], nodes: Sequence[str], nproc_per_node: Any, visible: Mapping[str, str]
) -> dict[str, list[dict[str, Any]]]:
    """For each of the job's nodes, the devices to ping with hccn_tool: each of its job's devices (the first
    nproc_per_node of its ASCEND_RT_VISIBLE_DEVICES, else 0..nproc_per_node-1) to the same device of the next
    node on the ring (with two nodes, each the other), at the address the device-IP plan gives that device."""
    addresses = {str(server["host"]): list(server.get("device_ips") or []) for server in plan.get("servers", [])}
    count = int(nproc_per_node)

    def devices(node: str) -> list[int]:
        listed = [part.strip() for part in str(visible.get(node) or "").split(",") if part.strip()]
        return [int(part) for part in listed[:count]] if listed else list(range(count))

    targets: dict[str, list[dict[str, Any]]] = {}
    order = [str(node) for node in nodes]
    for index, node in enumerate(order):
        peer = order[(index + 1) % len(order)]
        targets[node] = []
        if peer == node:
            continue
        for local, (device, peer_device) in enumerate(zip(devices(node), devices(peer), strict=False)):
            peer_ips = addresses.get(peer, [])
            if peer_device >= len(peer_ips):
                raise AnsibleFilterError(
                    f"{peer} has no address for device {peer_device} in the device-IP plan (npu_device_ips or"
                    " npu_device_ip_seed with npu_device_count)"
                )
            targets[node].append(
                {
                    "device": device,
                    "local_rank": local,
                    "peer": peer,
                    "peer_device": peer_device,
                    "address": peer_ips[peer_device],
                }
            )
    return targets


def _launch(
    plan: Mapping[str, Any],
    job_dir: str,
    networks: Sequence[str],
    env: Mapping[str, Any] | None,
    mpirun_args: Sequence[str],
    launcher_ports: str,
    poll: Any = 0.5,
) -> tuple[Any, list[str]]:
    """The job's spec and its launcher's argv; AnsibleFilterError naming what is wrong."""
    try:
        spec = job.from_plan(plan, job_dir, networks, env, mpirun_args, launcher_ports, float(poll))
    except (job.JobSpecError, TypeError) as error:
        raise AnsibleFilterError(f"the job cannot be planned: {error}") from error
    try:
        return spec, spec.launch_argv()
    except job.JobSpecError as error:
        raise AnsibleFilterError(str(error)) from error


def ddp_launch_argv(
    plan: Mapping[str, Any],
    job_dir: str,
    networks: Sequence[str],
    env: Mapping[str, Any] | None = None,
    mpirun_args: Sequence[str] = (),
    launcher_ports: str = "",
) -> list[str]:
    """The launcher's argv (see :meth:`ddp_cluster.job.JobSpec.launch_argv`), started on the first node."""
    return _launch(plan, job_dir, networks, env, mpirun_args, launcher_ports)[1]


def ddp_job_spec(
    plan: Mapping[str, Any],
    job_dir: str,
    networks: Sequence[str],
    env: Mapping[str, Any] | None = None,
    mpirun_args: Sequence[str] = (),
    launcher_ports: str = "",
    poll: Any = 0.5,
) -> str:
    """The job's ``job.json`` (see :class:`ddp_cluster.job.JobSpec`): checked, and its launch buildable."""
    text: str = _launch(plan, job_dir, networks, env, mpirun_args, launcher_ports, poll)[0].dumps()
    return text


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def ddp_report_text(lines: Sequence[object]) -> str:
    """Lines joined for a message that the YAML callback prints as a block, each line as it is: a tab, a control
    character or a trailing space anywhere makes it fall back to one quoted, folded line with \\n escapes."""
    return "\n".join(CONTROL.sub("", str(line).expandtabs(4)).rstrip() for line in lines)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "ddp_split_args": ddp_split_args,
            "ddp_report_text": ddp_report_text,
            "ddp_job_probe": ddp_job_probe,
            "ddp_hccn_ping_targets": ddp_hccn_ping_targets,
            "ddp_job_networks": ddp_job_networks,
            "ddp_job_rank_table": ddp_job_rank_table,
            "ddp_job_visible_devices": ddp_job_visible_devices,
            "ddp_launch_argv": ddp_launch_argv,
            "ddp_job_spec": ddp_job_spec,
        }
