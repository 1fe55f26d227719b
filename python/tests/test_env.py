"""Distributed environment resolution: torchrun, OpenMPI, Slurm and none, and every bad value, named."""

from __future__ import annotations

import pytest

from ddp_cluster.errors import DistEnvError
from ddp_cluster.runtime.distenv import (
    DEFAULT_MASTER_PORT,
    DistEnv,
    first_host,
    parse_slurm_tasks_per_node,
    resolve_dist_env,
)

TORCHRUN = {
    "RANK": "5",
    "WORLD_SIZE": "16",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "node1",
    "MASTER_PORT": "29600",
}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "6",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "2",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "OMPI_COMM_WORLD_NODE_RANK": "2",  # a per-node process rank in OpenMPI, not a node index
    "MASTER_ADDR": "10.0.0.1",
}
SLURM = {
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
}


def resolve(env: dict[str, str]) -> DistEnv:
    return resolve_dist_env(env)


def test_torchrun_variables_are_read() -> None:
    env = resolve(TORCHRUN)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank) == (5, 16, 1, 4, 1)
    assert (env.master_addr, env.master_port, env.launcher) == ("node1", 29600, "torchrun")
    assert env.variable("local_rank") == "LOCAL_RANK"


def test_torchrun_node_rank_follows_the_manual_formula_without_group_rank() -> None:
    # rank = node_rank * nproc_per_node + local_rank (the vendor manuals), so node_rank = rank // nproc
    env = resolve(
        {k: v for k, v in TORCHRUN.items() if k != "GROUP_RANK"} | {"RANK": "13", "LOCAL_RANK": "1"}
    )
    assert env.node_rank == 3


def test_openmpi_variables_are_read_and_master_comes_from_the_environment() -> None:
    env = resolve(OPENMPI)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (6, 8, 2, 4)
    assert env.node_rank == 1  # rank // local size, not OMPI_COMM_WORLD_NODE_RANK
    assert (env.master_addr, env.master_port, env.launcher) == ("10.0.0.1", DEFAULT_MASTER_PORT, "openmpi")
    assert env.variable("rank") == "OMPI_COMM_WORLD_RANK"


def test_slurm_variables_are_read_and_master_is_the_first_node() -> None:
    env = resolve(SLURM)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank) == (3, 4, 1, 2, 1)
    assert (env.master_addr, env.master_port, env.launcher) == ("gpu07", DEFAULT_MASTER_PORT, "slurm")


def test_slurm_prefers_master_addr_and_ntasks_per_node() -> None:
    env = resolve(SLURM | {"MASTER_ADDR": "head", "MASTER_PORT": "1234", "SLURM_NTASKS_PER_NODE": "2"})
    assert (env.master_addr, env.master_port, env.local_world_size) == ("head", 1234, 2)
    assert env.variable("local_world_size") == "SLURM_NTASKS_PER_NODE"


