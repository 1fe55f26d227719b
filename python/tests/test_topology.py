"""CPU affinity from the vendors' topology tools (the npu and gpu modules' readers, and
ddp_cluster.accelerators.topology): the published samples of npu-smi info -t topo and nvidia-smi topo -m, the
binding line the ranks get, a rank's device and CPUs, and the test doubles' outputs read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_cluster.accelerators.gpu import gpu_affinity
from ddp_cluster.accelerators.npu import npu_affinity
from ddp_cluster.accelerators.topology import (
    TopologyError,
    binding_text,
    format_cpu_list,
    parse_binding_text,
    parse_cpu_list,
    rank_cpus,
    rank_device,
)

DOUBLES = Path(__file__).resolve().parents[2] / "tests" / "doubles"
TOPOLOGY = Path(__file__).parent / "data" / "topology"

# npu-smi info -t topo on an Atlas 800T A2 (8x 910B), as the vendor prints it (python/tests/data/topology).
ATLAS_A2 = (TOPOLOGY / "npu-smi-topo-atlas-a2.txt").read_text()
ATLAS_A2_BINDING = "0=144-167;1=144-167;2=96-119;3=96-119;4=0-23;5=0-23;6=48-71;7=48-71"

# A 4-NPU 910A server: narrower cells.
ATLAS_910A = (TOPOLOGY / "npu-smi-topo-910a.txt").read_text()

# nvidia-smi topo -m on a DGX A100 (GPU rows and NIC0 as published; NIC1..NIC9 follow the same pattern).
DGX_A100 = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tNIC1\tNIC2\tNIC3\tNIC4\tNIC5\tNIC6\tNIC7\
\tNIC8\tNIC9\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\
\tSYS\t48-63,176-191\t3
GPU1\tNV12\t X \tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\
\tSYS\t48-63,176-191\t3
GPU2\tNV12\tNV12\t X \tNV12\tNV12\tNV12\tNV12\tNV12\tSYS\tSYS\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\
\tSYS\t16-31,144-159\t1
GPU3\tNV12\tNV12\tNV12\t X \tNV12\tNV12\tNV12\tNV12\tSYS\tSYS\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\
\tSYS\t16-31,144-159\t1
GPU4\tNV12\tNV12\tNV12\tNV12\t X \tNV12\tNV12\tNV12\tSYS\tSYS\tSYS\tSYS\tPXB\tPXB\tSYS\tSYS\tSYS\
\tSYS\t112-127,240-255\t7
GPU5\tNV12\tNV12\tNV12\tNV12\tNV12\t X \tNV12\tNV12\tSYS\tSYS\tSYS\tSYS\tPXB\tPXB\tSYS\tSYS\tSYS\
\tSYS\t112-127,240-255\t7
GPU6\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\t X \tNV12\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tPXB\tPXB\tSYS\
\tSYS\t80-95,208-223\t5
GPU7\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\t X \tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tPXB\tPXB\tSYS\
\tSYS\t80-95,208-223\t5
NIC0\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t X \tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t\t
NIC1\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tPXB\t X \tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t\t
NIC2\tSYS\tSYS\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t X \tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t\t
NIC3\tSYS\tSYS\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tPXB\t X \tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t\t
NIC4\tSYS\tSYS\tSYS\tSYS\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t X \tPXB\tSYS\tSYS\tSYS\tSYS\t\t
NIC5\tSYS\tSYS\tSYS\tSYS\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tPXB\t X \tSYS\tSYS\tSYS\tSYS\t\t
NIC6\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t X \tPXB\tSYS\tSYS\t\t
NIC7\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tPXB\t X \tSYS\tSYS\t\t
NIC8\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t X \tPXB\t\t
NIC9\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tPXB\t X \t\t

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
  NIC1: mlx5_1
  NIC2: mlx5_2
  NIC3: mlx5_3
  NIC4: mlx5_4
  NIC5: mlx5_5
  NIC6: mlx5_6
  NIC7: mlx5_7
  NIC8: mlx5_8
  NIC9: mlx5_9
"""

