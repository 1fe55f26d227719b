"""The CPU binding filter (plugins/filter/ddp_topology.py): the topology tools' outputs as the ranks' binding
line, and the errors that name what is missing. No containers needed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "ddp_topology_filters", REPO / "plugins" / "filter" / "ddp_topology.py"
)
assert _spec is not None and _spec.loader is not None
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)

# A 4-NPU 910A server (the same sample as the package tests).
NPU_TOPO = (REPO / "python" / "tests" / "data" / "topology" / "npu-smi-topo-910a.txt").read_text()
GPU_TOPO = (
    "\x1b[4m\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tPIX\t0-55,112-167\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tNODE\t56-111,168-223\t1\t\tN/A\n"
    "NIC0\tPIX\tNODE\t X \t\t\t\n"
)


def doubles(state: Path, tool: str, *args: str) -> str:
    env = {**os.environ, "DDP_DOUBLES_STATE": str(state)}
    command = [sys.executable, str(REPO / "tests" / "doubles" / tool), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=True).stdout


def test_the_filter_is_registered() -> None:
    assert filters.FilterModule().filters() == {"ddp_cpu_binding": filters.ddp_cpu_binding}


def test_npu_binding() -> None:
    assert filters.ddp_cpu_binding(NPU_TOPO, "npu") == "0=144-167;1=96-119;2=48-71;3=0-23"


def test_gpu_binding() -> None:
    assert filters.ddp_cpu_binding(GPU_TOPO, "gpu") == "0=0-55,112-167;1=56-111,168-223"


def test_binding_from_the_doubles(tmp_path: Path) -> None:
    npu = filters.ddp_cpu_binding(doubles(tmp_path, "npu-smi", "info", "-t", "topo"), "npu")
    assert npu == "0=144-167;1=144-167;2=96-119;3=96-119;4=0-23;5=0-23;6=48-71;7=48-71"
    (tmp_path / "config.json").write_text(json.dumps({"gpu_count": 2, "nic_count": 2}))
    gpu = filters.ddp_cpu_binding(doubles(tmp_path, "nvidia-smi", "topo", "-m"), "gpu")
    assert gpu == "0=48-63,176-191;1=48-63,176-191"


@pytest.mark.parametrize(
    ("stdout", "accelerator", "message"),
    [
        ("This device does not support querying topo.\n", "npu", "does not support querying topo"),
        ("\t   NPU0       NPU1\nNPU0       X          HCCS\n", "npu", "set cluster_cpu_binding: none"),
        (None, "npu", "no NPU rows"),
        (NPU_TOPO, "gpu", "no GPU rows"),
        ("", "gpu", "no header with a CPU Affinity column"),
        (GPU_TOPO.replace("0-55,112-167", "N/A"), "gpu", "no CPU affinity for GPU0"),
        (GPU_TOPO, "npu", "no NPU rows"),
        (GPU_TOPO, "cpu", "accelerator 'cpu' has no topology tool"),
    ],
)
def test_errors_are_filter_errors_naming_what_is_missing(
    stdout: str | None, accelerator: str, message: str
) -> None:
    with pytest.raises(AnsibleFilterError, match=message):
        filters.ddp_cpu_binding(stdout, accelerator)
