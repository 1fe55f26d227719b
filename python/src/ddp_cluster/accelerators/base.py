"""The interface of an accelerator kind: every fact about one kind that the roles, the job and the ranks need,
in one frozen :class:`Accelerator` that its module (``cpu``, ``gpu``, ``npu``) declares and the registry
(:mod:`ddp_cluster.accelerators`) lists.

Jinja reads :meth:`Accelerator.facts` through the ``ddp_accelerator`` filter; the ranks read the fields. No
torch: the torch device type is a name (``torch.<device>`` is the kind's torch module: ``device_count``,
``set_device``, ``synchronize``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ddp_cluster.errors import DdpClusterError


class UnknownAccelerator(DdpClusterError, ValueError):
    """An accelerator kind or torch device type that no module of the registry declares."""


class TopologyError(DdpClusterError, ValueError):
    """A topology output, binding or device list that does not say which CPUs a device has; the message names
    what is missing."""


@dataclass(frozen=True)
class Accelerator:
    """One accelerator kind. Only ``name``, ``device`` and ``backends`` are required: a kind leaves out what
    it does not have (no topology tool, no host role, any number of processes per node)."""

    # cluster_accelerator's value for it.
    name: str
    # torch's device type (``torch.device(device)``, DDP_DEVICE, train.yml's -e device).
    device: str
    # The collective backends that can move its tensors, the default (DDP_BACKEND, --backend auto) first.
    backends: tuple[str, ...]
    # The variable that lists a process's devices (a rank's device is its local_rank-th entry).
    visible_variable: str = ""
    # The container runtime the node is created with where the server's engine has it ('': the engine's
    # default), and the variable that names the node's devices to that runtime (the container's environment).
    container_runtime: str = ""
    runtime_visible_variable: str = ""
    # The variables the collectives read to pick the cluster's interface (node.env).
    interface_variables: tuple[str, ...] = ("GLOO_SOCKET_IFNAME",)
    # The vendor's topology tool (argv) and its reader: {device: the CPU list of its NUMA node}.
    topology_argv: tuple[str, ...] = ()
    affinity: Callable[[str], dict[int, str]] | None = None
    # Host device paths passed to the node where the host has them (InfiniBand).
    host_devices: tuple[str, ...] = ()
    # The node's own device files: the prefix of each device's file (its id appended) and the files every node
    # needs besides them; empty where a container toolkit hands the devices over.
    device_file_prefix: str = ""
    manager_devices: tuple[str, ...] = ()
    # Without the vendor's runtime the node mounts the driver's host paths itself
    # (node_container_ascend_mounts).
    driver_mounts: bool = False
    # The node shares the host's IPC namespace with memlock unlimited (the vendors' container guides).
    shares_host_ipc: bool = False
    # Processes per node the collective library accepts (empty: any number).
    nproc_choices: tuple[int, ...] = ()
    # The cluster has a device-IP plan (one address per device NIC), checked in preflight, used by the job.
    device_ip_plan: bool = False
    # The roles that prepare and check a server of this kind (the hosts stage), in order, and the role task
    # files that check their settings in preflight: (role, tasks file).
    host_roles: tuple[str, ...] = ()
    preflight: tuple[tuple[str, str], ...] = ()
    # The Python module that registers the device with torch (imported before torch.<device> exists), what it
    # is and what to check when it does not import (a rank's message).
    adapter: str = ""
    adapter_about: str = ""
    adapter_fix: str = ""
    # Launchers that only this kind's adapter brings (train.yml -e launcher=...).
    launchers: tuple[str, ...] = ()
    # Variables a rank sets for itself unless the site set them.
    rank_environment: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def backend(self) -> str:
        """The collective backend a job on this kind uses by default."""
        return self.backends[0]

    @property
    def topology_tool(self) -> str:
        """The topology tool's command line, for messages."""
        return " ".join(self.topology_argv)

    def cpu_affinity(self, text: str) -> dict[int, str]:
        """{device: its CPU list} from what :attr:`topology_argv` printed; TopologyError naming what is
        missing."""
        if self.affinity is None:
            raise TopologyError(f"accelerator {self.name!r} has no topology tool")
        return self.affinity(text)

    def facts(self) -> dict[str, Any]:
        """Every fact as plain data (lists, not tuples; no callables): what the ``ddp_accelerator`` filter
        answers."""
        return {
            "name": self.name,
            "device": self.device,
            "backend": self.backend,
            "backends": list(self.backends),
            "visible_variable": self.visible_variable,
            "container_runtime": self.container_runtime,
            "runtime_visible_variable": self.runtime_visible_variable,
            "interface_variables": list(self.interface_variables),
            "topology_argv": list(self.topology_argv),
            "topology_tool": self.topology_tool,
            "binds_cpus": self.affinity is not None,
            "host_devices": list(self.host_devices),
            "device_file_prefix": self.device_file_prefix,
            "manager_devices": list(self.manager_devices),
            "driver_mounts": self.driver_mounts,
            "shares_host_ipc": self.shares_host_ipc,
            "nproc_choices": list(self.nproc_choices),
            "device_ip_plan": self.device_ip_plan,
            "host_roles": list(self.host_roles),
            "preflight": [{"role": role, "tasks": tasks} for role, tasks in self.preflight],
            "adapter": self.adapter,
            "adapter_about": self.adapter_about,
            "adapter_fix": self.adapter_fix,
            "launchers": list(self.launchers),
            "rank_environment": dict(self.rank_environment),
        }