# A DGX H100 on a newer driver: the header underlined (ANSI), the GPU NUMA ID column, a double tab before N/A.
DGX_H100 = """\
\x1b[4m\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tNIC1\tNIC2\tNIC3\tNIC4\tNIC5\tNIC6\
\tNIC7\tNIC8\tNIC9\tNIC10\tNIC11\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m
GPU0\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tPIX\tNODE\tNODE\tNODE\tNODE\tNODE\tSYS\tSYS\
\tSYS\tSYS\tSYS\tSYS\t0-55,112-167\t0\t\tN/A
GPU1\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNODE\tNODE\tNODE\tPIX\tNODE\tNODE\tSYS\tSYS\
\tSYS\tSYS\tSYS\tSYS\t0-55,112-167\t0\t\tN/A
GPU2\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNODE\tNODE\tNODE\tNODE\tPIX\tNODE\tSYS\tSYS\
\tSYS\tSYS\tSYS\tSYS\t0-55,112-167\t0\t\tN/A
GPU3\tNV18\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tNODE\tNODE\tNODE\tNODE\tNODE\tPIX\tSYS\tSYS\
\tSYS\tSYS\tSYS\tSYS\t0-55,112-167\t0\t\tN/A
GPU4\tNV18\tNV18\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tPIX\tNODE\tNODE\
\tNODE\tNODE\tNODE\t56-111,168-223\t1\t\tN/A
GPU5\tNV18\tNV18\tNV18\tNV18\tNV18\t X \tNV18\tNV18\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\
\tNODE\tPIX\tNODE\tNODE\t56-111,168-223\t1\t\tN/A
GPU6\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t X \tNV18\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\
\tNODE\tNODE\tPIX\tNODE\t56-111,168-223\t1\t\tN/A
GPU7\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t X \tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\
\tNODE\tNODE\tNODE\tPIX\t56-111,168-223\t1\t\tN/A
NIC0\tPIX\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t X \tNODE\tNODE\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\
\tSYS\tSYS\tSYS\t\t\t
NIC1\tNODE\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tNODE\t X \tNODE\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\
\tSYS\tSYS\tSYS\t\t\t
"""


def run_double(state: Path, tool: str, *args: str) -> str:
    env = {**os.environ, "DDP_DOUBLES_STATE": str(state)}
    result = subprocess.run(
        [sys.executable, str(DOUBLES / tool), *args], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-23,48-71", (*range(24), *range(48, 72))),
        ("3", (3,)),
        (" 5,1-2 ", (1, 2, 5)),
        ("4,4,3-4", (3, 4)),
    ],
)
def test_parse_cpu_list(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "empty"),
        ("  ", "empty"),
        ("a-3", "'a-3'"),
        ("5-2", "'5-2'"),
        ("1,,2", "''"),
        ("-1", "'-1'"),
        ("N/A", "'N/A'"),
    ],
)
def test_parse_cpu_list_errors_name_the_part(text: str, named: str) -> None:
    with pytest.raises(TopologyError, match=named):
        parse_cpu_list(text)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        ((), ""),
        ((3,), "3"),
        ((3, 4), "3-4"),
        ((*range(24), *range(48, 72)), "0-23,48-71"),
        ([5, 1, 2, 1], "1-2,5"),
    ],
)
def test_format_cpu_list_is_compact(cpus: tuple[int, ...], text: str) -> None:
    assert format_cpu_list(cpus) == text
    if text:
        assert parse_cpu_list(text) == tuple(sorted(set(cpus)))


def test_npu_atlas_a2_sample() -> None:
    mapping = npu_affinity(ATLAS_A2)
    assert mapping == {
        0: "144-167",
        1: "144-167",
        2: "96-119",
        3: "96-119",
        4: "0-23",
        5: "0-23",
        6: "48-71",
        7: "48-71",
    }
    assert binding_text(mapping) == ATLAS_A2_BINDING


def test_npu_910a_sample_with_narrow_cells() -> None:
    assert npu_affinity(ATLAS_910A) == {0: "144-167", 1: "96-119", 2: "48-71", 3: "0-23"}


def test_npu_comma_joined_ranges_and_a3_labels() -> None:
    text = ATLAS_A2.replace("144-167", "0-63,128-191").replace("NPU", "Phy-ID")
    mapping = npu_affinity(text)
    assert mapping[0] == mapping[1] == "0-63,128-191"
    assert len(mapping) == 8
    two_digit = (
        "\t   Phy-ID12   Phy-ID13   CPU Affinity\nPhy-ID12   X          HCCS       0-23\n"
        "Phy-ID13   HCCS       X          24-47\n"
    )
    assert npu_affinity(two_digit) == {12: "0-23", 13: "24-47"}


