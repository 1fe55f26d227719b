"""ddp_cluster.inventory: the inventory's hosts as the playbooks' filters read them (the filter plugin
plugins/filter/ddp_cluster.py is a shim over these, loaded by tests/unit/test_npu_filters.py), and
ddp_cluster.ascend.ports."""

from __future__ import annotations

from typing import Any

import pytest

from ddp_cluster.ascend.ports import PortRangeError, port_ranges
from ddp_cluster.errors import DdpClusterError
from ddp_cluster.inventory import hostvars, npu
from ddp_cluster.inventory.hostvars import InventoryError

SERVER0 = [
    f"192.168.{100 + d % 4}.{101 - d // 4}" for d in range(8)
]  # the Ascend PyTorch DDP manual's server 0
HOSTVARS: dict[str, dict[str, Any]] = {
    "ai-server0": {"ansible_host": "10.10.0.10", "npu_device_ips": SERVER0},
    "ai-server1": {
        "npu_host_ip": "10.10.0.11",
        "npu_device_ip_seed": "192.168.100.111",
        "npu_device_count": 8,
    },
}
HOSTS = ["ai-server0", "ai-server1"]


def test_errors_are_the_package_s() -> None:
    assert issubclass(InventoryError, DdpClusterError) and issubclass(PortRangeError, DdpClusterError)


def test_plain_turns_containers_and_scalars_into_python_data() -> None:
    class Text(str):
        pass

    value = hostvars.plain({"a": (1, Text("x")), 2: [True]})
    assert value == {"a": [1, "x"], "2": [True]} and type(value["a"][1]) is str
    assert hostvars.host_var({"a": ""}, "a") is None and hostvars.host_var({}, "a") is None


def test_the_plan_takes_npu_host_ip_then_ansible_host_and_expands_seeds() -> None:
    plan = npu.plan(HOSTVARS, HOSTS, "atlas-training", "255.255.255.0")
    assert [server["host_ip"] for server in plan["servers"]] == ["10.10.0.10", "10.10.0.11"]
    assert plan["servers"][1]["device_ips"][:2] == ["192.168.100.111", "192.168.101.111"]
    assert npu.plan_check(HOSTVARS, HOSTS, "atlas-training", "255.255.255.0") == []
    seeded = {"s": {"npu_device_ips": "192.168.100.101"}}  # one address: a seed
    assert npu.plan(seeded, ["s"], "atlas-training", "255.255.255.0")["servers"][0]["device_ips"] == SERVER0


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"npu_device_ips": SERVER0, "npu_device_ip_seed": "192.168.100.101"}, "not both"),
        ({"npu_device_ips": SERVER0, "npu_device_count": 4}, "npu_device_count=4 but npu_device_ips lists 8"),
        ({}, "no device addresses: set npu_device_ips"),
    ],
)
def test_inventory_problems_name_the_host_and_variable(variables: dict[str, Any], message: str) -> None:
    [violation] = npu.plan_check({"s": variables}, ["s"], "atlas-training", "255.255.255.0")
    assert violation["server"] == "s" and violation["rule"] == "inventory" and message in violation["message"]
    with pytest.raises(InventoryError, match=f"^s: .*{message}"):
        npu.plan({"s": variables}, ["s"], "atlas-training", "255.255.255.0")


def test_a_host_outside_the_inventory_and_an_unreadable_variable_are_violations() -> None:
    [outside] = npu.plan_check({}, ["ghost"], "atlas-training", "255.255.255.0")
    assert outside["message"] == "is not a host of the inventory"

    class Broken(dict[str, Any]):
        def __getitem__(self, key: str) -> Any:
            raise RuntimeError("'x' is undefined")

    [broken] = npu.plan_check({"s": Broken(npu_device_ips=1)}, ["s"], "atlas-training", "255.255.255.0")
    assert broken["message"] == "its npu_* variables cannot be read: 'x' is undefined"


def test_a_malformed_plan_is_named_and_a_broken_rule_reported() -> None:
    with pytest.raises(InventoryError, match="the NPU device-IP plan is malformed: product: 'atlas-9'"):
        npu.plan(HOSTVARS, HOSTS, "atlas-9", "255.255.255.0")
    ips = list(SERVER0)
    ips[5] = "192.168.104.100"
    broken = {**HOSTVARS, "ai-server0": {"ansible_host": "10.10.0.10", "npu_device_ips": ips}}
    violations = npu.plan_check(broken, HOSTS, "atlas-training", "255.255.255.0")
    assert npu.violation_lines(violations, "warning") == []
    assert (
        npu.violation_report(violations)
        .splitlines()[0]
        .startswith("  error [pair-subnet] server ai-server0, device 5: 192.168.104.100")
    )


def test_device_settings_name_what_does_not_fit() -> None:
    plan = npu.plan(HOSTVARS, HOSTS, "atlas-training", "255.255.255.0")
    assert [s["detect"] for s in npu.device_settings(plan, "ai-server1")] == SERVER0
    with pytest.raises(InventoryError, match=r"gateways .* list of 8"):
        npu.device_settings(plan, "ai-server1", None, ["10.0.0.1"])


def test_node_addresses_resolve_names_and_put_local_nodes_on_the_loopback() -> None:
    variables = {
        "a": {"ansible_host": "10.0.0.5"},
        "b": {"ansible_host": "localhost"},
        "c": {"node_container_address": "10.1.0.7", "ansible_host": "10.0.0.7"},
        "d": {"ansible_connection": "local"},
    }
    assert hostvars.node_addresses(variables, "abcd") == {
        "a": "10.0.0.5",
        "b": "127.0.0.1",
        "c": "10.1.0.7",
        "d": "127.0.0.1",
    }
    with pytest.raises(InventoryError, match=r"e: its address 'no-such-host\.invalid' .* does not resolve"):
        hostvars.node_addresses({"e": {"ansible_host": "no-such-host.invalid"}}, ["e"])


def test_ssh_targets_reach_each_server_as_ansible_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/op")
    variables = {
        "s0": {},
        "s1": {
            "ansible_host": "10.0.0.2",
            "ansible_port": 2222,
            "ansible_user": "ops",
            "ansible_ssh_private_key_file": "~/.ssh/cluster",
            "ansible_ssh_common_args": "-o ProxyJump=bastion",
            "ansible_ssh_extra_args": "-o 'ServerAliveInterval 5'",
        },
    }
    assert hostvars.ssh_targets(variables, ["s0", "s1"]) == [
        {"name": "s0", "ssh": ["ssh", "-o", "StrictHostKeyChecking=yes", "s0"]},
        {
            "name": "s1",
            "ssh": ["ssh", "-o", "StrictHostKeyChecking=yes", "-p", "2222", "-l", "ops", "-i",
                    "/home/op/.ssh/cluster", "-o", "ProxyJump=bastion", "-o", "ServerAliveInterval 5",
                    "10.0.0.2"],
        },
    ]  # fmt: skip


def test_port_ranges_merge_as_the_kernel_writes_them_and_refuse_nonsense() -> None:
    assert port_ranges("59990-60005,60020", "60000-60015") == "59990-60015,60020"
    assert port_ranges(["8080", 8081], None, "9000") == "8080-8081,9000"
    for bad, message in (("60015-60000", "within 1-65535"), ("http", "not a port"), ("0", "within 1-65535")):
        with pytest.raises(PortRangeError, match=message):
            port_ranges(bad)
