"""Slurm's configuration of a cluster, computed once on the controller from the compiled cluster:
``slurm.conf`` and ``gres.conf``, identical on every node (the node container is the Slurm node, named as in
the inventory).

Chosen for node containers that have no systemd and no cgroup of their own (Slurm 22.05, Debian's packages):
processes are tracked by their parent (``proctrack/linuxproc``: the default, cgroup, stops slurmd at its start
there), no task plugin, whole nodes per job (``select/cons_tres``, the partition ``OverSubscribe=EXCLUSIVE``:
cons_tres tracks the ``npu`` and ``gpu`` GRES, which select/linear does not), accounting to slurmdbd with the
job's comment kept (who submitted it). A node's CPUs, memory and devices are what the inventory gives or what
the node reported; a node that registers with less is invalid in Slurm, one with more is fine.

At scale (Slurm's big-system and high-throughput guides): ``TreeWidth`` Slurm's default (50: two hops reach
2,500 nodes) up to 2,500 nodes and the cube root of the count above; from 512 nodes ``MessageTimeout`` 30 s,
``SlurmdTimeout`` 300 s and the controller on a range of 4 ports.

Standard library only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
SLURMDBD_PORT = 6819
# srun's own listeners (its I/O from the job's steps), pinned so that a firewall can let them through.
SRUN_PORTS = (60001, 60100)
PARTITION = "ddp"
# Seconds between a job's SIGTERM and its SIGKILL at its time limit or cancel (the supervisor's clean stop).
KILL_WAIT = 30
STATE_DIR = "/var/lib/slurm/slurmctld"
SPOOL_DIR = "/var/lib/slurm/slurmd"
LOG_DIR = "/var/log/slurm"
# The accelerators' device files as the GRES name's files (Slurm: every File= must exist on the node).
DEVICE_FILES = {"npu": "/dev/davinci{index}", "gpu": "/dev/nvidia{index}"}
NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
LARGE = 512


class SlurmConfigError(ValueError):
    """The cluster cannot be written as Slurm's configuration; the message says what and how to fix it."""


@dataclass(frozen=True)
class SlurmNode:
    """One node as Slurm knows it: its inventory name, the address the others reach it at, its CPUs and
    memory (MB; 0: not known, Slurm's default), its accelerator's devices (0: none)."""

    name: str
    address: str
    cpus: int
    memory_mb: int = 0
    devices: int = 0


@dataclass(frozen=True)
class SlurmCluster:
    """What slurm.conf says of a cluster: its name, nodes (inventory order), controllers (the first runs, the
    others are backups), the slurmdbd host, the accelerator (cpu|gpu|npu)."""

    name: str
    nodes: Sequence[SlurmNode]
    controllers: Sequence[str]
    dbd_host: str
    accelerator: str = "cpu"
    state_dir: str = STATE_DIR
    kill_wait: int = KILL_WAIT
    # Jobs accounted in slurmdbd (sacct); False: no accounting storage.
    accounting: bool = True
    extra: Sequence[str] = field(default_factory=tuple)

    def address(self, node: str) -> str:
        for item in self.nodes:
            if item.name == node:
                return item.address
        return ""


def cluster_name(name: str) -> str:
    """Slurm's ClusterName for an inventory's cluster name: lower case, letters, digits and '_' (it names the
    accounting database's tables), at most 40 characters."""
    found = re.sub(r"[^a-z0-9_]", "_", name.lower()).strip("_")[:40]
    if not found or not found[0].isalpha():
        found = ("c_" + found)[:40]
    return found


def check(cluster: SlurmCluster) -> list[str]:
    """What is wrong with ``cluster`` for Slurm (each naming the fix); empty when nothing is."""
    errors = []
    if not NAME.match(cluster.name):
        errors.append(
            f"cluster name {cluster.name!r} is not a Slurm cluster name (lower case letters, digits and '_',"
            " starting with a letter, at most 40): set cluster_name"
        )
    names = [node.name for node in cluster.nodes]
    if not names:
        errors.append("the inventory's group nodes is empty: Slurm needs at least one node")
    for node in cluster.nodes:
        if not NODE_NAME.match(node.name):
            errors.append(f"node name {node.name!r} cannot be a Slurm node name: rename it in the inventory")
        if node.cpus < 1:
            errors.append(f"node {node.name}: CPUs {node.cpus} (at least 1)")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        errors.append(f"nodes named twice: {', '.join(duplicates)}")
    if not cluster.controllers:
        errors.append("no Slurm controller: set slurm_controllers (default: the first node)")
    for host in dict.fromkeys([*cluster.controllers, *([cluster.dbd_host] if cluster.accounting else [])]):
        if host not in names:
            errors.append(f"{host} (slurm_controllers or slurm_dbd_host) is not a node of the inventory")
    if len(set(cluster.controllers)) != len(cluster.controllers):
        errors.append("slurm_controllers names a node twice")
    if cluster.accelerator not in ("cpu", "gpu", "npu"):
        errors.append(f"cluster_accelerator {cluster.accelerator!r}: cpu, gpu or npu")
    return errors


