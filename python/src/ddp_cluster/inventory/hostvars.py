"""Hosts as the inventory describes them: their variables as plain data, where each node is reached on a host
network, and how the controller's own ssh reaches each server as Ansible does.

``hostvars`` is Ansible's (a mapping of host to its variables, templated on access) or any mapping of that
shape; role defaults are not in it, so a setting is read here with the role's own fallback order.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import socket
from collections.abc import Iterable, Mapping
from typing import Any

from ddp_cluster.errors import DdpClusterError


class InventoryError(DdpClusterError):
    """The inventory describes something that cannot be used; the message names the host and variable."""


def plain(value: Any) -> Any:
    """Plain Python data (Ansible hands over tagged and lazy containers)."""
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    return value


def host_var(variables: Mapping[str, Any], name: str) -> Any:
    """One host variable as plain data; None when it is unset or empty."""
    if name not in variables:
        return None
    value = variables[name]  # HostVarsVars templates on access, in that host's context
    return None if value is None or value == "" else plain(value)


def node_addresses(hostvars: Mapping[str, Any], hosts: Iterable[str]) -> dict[str, str]:
    """Where each node is reached on a host network, as an IP address: its node_container_address, else
    ansible_host, else its name; a name is resolved on the controller (IPv4 first), since /etc/hosts entries
    and firewall rules take addresses. Preflight then checks on each server that the address is on its
    interface.

    A node on the controller's own engine (connection local) with no address of its own shares the
    controller's network namespace: its address is the loopback's.
    """
    addresses = {}
    for host in hosts:
        variables = hostvars[host]
        given = host_var(variables, "node_container_address") or host_var(variables, "ansible_host")
        if given is None and host_var(variables, "ansible_connection") == "local":
            addresses[str(host)] = "127.0.0.1"
            continue
        addresses[str(host)] = resolve(str(host), str(given or host))
    return addresses


def resolve(host: str, address: str) -> str:
    """ADDRESS as an IP address, a name resolved here (IPv4 first); InventoryError naming HOST if it does not
    resolve."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except OSError as error:
        raise InventoryError(
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
        port = host_var(variables, "ansible_port") or host_var(variables, "ansible_ssh_port")
        if port is not None:
            argv += ["-p", str(port)]
        user = host_var(variables, "ansible_user") or host_var(variables, "ansible_ssh_user")
        if user is not None:
            argv += ["-l", str(user)]
        key = host_var(variables, "ansible_ssh_private_key_file") or host_var(
            variables, "ansible_private_key_file"
        )
        if key is not None:
            argv += ["-i", os.path.expanduser(str(key))]
        for name in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
            argv += shlex.split(str(host_var(variables, name) or ""))
        argv.append(str(host_var(variables, "ansible_host") or host))
        targets.append({"name": str(host), "ssh": argv})
    return targets
