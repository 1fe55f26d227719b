"""Real 3-process gloo runs of ``python -m ddp_cluster.gate`` on this host, each process a "node" of its own
(torchrun's variables with GROUP_RANK), as check.yml starts it on a cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.health import judge as health

from conftest import clean_environ, free_port

# Small and quick: the figures are not judged here (the fraction is low), only what the gate reports.
QUICK = ["--min-bytes", "4096", "--max-bytes", "65536", "--seconds-per-size", "0.05", "--fraction", "0.01"]


def run_gate(
    tmp_path: Path, nodes: int, extra_env: dict[int, dict[str, str]] | None = None, per_node: int = 1
) -> dict[str, Any]:
    port = free_port()
    out = tmp_path / "out"
    procs = []
    world = nodes * per_node
    for rank in range(world):
        env = clean_environ() | {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank % per_node),
            "LOCAL_WORLD_SIZE": str(per_node),
            "GROUP_RANK": str(rank // per_node),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "DDP_NODE_NAME": f"node{rank // per_node}",
            "DDP_DEVICE": "cpu",
            "DDP_LAUNCHER": "torchrun",
        }
        env |= (extra_env or {}).get(rank, {})
        command = [sys.executable, "-m", "ddp_cluster.gate", "--output-dir", str(out), *QUICK]
        procs.append(
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * world, "\n".join(outputs)
    assert outputs[0].startswith("health gate "), outputs[0]
    return health.load(out)


def test_the_gate_measures_every_size_and_every_pair_of_the_ring(tmp_path: Path) -> None:
    results = run_gate(tmp_path, 3)
    assert results["nodes"] == ["node0", "node1", "node2"]
    assert (results["world_size"], results["backend"], results["device"]) == (3, "gloo", "cpu")
    assert [row["bytes"] for row in results["sweep"]] == [4096, 16384, 65536]
    assert all(
        row["time_us"] > 0 and row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 4 / 3, rel=0.01)
        for row in results["sweep"]
    )
    assert [(pair["a"], pair["b"]) for pair in results["pairs"]] == [
        ("node0", "node1"),
        ("node1", "node2"),
        ("node2", "node0"),
    ]
    assert results["check"] == {"ok": True, "expected": 6.0, "wrong_ranks": [], "got": []}
    assert results["reports"][1]["versions"]["torch"] == __import__("torch").__version__
    assert results["verdict"]["passed"], results["verdict"]


def test_a_variable_set_on_one_node_only_fails_the_gate_naming_that_node(tmp_path: Path) -> None:
    results = run_gate(tmp_path, 3, {1: {"NCCL_DEBUG": "INFO"}})
    assert not results["verdict"]["passed"]
    assert results["verdict"]["problems"] == [
        "NCCL_DEBUG differs: node node1 (rank 1) has 'INFO'; the others have it unset"
    ]
    report = json.dumps(results["verdict"]["differences"])
    assert "node1" in report and "node0" not in report


def test_with_several_processes_per_node_every_device_is_paired_with_its_counterpart(tmp_path: Path) -> None:
    results = run_gate(tmp_path, 2, per_node=2)
    assert (results["nodes"], results["world_size"]) == (["node0", "node1"], 4)
    assert [(pair["a"], pair["b"], pair["device"]) for pair in results["pairs"]] == [
        ("node0", "node1", 0),
        ("node0", "node1", 1),
    ]
    assert results["sweep"][0]["busbw_gbps"] == pytest.approx(
        results["sweep"][0]["algbw_gbps"] * 1.5, rel=0.01
    )
    assert [report["rank"] for report in results["reports"]] == [0, 1, 2, 3]
    assert results["verdict"]["passed"], results["verdict"]


def test_a_ring_of_three_nodes_with_two_devices_measures_six_device_links(tmp_path: Path) -> None:
    # Each local rank's pairs on an interface of its own (DDP_GLOO_DEVICE_IFNAMES): here both are loopback.
    results = run_gate(
        tmp_path, 3, {rank: {"DDP_GLOO_DEVICE_IFNAMES": "lo,lo"} for rank in range(6)}, per_node=2
    )
    assert [(pair["a"], pair["b"], pair["device"]) for pair in results["pairs"]] == [
        (a, b, device)
        for device in (0, 1)
        for a, b in (("node0", "node1"), ("node1", "node2"), ("node2", "node0"))
    ]
    assert all(pair["busbw_gbps"] > 0 for pair in results["pairs"])
    assert all(pair["iterations"] >= 2 for pair in results["pairs"])  # a pair's figure: the fastest of 3+
    assert "node0 device 1 <-> node1 device 1" in health.render(results)


def test_a_node_with_fewer_interfaces_than_processes_is_refused_naming_the_variable() -> None:
    from ddp_cluster.errors import DdpClusterError
    from ddp_cluster.health.gate import device_interface

    assert device_interface(1, {"DDP_GLOO_DEVICE_IFNAMES": "eth0, eth1"}) == "eth1"
    assert device_interface(0, {}) is None
    with pytest.raises(DdpClusterError, match="DDP_GLOO_DEVICE_IFNAMES=eth0 names 1 interface"):
        device_interface(1, {"DDP_GLOO_DEVICE_IFNAMES": "eth0"})


def test_cann_version_is_read_where_the_toolkit_package_puts_it(tmp_path: Path) -> None:
    from ddp_cluster.health.gate import cann_version

    assert cann_version(str(tmp_path), "aarch64") is None
    (tmp_path / "ascend_toolkit_install.info").write_text("package_name=Ascend-cann-toolkit\nversion=8.0.0\n")
    assert cann_version(str(tmp_path), "aarch64") == "8.0.0"
    (tmp_path / "aarch64-linux").mkdir()
    (tmp_path / "aarch64-linux" / "ascend_toolkit_install.info").write_text("version=8.2.RC1\narch=aarch64\n")
    assert cann_version(str(tmp_path), "aarch64") == "8.2.RC1"


class FakeAllReduce:
    """dist.all_reduce without a process group: a large tensor's operation sleeps ``seconds``, or what
    ``stalls`` gives for that operation's number (0: the warm-up, 1: the probe); a one-element one (the
    group's slowest time) returns at once, as on a group of one."""

    def __init__(self, seconds: float, stalls: dict[int, float] | None = None) -> None:
        self.seconds = seconds
        self.stalls = stalls or {}
        self.operations = 0

    def __call__(self, tensor: Any, op: Any = None, group: Any = None) -> None:
        if tensor.numel() == 1:
            return
        time.sleep(self.stalls.get(self.operations, self.seconds))
        self.operations += 1


