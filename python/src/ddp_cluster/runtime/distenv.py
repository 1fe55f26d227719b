"""Resolve the distributed environment (rank, local rank, world size, master) from the launcher's variables.

One function, :func:`resolve_dist_env`, reads whichever launcher started this process, in this order:

1. torchrun (or ``torch.distributed.launch``, or a hand-written launch script): RANK, WORLD_SIZE, LOCAL_RANK,
   LOCAL_WORLD_SIZE, optional GROUP_RANK; MASTER_ADDR and MASTER_PORT.
2. OpenMPI's mpirun: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE. mpirun knows no rendezvous
   address, so MASTER_ADDR must come from the environment (``mpirun -x MASTER_ADDR=node1``).
3. Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE,
   SLURM_NODEID; the master is MASTER_ADDR when set, else the first host of the step's node list.
4. none of these: a single process (world size 1).

MASTER_PORT defaults to :data:`DEFAULT_MASTER_PORT`, the cluster's ``cluster_master_port``. Every missing or
inconsistent value raises :class:`~ddp_cluster.errors.DistEnvError` naming the variable and its value. No
torch import here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ddp_cluster.errors import DistEnvError

# The default of cluster_master_port (roles/cluster/meta/argument_specs.yml; tests/unit/test_settings.py holds
# them equal), and of a job spec's master_port.
DEFAULT_MASTER_PORT = 29501
SINGLE_PROCESS_MASTER_ADDR = "127.0.0.1"

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
OPENMPI_VARS = (
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
)


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job. ``variables`` maps a field to the variable it was read from."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    launcher: str  # torchrun | openmpi | slurm | single
    variables: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def variable(self, name: str) -> str:
        """The environment variable a field came from (the field's name when it was a default)."""
        return self.variables.get(name, name)

    def torchrun_variables(self) -> dict[str, str]:
        """The variables torchrun would have set for this process (what ``runtime.run`` exports)."""
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }

    def check_local_device(self, visible_devices: int, kind: str) -> None:
        """Fail when this process's local rank has no device of ``kind`` to use (one device per process)."""
        if self.local_rank >= visible_devices:
            var = self.variable("local_rank")
            raise DistEnvError(
                f"{var}={self.local_rank} but only {visible_devices} {kind} device(s) are visible to this "
                f"process (local ranks 0..{visible_devices - 1}): start at most {visible_devices} "
                "process(es) per node, or check CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES"
            )