def test_npu_without_affinity_column_is_not_guessed() -> None:
    text = "\n".join(
        line.rsplit("HCCS", 1)[0] + "HCCS" if line.startswith("NPU") else line
        for line in ATLAS_A2.replace("CPU Affinity", "").splitlines()
    )
    assert "CPU Affinity" not in text and "144-167" not in text
    with pytest.raises(TopologyError, match=r"no CPU Affinity column .*set cluster_cpu_binding: none"):
        npu_affinity(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("This device does not support querying topo.\n", "does not support querying topo"),
        ("", "no NPU rows"),
        ("Legend:\n\n  X    = Self\n", "no NPU rows"),
        ("\t   NPU0       CPU Affinity\n", "no NPU rows"),
        ("NPU0       X          0-23\n", "before the header"),
        (
            "\t   NPU0       NPU1       CPU Affinity\nNPU0       X          HCCS\n",
            "NPU0 has no CPU Affinity cell",
        ),
        ("\t   NPU0       CPU Affinity\nNPU0       X          NA\n", "NPU0 has CPU Affinity 'NA'"),
    ],
)
def test_npu_errors_name_what_is_missing(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        npu_affinity(text)


A100_BINDING = (
    "0=48-63,176-191;1=48-63,176-191;2=16-31,144-159;3=16-31,144-159;4=112-127,240-255;"
    "5=112-127,240-255;6=80-95,208-223;7=80-95,208-223"
)


def test_gpu_dgx_a100_sample() -> None:
    mapping = gpu_affinity(DGX_A100)
    assert sorted(mapping) == list(range(8))  # NIC rows are not devices
    assert mapping[0] == "48-63,176-191" and mapping[7] == "80-95,208-223"
    assert binding_text(mapping) == A100_BINDING


def test_gpu_dgx_h100_sample_with_ansi_header_and_gpu_numa_id() -> None:
    mapping = gpu_affinity(DGX_H100)
    assert mapping == {g: "0-55,112-167" if g < 4 else "56-111,168-223" for g in range(8)}


def test_gpu_output_whose_tabs_became_spaces() -> None:
    assert gpu_affinity(DGX_A100.expandtabs(8)) == gpu_affinity(DGX_A100)
    assert gpu_affinity(DGX_H100.expandtabs(8)) == gpu_affinity(DGX_H100)


def test_gpu_not_applicable_affinity_names_the_gpu() -> None:
    text = DGX_A100.replace("\t16-31,144-159\t1\nGPU3", "\tN/A\tN/A\nGPU3")
    with pytest.raises(TopologyError, match="no CPU affinity for GPU2 \\(N/A"):
        gpu_affinity(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no header with a CPU Affinity column"),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", "no header"),
        ("\tGPU0\tCPU Affinity\tNUMA Affinity\n", "no GPU rows"),
        ("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \n", "no CPU affinity for GPU0 \\(empty"),
        ("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tsome\t0\n", "GPU0 has CPU Affinity 'some'"),
    ],
)
def test_gpu_errors(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        gpu_affinity(text)


def test_binding_text_round_trip_and_normal_form() -> None:
    assert binding_text({3: "5,4", 1: "0-1"}) == "1=0-1;3=4-5"
    assert parse_binding_text(ATLAS_A2_BINDING)[2] == tuple(range(96, 120))
    assert parse_binding_text(" 1=0-1 ; 3=4-5; ") == {1: (0, 1), 3: (4, 5)}
    with pytest.raises(TopologyError, match="no devices"):
        binding_text({})
    with pytest.raises(TopologyError, match="CPU list 'x'"):
        binding_text({0: "x"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty CPU binding"),
        ("0:1-2", "'0:1-2' is not device=cpus"),
        ("a=1", "'a' is not a device number"),
        ("-1=1", "device -1 is negative"),
        ("0=1;0=2", "device 0 twice"),
        ("0=1;1=", "entry '1=' \\(device 1\\): empty CPU list"),
        ("0=3-1", "device 0"),
    ],
)
def test_parse_binding_text_errors(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        parse_binding_text(text)


@pytest.mark.parametrize(
    ("local_rank", "visible", "device"),
    [
        (0, None, 0),
        (3, None, 3),
        (3, "", 3),
        (2, " ", 2),
        (0, "4,5,6,7", 4),
        (3, "4, 5, 6, 7", 7),
        (1, "2,0", 0),
    ],
)
def test_rank_device(local_rank: int, visible: str | None, device: int) -> None:
    assert rank_device(local_rank, visible) == device


@pytest.mark.parametrize(
    ("local_rank", "visible", "message"),
    [
        (0, "GPU-9b19e176-bc38-59ea-a761-2d8bbc994a94", "'GPU-9b19e176-.*' is not a device number"),
        (0, "MIG-1,2", "'MIG-1'"),
        (0, "0,,1", "'' is not a device number"),
        (2, "4,5", "local rank 2 has no device: only 2 visible"),
        (-1, None, "negative"),
    ],
)
def test_rank_device_errors(local_rank: int, visible: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        rank_device(local_rank, visible)


def test_rank_cpus_keeps_to_the_allowed_cpus() -> None:
    binding = parse_binding_text("0=0-3;1=4-7")
    assert rank_cpus(binding, 0, set(range(8))) == (0, 1, 2, 3)
    assert rank_cpus(binding, 1, {0, 5, 7, 9}) == (5, 7)
    with pytest.raises(TopologyError, match="device 2 is not in the CPU binding \\(devices 0,1\\)"):
        rank_cpus(binding, 2, set(range(8)))
    with pytest.raises(TopologyError, match=r"device 1's CPUs 4-7 are all outside .* \(0-3\)"):
        rank_cpus(binding, 1, {0, 1, 2, 3})


def test_the_doubles_print_what_the_parsers_read(tmp_path: Path) -> None:
    assert run_double(tmp_path, "npu-smi", "info", "-t", "topo") == ATLAS_A2
    assert (
        binding_text(npu_affinity(run_double(tmp_path, "npu-smi", "info", "-t", "topo"))) == ATLAS_A2_BINDING
    )
    (tmp_path / "config.json").write_text(json.dumps({"nic_count": 10}))
    assert run_double(tmp_path, "nvidia-smi", "topo", "-m") == DGX_A100
    assert binding_text(gpu_affinity(run_double(tmp_path, "nvidia-smi", "topo", "-m"))) == A100_BINDING


def test_the_doubles_variants_through_the_parsers(tmp_path: Path) -> None:
    config = {
        "chip_count": 16,
        "missing": [3],
        "topo_label": "Phy-ID",
        "devices": {"12": {"cpu_affinity": "0-63,128-191"}},
        "gpu_count": 2,
        "topo_ansi": True,
        "topo_gpu_numa_id": True,
        "gpus": {"1": {"cpu_affinity": "8-15", "numa_affinity": "0"}},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    npu = npu_affinity(run_double(tmp_path, "npu-smi", "info", "-t", "topo"))
    assert sorted(npu) == [d for d in range(16) if d != 3]
    assert (npu[12], npu[8], npu[2]) == ("0-63,128-191", "144-167", "96-119")
    assert gpu_affinity(run_double(tmp_path, "nvidia-smi", "topo", "-m")) == {0: "48-63,176-191", 1: "8-15"}
    (tmp_path / "config.json").write_text(json.dumps({"topo_affinity": False}))
    with pytest.raises(TopologyError, match="no CPU Affinity column"):
        npu_affinity(run_double(tmp_path, "npu-smi", "info", "-t", "topo"))
    (tmp_path / "config.json").write_text(json.dumps({"topo": False}))
    with pytest.raises(TopologyError, match="does not support querying topo"):
        npu_affinity(run_double(tmp_path, "npu-smi", "info", "-t", "topo"))
    (tmp_path / "config.json").write_text(json.dumps({"gpus": {"0": {"cpu_affinity": "N/A"}}}))
    with pytest.raises(TopologyError, match="GPU0"):
        gpu_affinity(run_double(tmp_path, "nvidia-smi", "topo", "-m"))


def test_a_rank_binds_itself_to_its_devices_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from ddp_cluster.accelerators.binding import bind_rank
    from ddp_cluster.errors import DeviceError

    before = os.sched_getaffinity(0)
    mine = min(before)
    environ = {
        "DDP_CPU_BINDING": f"0=999;3={mine}",
        "DDP_ACCELERATOR": "npu",
        "ASCEND_RT_VISIBLE_DEVICES": "0,3",
    }
    try:
        said = bind_rank(1, environ)
        assert said == f"local rank 1 on device 3: bound to CPUs {mine} (DDP_CPU_BINDING)"
        assert os.sched_getaffinity(0) == {mine}
        outside = "device 0's CPUs 999 are all outside .*cluster_cpu_binding: none"
        with pytest.raises(DeviceError, match=outside):
            bind_rank(0, environ)
        assert bind_rank(0, {}) is None
    finally:
        os.sched_setaffinity(0, before)
