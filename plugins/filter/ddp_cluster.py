"""Filters over the ``ddp_cluster`` package: NPU device-IP plans, device NIC settings, port ranges, addresses.

The playbooks call the same code as ``ddp-cluster ip-plan check`` and ``ddp-cluster hccn``; the logic is
``ddp_cluster.inventory`` (the inventory's hosts and their NPU plan) and ``ddp_cluster.ascend.ports``. The
package is imported from ``python/src`` next to this file when it is not installed, so the controller needs no
install.

Plans built from the inventory (every host of the group contributes one server)::

    {{ hostvars | ddp_npu_plan_check(groups['nodes'], npu_product, npu_device_netmask) }}   -> violations
    {{ hostvars | ddp_npu_plan(groups['nodes'], npu_product, npu_device_netmask) }}   -> plan, seeds expanded
    {{ plan | ddp_hccn_device_settings(inventory_hostname, detect_ips, gateways) }}   -> per-device settings
    {{ violations | ddp_ip_plan_report('error') }}, {{ violations | ddp_ip_plan_lines('warning') }}

Hosts: ``hostvars | ddp_node_addresses(hosts)`` (where each node is reached, as IP addresses),
``hostvars | ddp_ssh_targets(hosts)`` (the controller's ssh argv per server); ``ddp_port_ranges`` (port lists
merged as the kernel writes them).

Settings that export variables: ``{'node_container_env': node_container_env} | ddp_env_name_problems`` (a
message naming each name that is not a shell name, '' when none).
"""

from __future__ import annotations

import functools
import site
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from ansible.errors import AnsibleFilterError

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.ascend import ports
from ddp_cluster.errors import DdpClusterError
from ddp_cluster.inventory import envnames, hostvars, npu

P = ParamSpec("P")
R = TypeVar("R")


def _filter(function: Callable[P, R]) -> Callable[P, R]:
    """FUNCTION with the package's errors raised as Ansible's, so a task fails with the message alone."""

    @functools.wraps(function)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except DdpClusterError as error:
            raise AnsibleFilterError(str(error)) from None

    return call


npu_plan_check = npu.plan_check  # never raises: every problem is a violation
npu_plan = _filter(npu.plan)
violation_lines = npu.violation_lines
violation_report = npu.violation_report
hccn_device_settings = _filter(npu.device_settings)
port_ranges = _filter(ports.port_ranges)
node_addresses = _filter(hostvars.node_addresses)
ssh_targets = hostvars.ssh_targets
env_name_problems = envnames.check_names  # never raises: a message, '' when every name is one


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
            "ddp_env_name_problems": env_name_problems,
        }
