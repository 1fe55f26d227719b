"""The filters the Ascend roles and the npu preflight call (plugins/filter/ddp_cluster.py); no containers
needed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "ddp_cluster_filters", REPO / "plugins" / "filter" / "ddp_cluster.py"
)
assert _spec is not None and _spec.loader is not None
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)

# AI Server0 and AI Server1 of the Ascend PyTorch DDP manual.
SERVER0 = [f"192.168.{100 + d % 4}.{101 - d // 4}" for d in range(8)]
SERVER1 = [f"192.168.{100 + d % 4}.{111 - d // 4}" for d in range(8)]
HOSTVARS: dict[str, dict[str, Any]] = {
    "ai-server0": {"ansible_host": "10.10.0.10", "npu_device_ips": SERVER0},
    "ai-server1": {"ansible_host": "10.10.0.11", "npu_device_ip_seed": "192.168.100.111"},
}


def plan() -> dict[str, Any]:
    return filters.npu_plan(HOSTVARS, ["ai-server0", "ai-server1"], "atlas-training", "255.255.255.0")


def test_inventory_plan_expands_seeds_and_takes_ansible_host() -> None:
    assert plan()["servers"] == [
        {"host": "ai-server0", "host_ip": "10.10.0.10", "device_ips": SERVER0},
        {"host": "ai-server1", "host_ip": "10.10.0.11", "device_ips": SERVER1},
    ]


def test_inventory_plan_check_names_the_host_and_variable() -> None:
    hostvars = {**HOSTVARS, "ai-server1": {"ansible_host": "10.10.0.11"}}
    [violation] = filters.npu_plan_check(
        hostvars, ["ai-server0", "ai-server1"], "atlas-training", "255.255.255.0"
    )
    assert violation["server"] == "ai-server1"
    assert violation["rule"] == "inventory"
    assert "npu_device_ips" in violation["message"] and "npu_device_ip_seed" in violation["message"]
    with pytest.raises(AnsibleFilterError, match="ai-server1: no device addresses"):
        filters.npu_plan(hostvars, ["ai-server0", "ai-server1"], "atlas-training", "255.255.255.0")


def test_inventory_plan_check_reports_every_rule_broken() -> None:
    ips = list(SERVER0)
    ips[5] = "192.168.104.100"
    hostvars = {**HOSTVARS, "ai-server0": {"ansible_host": "10.10.0.10", "npu_device_ips": ips}}
    violations = filters.npu_plan_check(
        hostvars, ["ai-server0", "ai-server1"], "atlas-training", "255.255.255.0"
    )
    assert {(v["server"], v["device"], v["rule"]) for v in violations} == {
        ("ai-server0", 5, "pair-subnet"),
        ("ai-server0", 5, "position-subnet"),
    }
    report = filters.violation_report(violations)
    assert report.splitlines()[0].startswith(
        "  error [pair-subnet] server ai-server0, device 5: 192.168.104.100"
    )


def test_detect_defaults_to_the_same_device_of_the_next_server() -> None:
    settings = filters.hccn_device_settings(plan(), "ai-server0")
    assert [s["detect"] for s in settings] == SERVER1
    assert [s["address"] for s in settings] == SERVER0
    assert {s["netmask"] for s in settings} == {"255.255.255.0"}
    assert {s["gateway"] for s in settings} == {None}


def test_detect_and_gateway_take_one_address_or_one_per_device() -> None:
    settings = filters.hccn_device_settings(
        plan(), "ai-server1", "192.168.100.1", [f"10.0.0.{d}" for d in range(8)]
    )
    assert {s["detect"] for s in settings} == {"192.168.100.1"}
    assert [s["gateway"] for s in settings] == [f"10.0.0.{d}" for d in range(8)]
    with pytest.raises(AnsibleFilterError, match="list of 8"):
        filters.hccn_device_settings(plan(), "ai-server1", ["192.168.100.1"])
    with pytest.raises(AnsibleFilterError, match="not an IPv4 address"):
        filters.hccn_device_settings(plan(), "ai-server1", "gateway")


def test_a_lone_server_needs_detect_addresses() -> None:
    alone = filters.npu_plan(HOSTVARS, ["ai-server0"], "atlas-training", "255.255.255.0")
    with pytest.raises(AnsibleFilterError, match="npu_device_detect_ips"):
        filters.hccn_device_settings(alone, "ai-server0")


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        (["", "60000-60015"], "60000-60015"),
        (["22222", "60000-60015"], "22222,60000-60015"),
        (["60000-60015", "60000-60015"], "60000-60015"),
        (["59990-60005,60020", "60000-60015"], "59990-60015,60020"),
        (["60016", "60000-60015"], "60000-60016"),
        ([["8080", "8081"], "9000"], "8080-8081,9000"),
    ],
)
def test_port_ranges_merge_as_the_kernel_writes_them(specs: list[Any], expected: str) -> None:
    assert filters.port_ranges(*specs) == expected


def test_port_ranges_reject_nonsense() -> None:
    with pytest.raises(AnsibleFilterError):
        filters.port_ranges("60015-60000")
    with pytest.raises(AnsibleFilterError):
        filters.port_ranges("http")


def test_node_addresses_are_ip_addresses_names_resolved_on_the_controller() -> None:
    hostvars = {
        "a": {"ansible_host": "10.0.0.5"},
        "b": {"ansible_host": "localhost"},
        "c": {"node_container_address": "10.1.0.7", "ansible_host": "10.0.0.7"},
    }
    assert filters.node_addresses(hostvars, ["a", "b", "c"]) == {
        "a": "10.0.0.5",
        "b": "127.0.0.1",
        "c": "10.1.0.7",
    }
    with pytest.raises(
        AnsibleFilterError, match=r"d: its address 'no-such-host\.invalid' .* does not resolve"
    ):
        filters.node_addresses({"d": {"ansible_host": "no-such-host.invalid"}}, ["d"])


def test_a_local_node_without_an_address_is_on_the_loopback() -> None:
    # The local inventory on the host network: node names resolve nowhere, the node shares the controller's
    # stack.
    hostvars = {
        "node0": {"ansible_connection": "local"},
        "node1": {"ansible_connection": "local", "ansible_host": "10.0.0.9"},
    }
    assert filters.node_addresses(hostvars, ["node0", "node1"]) == {"node0": "127.0.0.1", "node1": "10.0.0.9"}
    with pytest.raises(AnsibleFilterError, match=r"node2: its address 'node2'"):
        filters.node_addresses({"node2": {"ansible_connection": "ssh"}}, ["node2"])