def test_slurm_uneven_nodes_pick_this_nodes_count() -> None:
    env = resolve(SLURM | {"SLURM_NTASKS": "5", "SLURM_PROCID": "4", "SLURM_LOCALID": "0"} | {
        "SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "2(x2),1"})  # fmt: skip
    assert env.local_world_size == 1


def test_slurm_falls_back_to_the_launch_node_without_a_node_list() -> None:
    env = {k: v for k, v in SLURM.items() if "NODELIST" not in k} | {"SLURM_LAUNCH_NODE_IPADDR": "10.1.1.1"}
    assert resolve(env).master_addr == "10.1.1.1"


def test_no_launcher_is_a_world_of_one() -> None:
    env = resolve({})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank) == (0, 1, 0, 1, 0)
    assert (env.master_addr, env.master_port, env.launcher) == ("127.0.0.1", DEFAULT_MASTER_PORT, "single")


def test_torchrun_wins_over_openmpi_and_slurm() -> None:
    # ddp_cluster.runtime.run under mpirun exports torchrun variables next to the OMPI ones; they agree,
    # torchrun wins
    assert resolve(OPENMPI | SLURM | TORCHRUN).launcher == "torchrun"
    assert resolve(OPENMPI | SLURM).launcher == "openmpi"


def test_single_process_of_a_launcher_needs_no_master() -> None:
    env = resolve({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"} | {
        "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"})  # fmt: skip
    assert env.master_addr == "127.0.0.1"


def test_torchrun_variables_round_trip() -> None:
    env = resolve(OPENMPI)
    again = resolve(env.torchrun_variables())
    assert (again.rank, again.world_size, again.local_rank, again.local_world_size, again.node_rank) == (
        env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank)  # fmt: skip
    assert (again.master_addr, again.master_port) == (env.master_addr, env.master_port)


BAD_CASES = [
    # (environment, text the error must contain)
    (TORCHRUN | {"RANK": "16"}, "RANK=16 is not below WORLD_SIZE=16"),
    (TORCHRUN | {"RANK": "-1"}, "RANK='-1' is negative"),
    (TORCHRUN | {"RANK": "two"}, "RANK='two' is not an integer"),
    (TORCHRUN | {"RANK": ""}, "RANK='' is not an integer"),
    (TORCHRUN | {"WORLD_SIZE": "0"}, "WORLD_SIZE='0' is too small"),
    (TORCHRUN | {"WORLD_SIZE": "1.5"}, "WORLD_SIZE='1.5' is not an integer"),
    (TORCHRUN | {"LOCAL_RANK": "4"}, "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"),
    (TORCHRUN | {"LOCAL_RANK": "-2"}, "LOCAL_RANK='-2' is negative"),
    (TORCHRUN | {"LOCAL_WORLD_SIZE": "32"}, "LOCAL_WORLD_SIZE=32 exceeds WORLD_SIZE=16"),
    (TORCHRUN | {"GROUP_RANK": "x"}, "GROUP_RANK='x' is not an integer"),
    ({k: v for k, v in TORCHRUN.items() if k != "WORLD_SIZE"}, "WORLD_SIZE is not set"),
    ({k: v for k, v in TORCHRUN.items() if k != "LOCAL_RANK"}, "LOCAL_RANK is not set"),
    ({"LOCAL_RANK": "0"}, "RANK is not set"),
    ({k: v for k, v in TORCHRUN.items() if k != "MASTER_ADDR"}, "MASTER_ADDR is not set"),
    (TORCHRUN | {"MASTER_ADDR": "  "}, "MASTER_ADDR is not set"),
    (TORCHRUN | {"MASTER_PORT": "http"}, "MASTER_PORT='http' is not an integer"),
    (TORCHRUN | {"MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a TCP port"),
    (TORCHRUN | {"MASTER_PORT": "0"}, "MASTER_PORT='0' is too small"),
    ({"MASTER_PORT": "-5"}, "MASTER_PORT='-5' is negative"),
    (OPENMPI | {"OMPI_COMM_WORLD_RANK": "8"}, "OMPI_COMM_WORLD_RANK=8 is not below OMPI_COMM_WORLD_SIZE=8"),
    (OPENMPI | {"OMPI_COMM_WORLD_LOCAL_RANK": "x"}, "OMPI_COMM_WORLD_LOCAL_RANK='x' is not an integer"),
    (OPENMPI | {"OMPI_COMM_WORLD_LOCAL_SIZE": "-4"}, "OMPI_COMM_WORLD_LOCAL_SIZE='-4' is negative"),
    (
        {k: v for k, v in OPENMPI.items() if k != "OMPI_COMM_WORLD_LOCAL_SIZE"},
        "OMPI_COMM_WORLD_LOCAL_SIZE is not set",
    ),
    ({k: v for k, v in OPENMPI.items() if k != "MASTER_ADDR"}, "-x MASTER_ADDR"),
    (SLURM | {"SLURM_PROCID": "4"}, "SLURM_PROCID=4 is not below SLURM_NTASKS=4"),
    (SLURM | {"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 is not below SLURM_TASKS_PER_NODE=2"),
    (SLURM | {"SLURM_NTASKS": "many"}, "SLURM_NTASKS='many' is not an integer"),
    (
        SLURM | {"SLURM_NODEID": "2"},
        "SLURM_NODEID=2 but SLURM_TASKS_PER_NODE='2(x2)' describes only 2 node(s)",
    ),
    (
        SLURM | {"SLURM_TASKS_PER_NODE": "2(y2)"},
        "SLURM_TASKS_PER_NODE='2(y2)' is not a Slurm task count list",
    ),
    (
        {k: v for k, v in SLURM.items() if k != "SLURM_TASKS_PER_NODE"},
        "cannot tell how many tasks run on this node",
    ),
    ({k: v for k, v in SLURM.items() if "NODELIST" not in k}, "export MASTER_ADDR"),
    (SLURM | {"SLURM_STEP_NODELIST": "gpu[07-08"}, "SLURM_STEP_NODELIST='gpu[07-08' is not a host list"),
]


@pytest.mark.parametrize(("environ", "message"), BAD_CASES, ids=[m for _, m in BAD_CASES])
def test_bad_values_are_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(DistEnvError) as raised:
        resolve(environ)
    assert message in str(raised.value)


def test_local_rank_beyond_visible_devices_is_named() -> None:
    env = resolve(OPENMPI)  # local rank 2
    env.check_local_device(3, "npu")  # devices 0..2: fine
    with pytest.raises(DistEnvError, match=r"OMPI_COMM_WORLD_LOCAL_RANK=2 but only 2 npu device\(s\)"):
        env.check_local_device(2, "npu")


@pytest.mark.parametrize(
    ("hostlist", "first"),
    [
        ("node1", "node1"),
        ("node1,node2", "node1"),
        ("node[07-09,12],gpu1", "node07"),
        ("gpu[3,5-6]", "gpu3"),
        ("rack[1-2]-n[05-06]", "rack1-n05"),
        ("10.0.0.5,10.0.0.6", "10.0.0.5"),
    ],
)
def test_first_host_of_a_slurm_host_list(hostlist: str, first: str) -> None:
    assert first_host(hostlist) == first


def test_slurm_task_counts_expand() -> None:
    assert parse_slurm_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert parse_slurm_tasks_per_node("8") == [8]
    with pytest.raises(DistEnvError, match="'0'"):
        parse_slurm_tasks_per_node("0")
