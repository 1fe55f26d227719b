"""The rendezvous store on the cluster address only: for a rank that hosts it, and for torchrun's agent.

Every 127.x.y.z address is this machine's own loopback: a store that listens on 127.0.0.1 only refuses a
connection to 127.0.0.2, one that listens on every address (torch's default) takes it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddp_cluster.errors import DistEnvError
from ddp_cluster.runtime.distenv import DistEnv
from ddp_cluster.runtime.store import bind, hosted_store, hosts_store, launcher_store, option, rank_store

from conftest import clean_environ, free_port


def env(rank: int = 0, world: int = 2) -> DistEnv:
    return DistEnv(rank, rank, world, world, 0, "127.0.0.1", 29501, "openmpi")


@pytest.mark.parametrize(
    ("dist_env", "environ", "hosts"),
    [
        (env(0, 2), {}, True),
        (env(1, 2), {}, False),  # a client of rank 0's store
        (env(0, 1), {}, False),  # one process: no rendezvous, no port
        (env(0, 2), {"TORCHELASTIC_USE_AGENT_STORE": "True"}, False),  # torchrun's agent hosts it
        (env(0, 2), {"TORCHELASTIC_USE_AGENT_STORE": "False"}, True),
        (env(0, 2), {"DDP_LAUNCHER": "torch_npu_run"}, False),  # its ParallelStore
    ],
)
def test_only_the_rank_that_starts_the_store_hosts_it(
    dist_env: DistEnv, environ: dict[str, str], hosts: bool
) -> None:
    assert hosts_store(dist_env, environ) is hosts
    if not hosts:
        assert rank_store(dist_env, environ) is None
        with hosted_store(dist_env, environ=environ) as store:
            assert store is None


@pytest.mark.parametrize(
    "args",
    [
        ["--node-rank=0", "--nnodes", "2", "--master-addr", "node0", "--master-port", "29501", "-m", "x"],
        ["--node_rank", "0", "--master_addr=node0", "--master-port=29501", "-m", "x"],
    ],
)
def test_torchrun_on_node_0_binds_its_master_address(args: list[str]) -> None:
    assert launcher_store("torch.distributed.run", args) == ("node0", 29501)


def test_other_nodes_and_launchers_bind_nothing() -> None:
    args = ["--node-rank=1", "--master-addr", "node0", "--master-port", "29501", "-m", "x"]
    assert launcher_store("torch.distributed.run", args) is None
    node0 = ["--node-rank=0", "--master-addr", "node0", "--master-port", "29501", "-m", "x"]
    assert launcher_store("torch_npu.distributed.run", node0) is None


def test_the_programs_own_arguments_are_not_the_launchers() -> None:
    args = ["--node-rank=1", "-m", "ddp_cluster.run", "s.py", "--node-rank", "0"]
    assert option(args, "node-rank") == "1"
    assert option(["-m", "x", "--master-port", "1"], "master-port") is None


def test_an_address_this_node_does_not_carry_names_rank_0() -> None:
    with pytest.raises(DistEnvError, match=r"cannot listen on 192\.0\.2\.1:\d+ .*rank 0 must run on"):
        bind("192.0.2.1", free_port())  # TEST-NET-1: on no interface here


def test_a_taken_port_is_named() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(DistEnvError, match=f"cannot listen on 127.0.0.1:{port} .*something else holds"):
            bind("127.0.0.1", port)


RANK = textwrap.dedent(
    """
    import os, socket, sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from ddp_cluster.runtime.distenv import resolve_dist_env
    from contextlib import nullcontext
    from ddp_cluster.runtime.store import hosted_store

    env = resolve_dist_env()
    with hosted_store(env, 60) if sys.argv[1] == "bound" else nullcontext():
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{env.master_port}", rank=env.rank,
            world_size=env.world_size, timeout=timedelta(seconds=60),
        )
        total = torch.ones(1)
        dist.all_reduce(total)
        if env.rank == 0:
            with socket.socket() as probe:
                probe.settimeout(2)
                other = probe.connect_ex(("127.0.0.2", env.master_port)) == 0
            print(f"sum={total.item():.0f} other-address-answers={other}", flush=True)
        dist.barrier()
        dist.destroy_process_group()
    """
)


@pytest.mark.torch
@pytest.mark.parametrize(("mode", "other_answers"), [("bound", False), ("default", True)])
def test_rank_0s_store_listens_on_the_master_address_only(mode: str, other_answers: bool) -> None:
    pytest.importorskip("torch")
    port = free_port()
    ranks = []
    for rank in (0, 1):
        environ = clean_environ() | {
            "OMPI_COMM_WORLD_RANK": str(rank),
            "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        ranks.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK, mode], env=environ, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True,
            )
        )  # fmt: skip
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    # The default (torch's own server) answers on every address: the bound one's refusal is the store's doing.
    assert f"sum=2 other-address-answers={other_answers}" in outputs[0][0], outputs


WORKER = textwrap.dedent(
    """
    import os, socket
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    if os.environ["RANK"] == "0":
        with socket.socket() as probe:
            probe.settimeout(2)
            other = probe.connect_ex(("127.0.0.2", int(os.environ["MASTER_PORT"]))) == 0
        print(f"sum={total.item():.0f} agent-store={os.environ['TORCHELASTIC_USE_AGENT_STORE']}"
              f" other-address-answers={other}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.mark.torch
@pytest.mark.parametrize(("runner", "other_answers"), [("store", False), ("plain", True)])
def test_torchruns_agent_store_listens_on_the_master_address_only(
    tmp_path: Path, runner: str, other_answers: bool
) -> None:
    pytest.importorskip("torch")
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    port = free_port()
    front = ["-m", "ddp_cluster.runtime.store"] if runner == "store" else []
    agents = []
    for node in (1, 0):
        argv = [sys.executable, *front, "-m", "torch.distributed.run"] if not front else [
            sys.executable, *front, "torch.distributed.run"
        ]  # fmt: skip
        argv += [f"--node-rank={node}", "--nnodes", "2", "--nproc-per-node", "1"]
        argv += ["--master-addr", "127.0.0.1", "--master-port", str(port), str(worker)]
        agents.append(
            subprocess.Popen(
                argv, env=clean_environ(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True,
            )
        )  # fmt: skip
    outputs = [agent.communicate(timeout=180) for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], outputs
    assert f"sum=2 agent-store=True other-address-answers={other_answers}" in outputs[1][0], outputs
