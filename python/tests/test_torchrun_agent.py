"""The per-node torchrun agent: node rank from mpirun, the runner run as a module of the same interpreter."""

from __future__ import annotations

import pytest

from ddp_cluster.errors import DistEnvError
from ddp_cluster.supervisor.agent import split_runner, torchrun_argv

MPI_NODE_1 = {"OMPI_COMM_WORLD_RANK": "1"}


def test_torchrun_is_torch_distributed_run_of_this_interpreter() -> None:
    # CANN images ship torch in the base interpreter only: no torchrun script on the venv's PATH.
    argv = torchrun_argv(["--nnodes", "2", "train.py"], MPI_NODE_1, python="/opt/venv/bin/python")
    assert argv == [
        "/opt/venv/bin/python",
        "-m",
        "ddp_cluster.runtime.store",
        "torch.distributed.run",
        "--node-rank=1",
        "--nnodes",
        "2",
        "train.py",
    ]


@pytest.mark.parametrize("runner", [["--runner", "torch_npu_run"], ["--runner=torch_npu_run"]])
def test_torch_npu_run_is_torch_npus_launcher_with_the_same_arguments(runner: list[str]) -> None:
    argv = torchrun_argv([*runner, "--nnodes", "2", "train.py"], MPI_NODE_1, python="python")
    assert argv == [
        *("python", "-m", "ddp_cluster.runtime.store", "torch_npu.distributed.run"),
        *("--node-rank=1", "--nnodes", "2", "train.py"),
    ]


def test_unknown_runner_is_refused() -> None:
    with pytest.raises(DistEnvError, match="--runner 'deepspeed' is not one of torchrun, torch_npu_run"):
        split_runner(["--runner", "deepspeed", "x.py"])
    with pytest.raises(DistEnvError, match="--runner needs a value"):
        split_runner(["--runner"])


def test_node_rank_is_not_taken_from_the_user() -> None:
    with pytest.raises(DistEnvError, match="do not pass --node-rank"):
        torchrun_argv(["--node-rank", "0", "x.py"], MPI_NODE_1)


def test_no_mpirun_rank_says_how_to_start_it() -> None:
    with pytest.raises(DistEnvError, match="start this under mpirun"):
        torchrun_argv(["x.py"], {})