def resolve_dist_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Resolve the distributed environment from ``environ`` (default: ``os.environ``); see the module doc."""
    env = os.environ if environ is None else environ
    if any(name in env for name in TORCHRUN_VARS):
        return _from_torchrun(env)
    if any(name in env for name in OPENMPI_VARS):
        return _from_openmpi(env)
    if "SLURM_PROCID" in env:
        return _from_slurm(env)
    port = _master_port(env)
    addr = env.get("MASTER_ADDR", "").strip() or SINGLE_PROCESS_MASTER_ADDR
    return DistEnv(0, 0, 1, 1, 0, addr, port, "single")


def _from_torchrun(env: Mapping[str, str]) -> DistEnv:
    hint = "torchrun sets all of RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; a hand-made launch must too"
    rank = _int(env, "RANK", hint=hint)
    world = _int(env, "WORLD_SIZE", minimum=1, hint=hint)
    local_rank = _int(env, "LOCAL_RANK", hint=hint)
    local_world = _int(env, "LOCAL_WORLD_SIZE", minimum=1, hint=hint)
    names = {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK"}
    names["local_world_size"] = "LOCAL_WORLD_SIZE"
    _check_ranks(rank, world, local_rank, local_world, names)
    if "GROUP_RANK" in env:
        node_rank = _int(env, "GROUP_RANK")
        names["node_rank"] = "GROUP_RANK"
    else:
        node_rank = rank // local_world
    addr, port = _master(env, world, "torchrun sets MASTER_ADDR; a hand-made launch must export it")
    return DistEnv(rank, local_rank, world, local_world, node_rank, addr, port, "torchrun", names)


def _from_openmpi(env: Mapping[str, str]) -> DistEnv:
    hint = "run under OpenMPI's mpirun, which sets all four OMPI_COMM_WORLD_* variables"
    rank = _int(env, "OMPI_COMM_WORLD_RANK", hint=hint)
    world = _int(env, "OMPI_COMM_WORLD_SIZE", minimum=1, hint=hint)
    local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", hint=hint)
    local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", minimum=1, hint=hint)
    names = {
        "rank": "OMPI_COMM_WORLD_RANK",
        "world_size": "OMPI_COMM_WORLD_SIZE",
        "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK",
        "local_world_size": "OMPI_COMM_WORLD_LOCAL_SIZE",
    }
    _check_ranks(rank, world, local_rank, local_world, names)
    # OpenMPI has no node index variable (OMPI_COMM_WORLD_NODE_RANK is a per-node process rank, not a node
    # index). With mpirun's default by-slot mapping the ranks of one node are contiguous, so this holds.
    node_rank = rank // local_world
    addr, port = _master(env, world, "mpirun does not set it: pass it with -x MASTER_ADDR=<host of rank 0>")
    return DistEnv(rank, local_rank, world, local_world, node_rank, addr, port, "openmpi", names)


def _from_slurm(env: Mapping[str, str]) -> DistEnv:
    hint = "srun sets SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID"
    rank = _int(env, "SLURM_PROCID", hint=hint)
    world_var = "SLURM_NTASKS" if "SLURM_NTASKS" in env else "SLURM_NPROCS"
    world = _int(env, world_var, minimum=1, hint=hint.replace("SLURM_NTASKS", world_var))
    local_rank = _int(env, "SLURM_LOCALID", hint=hint)
    node_rank = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
    names = {"rank": "SLURM_PROCID", "world_size": world_var, "local_rank": "SLURM_LOCALID"}
    if "SLURM_NODEID" in env:
        names["node_rank"] = "SLURM_NODEID"
    local_world, names["local_world_size"] = _slurm_local_world(env, node_rank)
    _check_ranks(rank, world, local_rank, local_world, names)
    if world > 1 and not env.get("MASTER_ADDR", "").strip():
        addr = _slurm_master(env)
        port = _master_port(env)
    else:
        addr, port = _master(env, world, "")
    return DistEnv(rank, local_rank, world, local_world, node_rank, addr, port, "slurm", names)


def _slurm_local_world(env: Mapping[str, str], node_rank: int) -> tuple[int, str]:
    if "SLURM_NTASKS_PER_NODE" in env:
        return _int(env, "SLURM_NTASKS_PER_NODE", minimum=1), "SLURM_NTASKS_PER_NODE"
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if name in env:
            per_node = parse_slurm_tasks_per_node(env[name], name)
            if node_rank >= len(per_node):
                raise DistEnvError(
                    f"SLURM_NODEID={node_rank} but {name}={env[name]!r} describes only "
                    f"{len(per_node)} node(s)"
                )
            return per_node[node_rank], name
    raise DistEnvError(
        "cannot tell how many tasks run on this node: none of SLURM_NTASKS_PER_NODE, "
        "SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE is set (launch with srun, or pass "
        "--ntasks-per-node)"
    )


def _slurm_master(env: Mapping[str, str]) -> str:
    # Rank 0 runs on the first node of the step (block or cyclic distribution). SLURM_LAUNCH_NODE_IPADDR is
    # only a fallback: it is the host that ran srun, outside the allocation when srun ran on a login node.
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(name, "").strip():
            return first_host(env[name], name)
    launch_ip = env.get("SLURM_LAUNCH_NODE_IPADDR", "").strip()
    if launch_ip:
        return launch_ip
    raise DistEnvError(
        "MASTER_ADDR is not set and no Slurm node list (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST) names "
        "the host of rank 0: export MASTER_ADDR"
    )


def parse_slurm_tasks_per_node(value: str, name: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expand Slurm's compressed task counts, e.g. ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if match is None or int(match.group(1)) < 1:
            raise DistEnvError(f"{name}={value!r} is not a Slurm task count list like '2(x3),1'")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def first_host(hostlist: str, name: str = "SLURM_JOB_NODELIST") -> str:
    """The first host of a Slurm host list: ``"node[07-09,12],gpu1"`` -> ``"node07"``."""
    depth, end = 0, len(hostlist)
    for index, char in enumerate(hostlist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            break
        if char == "," and depth == 0:
            end = index
            break
    head = hostlist[:end].strip()
    host = re.sub(r"\[([^\[\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0].strip(), head)
    if not host or any(c in host for c in "[],") or not re.fullmatch(r"[A-Za-z0-9._:-]+", host):
        raise DistEnvError(f"{name}={hostlist!r} is not a host list this tool can read: export MASTER_ADDR")
    return host


def _check_ranks(rank: int, world: int, local_rank: int, local_world: int, names: Mapping[str, str]) -> None:
    if rank >= world:
        raise DistEnvError(
            f"{names['rank']}={rank} is not below {names['world_size']}={world}: "
            f"ranks run from 0 to {world - 1}"
        )
    if local_world > world:
        raise DistEnvError(
            f"{names['local_world_size']}={local_world} exceeds {names['world_size']}={world}: "
            "a node cannot run more processes than the whole job"
        )
    if local_rank >= local_world:
        raise DistEnvError(
            f"{names['local_rank']}={local_rank} is not below {names['local_world_size']}={local_world}: "
            f"local ranks run from 0 to {local_world - 1}"
        )


def _master(env: Mapping[str, str], world: int, hint: str) -> tuple[str, int]:
    addr = env.get("MASTER_ADDR", "").strip()
    if not addr:
        if world > 1:
            raise DistEnvError(
                f"MASTER_ADDR is not set (value {env.get('MASTER_ADDR')!r}) in a world of {world} processes: "
                f"every rank needs the host of rank 0; {hint}".rstrip("; ")
            )
        addr = SINGLE_PROCESS_MASTER_ADDR
    return addr, _master_port(env)


def _master_port(env: Mapping[str, str]) -> int:
    if not env.get("MASTER_PORT", "").strip():
        return DEFAULT_MASTER_PORT
    port = _int(env, "MASTER_PORT", minimum=1)
    if port > 65535:
        raise DistEnvError(f"MASTER_PORT={env['MASTER_PORT']!r} is not a TCP port (1..65535)")
    return port


def _int(env: Mapping[str, str], name: str, *, minimum: int = 0, hint: str = "") -> int:
    raw = env.get(name)
    if raw is None:
        raise DistEnvError(f"{name} is not set" + (f": {hint}" if hint else ""))
    try:
        value = int(raw.strip())
    except ValueError:
        raise DistEnvError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        what = "negative" if value < 0 else "too small"
        raise DistEnvError(f"{name}={raw!r} is {what}: it must be at least {minimum}")
    return value
