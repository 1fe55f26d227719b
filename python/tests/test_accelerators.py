"""The accelerator registry (ddp_cluster.accelerators): one module per kind, each kind's facts complete and
plain, the look-ups by name and by torch device type, and the tables the job and the ranks derive from it."""

from __future__ import annotations

import json

import pytest

from ddp_cluster import accelerators
from ddp_cluster.accelerators import cpu, gpu, npu
from ddp_cluster.accelerators.base import Accelerator, TopologyError, UnknownAccelerator
from ddp_cluster.errors import DdpClusterError


def test_one_module_per_kind_in_the_registry() -> None:
    assert accelerators.REGISTRY == {"cpu": cpu.CPU, "npu": npu.NPU, "gpu": gpu.GPU}
    assert accelerators.ACCELERATORS == ("cpu", "gpu", "npu")
    for name, kind in accelerators.REGISTRY.items():
        assert kind.name == name
        assert accelerators.get(name) is kind
        assert accelerators.by_device(kind.device) is kind


def test_the_kinds_facts() -> None:
    assert accelerators.DEVICE_BACKEND == {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
    assert (gpu.GPU.visible_variable, npu.NPU.visible_variable) == (
        "CUDA_VISIBLE_DEVICES",
        "ASCEND_RT_VISIBLE_DEVICES",
    )
    assert npu.NPU.runtime_visible_variable == "ASCEND_VISIBLE_DEVICES"
    assert gpu.GPU.topology_argv == ("nvidia-smi", "topo", "-m")
    assert npu.NPU.topology_argv == ("npu-smi", "info", "-t", "topo")
    assert cpu.CPU.topology_argv == () and cpu.CPU.host_roles == ()
    assert npu.NPU.nproc_choices == (1, 2, 4, 8) and gpu.GPU.nproc_choices == ()
    assert npu.NPU.host_roles == ("npu_host", "hccn_network") and gpu.GPU.host_roles == ("gpu_host",)
    assert gpu.GPU.backends == ("nccl", "gloo") and npu.NPU.backends == ("hccl",)


@pytest.mark.parametrize("kind", list(accelerators.REGISTRY.values()), ids=list(accelerators.REGISTRY))
def test_facts_are_plain_data_with_every_field(kind: Accelerator) -> None:
    facts = kind.facts()
    assert json.loads(json.dumps(facts)) == facts  # what Jinja gets: no tuples, no callables
    fields = set(Accelerator.__dataclass_fields__) - {"affinity"}
    assert fields <= set(facts)
    assert facts["backend"] == kind.backends[0]
    assert facts["binds_cpus"] == (kind.affinity is not None) == bool(kind.topology_argv)


def test_unknown_kinds_and_devices_are_named() -> None:
    with pytest.raises(UnknownAccelerator, match="accelerator 'tpu' is unknown: use cpu, npu, gpu"):
        accelerators.get("tpu")
    with pytest.raises(UnknownAccelerator, match="device 'gpu' is unknown: use cpu, cuda, npu"):
        accelerators.by_device("gpu")
    assert issubclass(UnknownAccelerator, DdpClusterError)
    assert issubclass(TopologyError, DdpClusterError)


def test_a_kind_without_a_topology_tool_says_so() -> None:
    with pytest.raises(TopologyError, match="accelerator 'cpu' has no topology tool"):
        cpu.CPU.cpu_affinity("anything")


def test_the_ranks_tables_come_from_the_registry() -> None:
    pytest.importorskip("torch")
    from ddp_cluster.runtime import device

    assert device.DEVICE_CHOICES == ("auto", "cpu", "cuda", "npu")
    assert device.BACKEND_CHOICES == ("auto", "gloo", "nccl", "hccl")
    assert device.SUPPORTED_BACKENDS == {"cpu": ("gloo",), "cuda": ("nccl", "gloo"), "npu": ("hccl",)}
