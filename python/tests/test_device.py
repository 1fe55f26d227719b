"""Device and backend selection: auto order npu > cuda > cpu, overrides, and the refusals."""

from __future__ import annotations

import sys

import pytest

from ddp_cluster.errors import DeviceError, DistEnvError
from ddp_cluster.runtime.device import (
    Accelerators,
    Placement,
    choose_placement,
    detect_accelerators,
    select_placement,
)
from ddp_cluster.runtime.distenv import DistEnv, resolve_dist_env

NO_TORCH_NPU = {"npu": "ModuleNotFoundError: No module named 'torch_npu'"}
NOTHING = Accelerators(counts={"cuda": 0}, errors=NO_TORCH_NPU)
TWO_GPUS = Accelerators(counts={"cuda": 2}, errors=NO_TORCH_NPU)
EIGHT_NPUS = Accelerators(counts={"cuda": 0, "npu": 8})


def env_with_local_rank(local_rank: int, local_world: int = 8) -> DistEnv:
    return resolve_dist_env(
        {
            "OMPI_COMM_WORLD_RANK": str(local_rank),
            "OMPI_COMM_WORLD_SIZE": str(local_world),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_world),
            "MASTER_ADDR": "node1",
        }
    )


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        (NOTHING, Placement("cpu", None, "gloo")),
        (TWO_GPUS, Placement("cuda", 1, "nccl")),
        (EIGHT_NPUS, Placement("npu", 1, "hccl")),
        (Accelerators(counts={"cuda": 2, "npu": 8}), Placement("npu", 1, "hccl")),
        (Accelerators(counts={"cuda": 2, "npu": 0}), Placement("cuda", 1, "nccl")),
    ],
)
def test_auto_prefers_npu_then_cuda_then_cpu(found: Accelerators, expected: Placement) -> None:
    assert choose_placement("auto", "auto", env_with_local_rank(1), found) == expected


def test_overrides() -> None:
    env = env_with_local_rank(1)
    assert choose_placement("cpu", "auto", env, EIGHT_NPUS) == Placement("cpu", None, "gloo")
    assert choose_placement("cuda", "gloo", env, TWO_GPUS) == Placement("cuda", 1, "gloo")
    assert choose_placement("auto", "gloo", env, NOTHING).backend == "gloo"


def test_npu_without_torch_npu_says_so() -> None:
    with pytest.raises(DeviceError, match=r"device npu needs torch_npu.*No module named 'torch_npu'"):
        choose_placement("npu", "auto", env_with_local_rank(0), NOTHING)


def test_npu_without_devices_says_so() -> None:
    found = Accelerators(counts={"cuda": 0, "npu": 0})
    with pytest.raises(DeviceError, match="no npu device is visible"):
        choose_placement("npu", "auto", env_with_local_rank(0), found)


@pytest.mark.parametrize(
    ("device", "backend", "found", "message"),
    [
        ("cpu", "nccl", NOTHING, "--backend nccl cannot run on cpu tensors; use gloo"),
        ("cpu", "hccl", NOTHING, "--backend hccl cannot run on cpu"),
        ("auto", "hccl", TWO_GPUS, "--backend hccl cannot run on cuda"),
        ("npu", "nccl", EIGHT_NPUS, "--backend nccl cannot run on npu"),
        ("cuda", "auto", NOTHING, "no cuda device is visible"),
        ("tpu", "auto", NOTHING, "--device 'tpu' is not one of"),
        ("cpu", "mpi", NOTHING, "--backend 'mpi' is not one of"),
    ],
)
def test_impossible_combinations_are_refused(
    device: str, backend: str, found: Accelerators, message: str
) -> None:
    with pytest.raises(DeviceError, match=message.replace("(", r"\(")):
        choose_placement(device, backend, env_with_local_rank(0), found)


def test_local_rank_beyond_visible_devices() -> None:
    # 8 processes per node, 2 GPUs: local rank 5 has none
    with pytest.raises(DistEnvError, match=r"OMPI_COMM_WORLD_LOCAL_RANK=5 but only 2 cuda device\(s\)"):
        choose_placement("auto", "auto", env_with_local_rank(5), TWO_GPUS)
    # on cpu the local rank needs no device
    assert choose_placement("cpu", "auto", env_with_local_rank(5), TWO_GPUS).kind == "cpu"


def test_this_machine_detects_no_npu_and_selects_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import fails even where torch_npu is installed
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    found = detect_accelerators("auto")
    assert "torch_npu" in found.errors["npu"]
    assert detect_accelerators("cuda").errors["npu"] == "not probed"
    placement = select_placement("auto", "auto", resolve_dist_env({}))
    assert placement == Placement("cpu", None, "gloo")
    assert str(placement.device) == "cpu" and placement.device_ids is None
    with pytest.raises(DeviceError, match="torch_npu"):
        select_placement("npu", "auto", resolve_dist_env({}))


def test_cuda_refusal_gives_torchs_reason() -> None:
    found = Accelerators(
        counts={"cuda": 0},
        errors={"npu": "not probed", "cuda": "The NVIDIA driver on your system is too old"},
    )
    with pytest.raises(
        DeviceError, match=r"no cuda device is visible.*driver on your system is too old.*-e device=cpu"
    ):
        choose_placement("cuda", "auto", env_with_local_rank(0), found)


@pytest.mark.parametrize(
    ("value", "expected"), [("", "auto"), ("npu", "npu"), (" cuda ", "cuda"), ("cpu", "cpu")]
)
def test_requested_device_comes_from_ddp_device(value: str, expected: str) -> None:
    from ddp_cluster.runtime.config import requested_device

    assert requested_device({"DDP_DEVICE": value}) == expected
    assert requested_device({}) == "auto"


def test_requested_device_refuses_an_unknown_value() -> None:
    from ddp_cluster.runtime.config import requested_device

    with pytest.raises(DeviceError, match="DDP_DEVICE='gpu' is not one of auto, cpu, cuda, npu"):
        requested_device({"DDP_DEVICE": "gpu"})


def test_where_names_the_node_and_the_rank() -> None:
    from ddp_cluster.runtime.device import where

    env = env_with_local_rank(3)
    assert where(env, {"DDP_NODE_NAME": "sim-server1"}) == "node sim-server1 rank 3/8"
    assert where(None, {"DDP_NODE_NAME": "sim-server1"}) == "node sim-server1"
