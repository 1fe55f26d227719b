"""The health gate's judgement (no torch): environment parity, nccl-tests' figures, the ring's pairs and
phases, slow nodes and links, the report and ``ddp-cluster health``'s exit status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.cli import main as cli_main
from ddp_cluster.health import judge as health


def report(node: str, rank: int, **variables: str) -> dict[str, Any]:
    return {
        "node": node,
        "rank": rank,
        "versions": {"python": "3.11.2", "torch": "2.13.0"},
        "devices": None,
        "variables": {"MASTER_ADDR": "node0", **variables},
    }


def pair(a: str, b: str, busbw: float) -> dict[str, Any]:
    return {"a": a, "b": b, "bytes": 16 << 20, "time_us": 1.0, "busbw_gbps": busbw, "algbw_gbps": busbw}


# --- environment parity ---


def test_steering_variables_keep_only_what_steers_collectives() -> None:
    environ = {
        "NCCL_DEBUG": "INFO",
        "HCCL_CONNECT_TIMEOUT": "600",
        "GLOO_SOCKET_IFNAME": "eth0",
        "MASTER_PORT": "29501",
        "LD_LIBRARY_PATH": "/usr/lib",
        "HOME": "/root",
        "RANK": "1",
        "PATH": "/bin",
    }
    assert health.steering_variables(environ) == {
        "GLOO_SOCKET_IFNAME": "eth0",
        "HCCL_CONNECT_TIMEOUT": "600",
        "LD_LIBRARY_PATH": "/usr/lib",
        "MASTER_PORT": "29501",
        "NCCL_DEBUG": "INFO",
    }


def test_a_nodes_own_interface_and_address_compare_as_what_they_stand_for() -> None:
    own = health.steering_variables(
        {"GLOO_SOCKET_IFNAME": "ens5", "HCCL_IF_IP": "10.0.0.7"}, interface="ens5", addresses=["10.0.0.7"]
    )
    assert own == {"GLOO_SOCKET_IFNAME": health.OWN_INTERFACE, "HCCL_IF_IP": health.OWN_ADDRESS}
    elsewhere = health.steering_variables(
        {"GLOO_SOCKET_IFNAME": "docker0", "HCCL_IF_IP": "10.0.0.9"}, interface="ens5", addresses=["10.0.0.7"]
    )
    assert elsewhere == {"GLOO_SOCKET_IFNAME": "docker0", "HCCL_IF_IP": "10.0.0.9"}


def test_identical_ranks_have_no_differences() -> None:
    assert health.parity([report("node0", 0), report("node1", 1), report("node2", 2)]) == []


def test_the_rank_that_differs_from_the_majority_is_named_with_its_node() -> None:
    reports = [report("node0", 0), report("node1", 1, NCCL_DEBUG="INFO"), report("node2", 2)]
    (difference,) = health.parity(reports)
    assert difference.name == "NCCL_DEBUG"
    assert difference.has_majority and difference.majority is None  # unset on the majority
    assert difference.others == (("node1", 1, "INFO"),)
    (problem,) = health.parity_problems([difference])
    assert problem == "NCCL_DEBUG differs: node node1 (rank 1) has 'INFO'; the others have it unset"


def test_a_different_version_is_named() -> None:
    reports = [report("node0", 0), report("node1", 1), report("node2", 2)]
    reports[2]["versions"]["torch"] = "2.12.1"
    (difference,) = health.parity(reports)
    assert (difference.name, difference.majority, difference.others) == (
        "torch",
        "2.13.0",
        (("node2", 2, "2.12.1"),),
    )


def test_two_nodes_that_disagree_are_both_named() -> None:
    (difference,) = health.parity(
        [report("node0", 0, NCCL_IB_HCA="mlx5_0"), report("node1", 1, NCCL_IB_HCA="mlx5_1")]
    )
    assert not difference.has_majority
    assert [node for node, _, _ in difference.others] == ["node0", "node1"]
    (problem,) = health.parity_problems([difference])
    assert (
        "node node0 (rank 0) has 'mlx5_0'; node node1 (rank 1) has 'mlx5_1'; no value is held by a majority"
        in problem
    )


def test_ignored_settings_may_differ() -> None:
    reports = [report("node0", 0), report("node1", 1, NCCL_DEBUG="INFO"), report("node2", 2)]
    assert health.parity(reports, ignore=["NCCL_DEBUG"]) == []


def test_device_count_is_compared() -> None:
    reports = [report("node0", 0), report("node1", 1), report("node2", 2)]
    for item, count in zip(reports, (8, 8, 7), strict=True):
        item["devices"] = count
    (difference,) = health.parity(reports)
    assert (difference.name, difference.majority, difference.others) == ("devices", "8", (("node2", 2, "7"),))


# --- figures, sizes, the ring ---


@pytest.mark.parametrize(("ranks", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_busbw_factor_is_nccl_tests(ranks: int, factor: float) -> None:
    assert health.busbw_factor(ranks) == factor


def test_allreduce_row() -> None:
    row = health.allreduce_row(8 << 20, 0.004, 4, 10)
    assert row["count"] == 2 << 20 and row["iterations"] == 10 and row["time_us"] == 4000.0
    assert row["algbw_gbps"] == pytest.approx((8 << 20) / 0.004 / 1e9, rel=1e-3)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 1.5, rel=1e-3)


def test_sweep_sizes() -> None:
    assert health.sweep_sizes(4096, 16 << 20, 4) == [4096 * 4**step for step in range(7)]
    assert health.sweep_sizes(8, 8, 2) == [8]
    for bad in ((2, 8, 2), (16, 8, 2), (8, 64, 1)):
        with pytest.raises(ValueError, match="need 4 <= min <= max"):
            health.sweep_sizes(*bad)


def test_ring_pairs() -> None:
    assert health.ring_pairs(1) == []
    assert health.ring_pairs(2) == [(0, 1)]
    assert health.ring_pairs(4) == [(0, 1), (1, 2), (2, 3), (3, 0)]


@pytest.mark.parametrize("nodes", range(1, 40))
def test_ring_phases_cover_every_pair_once_with_no_node_twice_in_a_phase(nodes: int) -> None:
    pairs = health.ring_pairs(nodes)
    phases = health.ring_phases(nodes)
    assert sorted(index for phase in phases for index in phase) == list(range(len(pairs)))
    assert len(phases) <= 3  # the gate's time does not grow with the node count
    for phase in phases:
        members = [node for index in phase for node in pairs[index]]
        assert len(members) == len(set(members))


@pytest.mark.parametrize("nodes", [2, 3, 4, 5])
@pytest.mark.parametrize("devices", [[0], [0, 1], list(range(8))])
def test_pair_rounds_measure_every_device_pair_once_and_on_gloo_one_device_at_a_time(
    nodes: int, devices: list[int]
) -> None:
    pairs = health.ring_pairs(nodes)
    every = sorted((index, device) for index in range(len(pairs)) for device in devices)
    together = health.pair_rounds(nodes, devices, together=True)
    in_turn = health.pair_rounds(nodes, devices, together=False)
    for rounds in (together, in_turn):
        assert sorted(entry for batch in rounds for entry in batch) == every
        for batch in rounds:  # no device of a node in two pairs at once
            ends = [(node, device) for index, device in batch for node in pairs[index]]
            assert len(ends) == len(set(ends))
    # nccl, hccl: a phase's devices at once, the time grows with neither nodes nor devices
    assert together == [
        [(index, device) for index in phase for device in devices] for phase in health.ring_phases(nodes)
    ]
    # gloo: the host's cores carry every pair, one device a round: its figure compares with its siblings'
    assert len(in_turn) == len(health.ring_phases(nodes)) * len(devices)
    assert all(len({device for _, device in batch}) == 1 for batch in in_turn)


# --- slow nodes and links ---


def test_a_healthy_ring_passes() -> None:
    rows, problems = health.judge_pairs(
        ["node0", "node1", "node2", "node3"],
        [
            pair("node0", "node1", 1.0),
            pair("node1", "node2", 0.9),
            pair("node2", "node3", 1.1),
            pair("node3", "node0", 0.95),
        ],
        health.Thresholds(),
    )
    assert problems == [] and not any(row["slow"] for row in rows)


def test_a_slow_node_is_named_and_its_pairs_are_not_blamed_on_links() -> None:
    nodes = ["node0", "node1", "node2"]
    pairs = [pair("node0", "node1", 0.02), pair("node1", "node2", 0.02), pair("node2", "node0", 1.0)]
    rows, problems = health.judge_pairs(nodes, pairs, health.Thresholds())
    assert problems == [
        "node node1 is slow: its best pair reached 0.020 GB/s busbw, below 0.5 x the median node (1.000 GB/s)"
    ]
    assert [row["node"] for row in rows if row["slow"]] == ["node1"]


def test_a_slow_link_is_named_when_no_node_explains_it() -> None:
    nodes = ["node0", "node1", "node2", "node3"]
    pairs = [
        pair("node0", "node1", 1.0),
        pair("node1", "node2", 0.1),
        pair("node2", "node3", 1.0),
        pair("node3", "node0", 1.0),
    ]
    _, problems = health.judge_pairs(nodes, pairs, health.Thresholds())
    assert problems == [
        "the link node1 <-> node2 is slow: 0.100 GB/s busbw, below 0.5 x the median pair (1.000 GB/s)"
    ]


def test_two_nodes_fail_only_below_the_floor() -> None:
    nodes = ["node0", "node1"]
    assert health.judge_pairs(nodes, [pair("node0", "node1", 0.5)], health.Thresholds())[1] == []
    _, problems = health.judge_pairs(nodes, [pair("node0", "node1", 0.5)], health.Thresholds(floor_gbps=2))
    assert problems == ["the link node0 <-> node1 is slow: 0.500 GB/s busbw, below the floor of 2 GB/s"]


def test_the_floor_names_a_node_of_a_ring_that_is_slow_everywhere() -> None:
    nodes = ["node0", "node1", "node2"]
    pairs = [pair("node0", "node1", 1.0), pair("node1", "node2", 1.0), pair("node2", "node0", 0.2)]
    _, problems = health.judge_pairs(nodes, pairs, health.Thresholds(fraction=0.5, floor_gbps=0.5))
    assert problems == [
        "the link node2 <-> node0 is slow: 0.200 GB/s busbw, below 0.5 x the median pair (1.000 GB/s)"
        " and the floor of 0.5 GB/s"
    ]
    _, problems = health.judge_pairs(nodes, pairs, health.Thresholds(floor_gbps=5))
    assert problems == [
        "every pair is below the floor of 5 GB/s (the best reached 1.000 GB/s busbw): the fabric, or every"
        " node, is slower than the inventory expects"
    ]


def ring(count: int, slow: set[int], fast: float = 1.0, slowed: float = 0.05) -> list[dict[str, Any]]:
    return [pair(f"n{a}", f"n{b}", slowed if {a, b} & slow else fast) for a, b in health.ring_pairs(count)]


@pytest.mark.parametrize(
    ("count", "slow", "named", "undetermined"),
    [
        (3, {1}, ["n1"], []),
        (8, {3}, ["n3"], []),
        (6, {0, 2}, ["n0", "n2"], ["n1"]),  # n1 sits between two slow nodes: not blamed
        (8, {0, 2}, ["n0", "n2"], ["n1"]),
        (8, {2, 5}, ["n2", "n5"], []),
    ],
)
def test_slow_nodes_are_named_and_a_healthy_node_between_two_is_never_blamed(
    count: int, slow: set[int], named: list[str], undetermined: list[str]
) -> None:
    nodes = [f"n{index}" for index in range(count)]
    rows, problems = health.judge_pairs(nodes, ring(count, slow), health.Thresholds())
    assert [row["node"] for row in rows if row["verdict"] == "slow"] == named
    assert [row["node"] for row in rows if row["verdict"] == "undetermined"] == undetermined
    assert all(problem.startswith("node ") for problem in problems)


@pytest.mark.parametrize(("fraction", "floor"), [(0, 0), (1.5, 0), (0.5, -1)])
def test_bad_thresholds_are_refused(fraction: float, floor: float) -> None:
    with pytest.raises(ValueError, match=r"fraction|floor"):
        health.Thresholds(fraction, floor)


# --- the verdict, the report, the command ---


# --- every device's own link ---


def device_ring(
    nodes: int, devices: int, slow: set[tuple[int, int]], fast: float = 1.0, slowed: float = 0.05
) -> list[dict[str, Any]]:
    """The pairs of a ring of ``nodes`` nodes, one per device, the units in ``slow`` (node, device) slowed."""
    return [
        pair(f"n{a}", f"n{b}", slowed if {(a, device), (b, device)} & slow else fast) | {"device": device}
        for device in range(devices)
        for a, b in health.ring_pairs(nodes)
    ]


def test_one_slow_device_is_named_by_node_and_device_and_its_sibling_devices_pass() -> None:
    nodes = ["n0", "n1", "n2", "n3"]
    rows, problems = health.judge_pairs(nodes, device_ring(4, 8, {(2, 5)}), health.Thresholds())
    assert problems == [
        "node n2 device 5 is slow: its best pair reached 0.050 GB/s busbw, below 0.5 x the median device"
        " (1.000 GB/s)"
    ]
    assert [(row["node"], row["device"]) for row in rows if row["slow"]] == [("n2", 5)]
    assert len(rows) == 32


def test_a_node_slow_on_every_device_is_named_once_as_a_slow_node() -> None:
    slow = {(1, device) for device in range(4)}
    _, problems = health.judge_pairs(["n0", "n1", "n2"], device_ring(3, 4, slow), health.Thresholds())
    assert problems == [
        "node n1 is slow on every device: its best pair reached 0.050 GB/s busbw, below 0.5 x the median"
        " device (1.000 GB/s)"
    ]


def test_on_two_nodes_a_slow_device_pair_is_named_as_that_devices_link() -> None:
    _, problems = health.judge_pairs(["n0", "n1"], device_ring(2, 2, {(1, 1)}), health.Thresholds())
    assert problems == [
        "the link n0 device 1 <-> n1 device 1 is slow: 0.050 GB/s busbw, below 0.5 x the median device"
        " (0.525 GB/s)"
    ]


def test_the_report_lists_every_device_pair() -> None:
    text = health.render(gate_results(pairs=device_ring(3, 2, set())))
    assert "between the same device (local rank) of two nodes" in text
    assert text.count(" <-> ") == 6 and "n2 device 1 <-> n0 device 1" in text


def gate_results(**changes: Any) -> dict[str, Any]:
    results: dict[str, Any] = {
        "nodes": ["node0", "node1", "node2"],
        "world_size": 3,
        "backend": "gloo",
        "device": "cpu",
        "launcher": "mpirun",
        "seconds": 2.5,
        "thresholds": {"fraction": 0.5, "floor_gbps": 0.0},
        "ignore": [],
        "reports": [report("node0", 0), report("node1", 1), report("node2", 2)],
        "sweep": [health.allreduce_row(4096, 0.001, 3, 20), health.allreduce_row(16 << 20, 0.02, 3, 10)],
        "check": {"ok": True, "expected": 6.0, "wrong_ranks": [], "got": []},
        "pairs": [pair("node0", "node1", 1.0), pair("node1", "node2", 1.0), pair("node2", "node0", 1.0)],
    }
    results |= changes
    results["verdict"] = health.verdict(results)
    return results


def test_verdict_orders_problems_environment_first() -> None:
    results = gate_results(
        reports=[report("node0", 0), report("node1", 1), report("node2", 2, NCCL_DEBUG="INFO")],
        check={"ok": False, "expected": 6.0, "wrong_ranks": [2], "got": [5.0]},
        pairs=[pair("node0", "node1", 1.0), pair("node1", "node2", 0.01), pair("node2", "node0", 0.01)],
    )
    problems = results["verdict"]["problems"]
    assert not results["verdict"]["passed"]
    assert problems[0].startswith("NCCL_DEBUG differs: node node2 (rank 2)")
    assert problems[1].startswith("all-reduce gave wrong sums: expected 6.0, rank(s) [2] got [5.0]")
    assert problems[2].startswith("node node2 is slow")


def test_render_shows_the_verdict_and_the_tables() -> None:
    text = health.render(gate_results())
    assert text.startswith("health gate PASSED: 3 node(s), 3 rank(s), gloo on cpu, mpirun, 2.5 s")
    assert "environment: python 3.11.2, torch 2.13.0" in text
    assert "algbw (GB/s)  busbw (GB/s)" in text
    assert "node2 <-> node0" in text
    failed = health.render(
        gate_results(
            pairs=[pair("node0", "node1", 1.0), pair("node1", "node2", 0.01), pair("node2", "node0", 0.01)]
        )
    )
    assert failed.startswith("health gate FAILED")
    assert "\nproblems:\n  - node node2 is slow" in failed


def test_cli_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    passed, failed, broken = tmp_path / "passed", tmp_path / "failed", tmp_path / "broken"
    for directory in (passed, failed, broken):
        directory.mkdir()
    (passed / "health.json").write_text(json.dumps(gate_results()))
    slow = [pair("node0", "node1", 1.0), pair("node1", "node2", 0.01), pair("node2", "node0", 0.01)]
    (failed / "health.json").write_text(json.dumps(gate_results(pairs=slow)))
    (broken / "health.json").write_text("{not json")
    assert cli_main(["health", str(passed)]) == 0
    assert cli_main(["health", str(failed / "health.json")]) == 1
    assert "node node2 is slow" in capsys.readouterr().out
    assert cli_main(["health", str(broken)]) == 2
    assert cli_main(["health", str(tmp_path / "missing")]) == 2
    assert "missing does not exist: give a health gate's run directory" in capsys.readouterr().err
    (tmp_path / "nogate").mkdir()  # a run directory the gate wrote nothing into
    assert cli_main(["health", str(tmp_path / "nogate")]) == 2
    assert "does not exist: the gate wrote no results" in capsys.readouterr().err
    assert cli_main(["health", str(failed), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["passed"] is False


def test_one_rank_says_its_figures_are_no_bandwidth() -> None:
    text = health.render(gate_results(world_size=1, nodes=["node0"], pairs=[], reports=[report("node0", 0)]))
    assert "on one rank: nothing crosses a link" in text and "ring pairs: none (one node)" in text


def test_a_gpu_node_that_fell_back_to_sockets_with_active_hcas_fails_naming_it() -> None:
    active = {"name": "mlx5_0", "ports": [{"port": 1, "state": "ACTIVE", "link_layer": "InfiniBand"}]}
    ib = {"network": "IB", "ib_devices": ["mlx5_0:1/IB"]}
    socket = {"network": "Socket", "socket_interfaces": ["eth0"]}
    fabric = [
        {"node": "node0", "transport": ib, "hcas": [active], "rdma_devices": True},
        {"node": "node1", "transport": socket, "hcas": [active], "rdma_devices": False},
        {"node": "node2", "transport": socket, "hcas": [], "rdma_devices": False},
    ]
    results = gate_results(fabric=fabric, backend="nccl", device="cuda")
    judged = health.verdict(results)
    assert not judged["passed"]
    assert [problem.split(" (")[0] for problem in judged["problems"]] == [
        "node node1 fell back to NCCL's socket transport"
    ]
    assert "no /dev/infiniband/uverbs* device" in judged["problems"][0]
    text = health.render(results | {"verdict": judged})
    assert "network: node node0: NCCL IB (mlx5_0:1/IB); InfiniBand/RoCE adapters: mlx5_0" in text
    assert "network: node node2: NCCL Socket (eth0); InfiniBand/RoCE adapters: none" in text