def tree_width(nodes: int) -> int:
    """slurmd's message fan-out: Slurm's default (50: two hops reach 2,500 nodes) up to 2,500 nodes, then the
    cube root of the count (the big-system guide)."""
    return 50 if nodes <= 2500 else max(50, math.ceil(nodes ** (1 / 3)))


def slurm_conf(cluster: SlurmCluster) -> str:
    """slurm.conf's text for ``cluster`` (SlurmConfigError when :func:`check` finds anything)."""
    errors = check(cluster)
    if errors:
        raise SlurmConfigError("; ".join(errors))
    large = len(cluster.nodes) >= LARGE
    ports = f"{SLURMCTLD_PORT}-{SLURMCTLD_PORT + 3}" if large else str(SLURMCTLD_PORT)
    lines = [
        "# Managed by ddp-cluster (slurm role), the same on every node. Do not edit: site.yml writes it.",
        f"ClusterName={cluster.name}",
        *(
            f"SlurmctldHost={host}({cluster.address(host)})"
            if cluster.address(host)
            else f"SlurmctldHost={host}"
            for host in cluster.controllers
        ),
        "SlurmUser=slurm",
        "AuthType=auth/munge",
        "CryptoType=crypto/munge",
        f"SlurmctldPort={ports}",
        f"SlurmdPort={SLURMD_PORT}",
        f"SrunPortRange={SRUN_PORTS[0]}-{SRUN_PORTS[1]}",
        f"StateSaveLocation={cluster.state_dir}",
        f"SlurmdSpoolDir={SPOOL_DIR}",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        f"SlurmctldLogFile={LOG_DIR}/slurmctld.log",
        f"SlurmdLogFile={LOG_DIR}/slurmd.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # A node's CPUs, memory and devices are the inventory's (the processes per node as its CPUs), not what
        # slurmd finds in a container that shares its server's with others.
        "SlurmdParameters=config_overrides",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        f"KillWait={cluster.kill_wait}",
        "MinJobAge=300",
        f"TreeWidth={tree_width(len(cluster.nodes))}",
        f"MessageTimeout={30 if large else 10}",
        f"SlurmdTimeout={300 if large else 120}",
        "SlurmctldTimeout=120",
        *(
            [
                "AccountingStorageType=accounting_storage/slurmdbd",
                f"AccountingStorageHost={cluster.dbd_host}",
                f"AccountingStoragePort={SLURMDBD_PORT}",
                "AccountingStoreFlags=job_comment",
            ]
            if cluster.accounting
            else ["AccountingStorageType=accounting_storage/none"]
        ),
        "JobCompType=jobcomp/none",
        "SchedulerParameters=max_script_size=4194304",
    ]
    gres = cluster.accelerator if cluster.accelerator in DEVICE_FILES else ""
    if gres:
        lines.append(f"GresTypes={gres}")
    lines += list(cluster.extra)
    for node in cluster.nodes:
        words = [
            f"NodeName={node.name}",
            *([f"NodeAddr={node.address}"] if node.address else []),
            f"CPUs={node.cpus}",
        ]
        if node.memory_mb:
            words.append(f"RealMemory={node.memory_mb}")
        if gres and node.devices:
            words.append(f"Gres={gres}:{node.devices}")
        words.append("State=UNKNOWN")
        lines.append(" ".join(words))
    lines.append(
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE"
    )
    return "\n".join(lines) + "\n"


def gres_conf(cluster: SlurmCluster) -> str:
    """gres.conf's text: each node's accelerator devices as its GRES's files (none on a cpu cluster)."""
    lines = ["# Managed by ddp-cluster (slurm role), the same on every node. Do not edit."]
    pattern = DEVICE_FILES.get(cluster.accelerator)
    if pattern:
        for node in cluster.nodes:
            if node.devices:
                files = pattern.format(index=f"[0-{node.devices - 1}]" if node.devices > 1 else "0")
                lines.append(f"NodeName={node.name} Name={cluster.accelerator} File={files}")
    return "\n".join(lines) + "\n"