def measure(monkeypatch: pytest.MonkeyPatch, fake: FakeAllReduce, seconds_per_size: float) -> Any:
    from ddp_cluster.health import gate
    from ddp_cluster.runtime.device import Placement

    monkeypatch.setattr(gate.dist, "all_reduce", fake)
    return gate.Measure(Placement("cpu", None, "gloo"), seconds_per_size, 20)


@pytest.mark.parametrize("stalled", [1, 2, 3])
def test_a_stall_in_one_operation_does_not_decide_a_pairs_figure(
    monkeypatch: pytest.MonkeyPatch, stalled: int
) -> None:
    # 2 ms an operation, one (the probe, or a timed one) stalled 300 ms by another process on the cores
    fake = FakeAllReduce(0.002, {stalled: 0.3})
    seconds, iterations = measure(monkeypatch, fake, 0.01).fastest(4096)
    assert seconds < 0.03 and iterations >= 2  # a mean over the probe and 5 operations: 0.05 s or more
    # the sweep's mean keeps what nccl-tests reports: every operation's time, the stall's too
    fake = FakeAllReduce(0.002, {2: 0.3})
    mean, iterations = measure(monkeypatch, fake, 0.01).allreduce(4096)
    assert mean > 0.3 / iterations


def test_a_pair_slower_than_the_budget_still_times_two_operations_and_a_slow_link_stays_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeAllReduce(0.05)
    seconds, iterations = measure(monkeypatch, fake, 0.01).fastest(4096)
    assert iterations == 2 and fake.operations == 4  # warm-up, probe, two timed
    assert seconds >= 0.05
