"""Device-IP plans: the vendor examples pass, each documented rule is enforced, bad input is named."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_cluster.ascend import ipplan
from ddp_cluster.ascend.ipplan import (
    IpPlanError,
    Violation,
    check_plan,
    check_plan_dict,
    expand_device_ip_seed,
    load_plan,
    normalize_plan_dict,
    plan_from_dict,
)

DATA = Path(__file__).parent / "data"

# The Ascend PyTorch DDP manual, "在AI Server0上配置device IP" / "在AI Server1上配置device IP".
MANUAL_SERVER0 = [
    "192.168.100.101",
    "192.168.101.101",
    "192.168.102.101",
    "192.168.103.101",
    "192.168.100.100",
    "192.168.101.100",
    "192.168.102.100",
    "192.168.103.100",
]
MANUAL_SERVER1 = [
    "192.168.100.111",
    "192.168.101.111",
    "192.168.102.111",
    "192.168.103.111",
    "192.168.100.110",
    "192.168.101.110",
    "192.168.102.110",
    "192.168.103.110",
]


def manual_plan() -> dict[str, Any]:
    return {
        "product": "atlas-training",
        "netmask": "255.255.255.0",
        "servers": [
            {"host": "server0", "host_ip": "192.168.1.22", "device_ips": list(MANUAL_SERVER0)},
            {"host": "server1", "host_ip": "192.168.1.23", "device_ips": list(MANUAL_SERVER1)},
        ],
    }


def one_server(device_ips: list[str], product: str = "atlas-training", netmask: str = "255.255.255.0") -> Any:
    return {
        "product": product,
        "netmask": netmask,
        "servers": [{"host": "n1", "host_ip": "172.16.0.1", "device_ips": device_ips}],
    }


def a2(*seeds: str, netmask: str = "255.255.255.0") -> dict[str, Any]:
    return {
        "product": "atlas-a2",
        "netmask": netmask,
        "servers": [
            {"host": f"n{i}", "host_ip": f"172.16.0.{i}", "device_ip_seed": seed}
            for i, seed in enumerate(seeds)
        ],
    }


def found(data: Any) -> set[tuple[str | None, int | None, str]]:
    return {(v.server, v.device, v.rule) for v in check_plan(plan_from_dict(data))}


# --- the vendor's own examples ---------------------------------------------------------------------------


def test_pytorch_manual_two_servers_pass() -> None:
    plan = load_plan(DATA / "pytorch_manual_two_servers.yml")
    assert [list(s.device_ips) for s in plan.servers] == [MANUAL_SERVER0, MANUAL_SERVER1]
    assert check_plan(plan) == []


def test_pytorch_manual_seed_form_expands_to_the_seeds_addresses() -> None:
    plan = load_plan(DATA / "pytorch_manual_two_servers_seeded.yml")
    assert [list(s.device_ips) for s in plan.servers] == [MANUAL_SERVER0, MANUAL_SERVER1]
    assert check_plan(plan) == []


def test_mindocr_manual_single_server_passes() -> None:
    assert check_plan(load_plan(DATA / "mindocr_manual_one_server.yml")) == []


def test_a2_example_passes_with_the_checklist_layout() -> None:
    plan = load_plan(DATA / "a2_two_servers.yml")
    assert list(plan.servers[0].device_ips) == [f"10.20.30.{n}" for n in range(2, 10)]
    assert list(plan.servers[1].device_ips) == [f"10.20.30.{n}" for n in range(10, 18)]
    assert check_plan(plan) == []


def test_the_checklist_example_taken_literally_clashes() -> None:
    # The Ascend multi-node checklist shows 10.x.x.2 ... 10.x.x.9 on both servers; in one subnet those would
    # be the same addresses.
    data = a2("10.20.30.2", "10.20.30.2")
    assert found(data) == {("n1", d, "ip-unique") for d in range(8)}


def test_broken_fixture_reports_each_mistake() -> None:
    assert found(yaml.safe_load((DATA / "pytorch_manual_broken.yml").read_text())) == {
        ("server1", 4, "ip-unique"),
        ("server1", 5, "pair-subnet"),
        ("server1", 5, "position-subnet"),
        ("server2", None, "device-count"),
        ("server2", None, "device-count-uniform"),
    }


# --- seed expansion --------------------------------------------------------------------------------------


def test_training_seed_steps_by_subnet_of_the_netmask() -> None:
    assert expand_device_ip_seed("10.0.0.20", "atlas-training", "255.255.0.0") == [
        "10.0.0.20",
        "10.1.0.20",
        "10.2.0.20",
        "10.3.0.20",
        "10.0.0.19",
        "10.1.0.19",
        "10.2.0.19",
        "10.3.0.19",
    ]


@pytest.mark.parametrize("product", ["atlas-a2", "atlas-a3"])
def test_a2_a3_seed_counts_up(product: str) -> None:
    assert expand_device_ip_seed("10.0.0.250", product, "255.255.255.0", count=3) == [
        "10.0.0.250",
        "10.0.0.251",
        "10.0.0.252",
    ]


def test_seed_device_count() -> None:
    data = manual_plan()
    data["servers"] = [{"host_ip": "172.16.0.1", "device_ip_seed": "192.168.100.101", "device_count": "4"}]
    assert list(plan_from_dict(data).servers[0].device_ips) == MANUAL_SERVER0[:4]


def test_seed_with_host_number_one_puts_devices_on_network_addresses() -> None:
    data = manual_plan()
    data["servers"] = [{"host": "n1", "host_ip": "172.16.0.1", "device_ip_seed": "192.168.100.1"}]
    assert found(data) == {("n1", d, "ip-host-part") for d in range(4, 8)}


# --- each rule -------------------------------------------------------------------------------------------


def test_pair_subnet() -> None:
    ips = list(MANUAL_SERVER0)
    ips[6] = "192.168.103.99"  # device 6 must share device 2's subnet 192.168.102.0/24
    # ... and now device 7 (192.168.103.100) no longer has a subnet of its own among devices 4-7.
    assert found(one_server(ips)) == {("n1", 6, "pair-subnet"), ("n1", 7, "distinct-subnets")}


def test_distinct_subnets() -> None:
    ips = list(MANUAL_SERVER0)
    ips[1], ips[5] = "192.168.100.201", "192.168.100.200"  # devices 1/5 on devices 0/4's subnet
    assert found(one_server(ips)) == {("n1", 1, "distinct-subnets"), ("n1", 5, "distinct-subnets")}


def test_position_subnet_flags_the_odd_server() -> None:
    data = manual_plan()
    data["servers"].append(
        {"host": "server2", "host_ip": "192.168.1.24", "device_ip_seed": "192.168.104.121"}
    )
    assert found(data) == {("server2", d, "position-subnet") for d in range(8)}


def test_position_subnet_on_two_servers() -> None:
    data = manual_plan()
    data["servers"][1]["device_ips"][3] = "192.168.107.111"
    data["servers"][1]["device_ips"][7] = "192.168.107.110"
    assert found(data) == {("server1", 3, "position-subnet"), ("server1", 7, "position-subnet")}


def test_position_subnet_on_two_servers_blames_the_device_that_breaks_its_own_layout() -> None:
    data = manual_plan()
    data["servers"][0]["device_ips"][5] = "192.168.104.100"  # server0's device 5 leaves device 1's subnet
    assert found(data) == {("server0", 5, "pair-subnet"), ("server0", 5, "position-subnet")}


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_training_allows_1_2_4_8_devices(count: int) -> None:
    assert found(one_server(MANUAL_SERVER0[:count])) == set()


@pytest.mark.parametrize("count", [3, 5, 6, 7])
def test_training_rejects_other_device_counts(count: int) -> None:
    assert found(one_server(MANUAL_SERVER0[:count])) == {("n1", None, "device-count")}


def test_six_devices_is_fine_on_a2_but_nine_is_not() -> None:
    assert found(one_server([f"10.0.0.{n}" for n in range(2, 8)], "atlas-a2")) == set()
    assert found(one_server([f"10.0.0.{n}" for n in range(2, 11)], "atlas-a3")) == {
        ("n1", None, "device-count")
    }


def test_no_devices() -> None:
    assert found(one_server([])) == {("n1", None, "device-count")}


def test_uneven_counts_error_on_training() -> None:
    data = manual_plan()
    data["servers"][1]["device_ips"] = MANUAL_SERVER1[:4]
    violations = check_plan(plan_from_dict(data))
    assert [(v.server, v.rule, v.severity) for v in violations] == [
        ("server1", "device-count-uniform", "error")
    ]


def test_uneven_counts_only_warn_on_a2() -> None:
    data = a2("10.0.0.2", "10.0.0.10")
    data["servers"][1]["device_count"] = 4
    violations = check_plan(plan_from_dict(data))
    assert [(v.server, v.rule, v.severity) for v in violations] == [("n1", "device-count-uniform", "warning")]
    assert ipplan.errors(violations) == []


def test_one_subnet_on_a2() -> None:
    data = a2("10.0.0.2", "10.0.1.2")
    data["servers"].append({"host": "n2", "host_ip": "172.16.0.2", "device_ip_seed": "10.0.0.20"})
    assert found(data) == {("n1", d, "one-subnet") for d in range(8)}


def test_one_subnet_with_a_wide_netmask() -> None:
    assert found(a2("10.0.0.2", "10.0.1.12", netmask="255.255.0.0")) == set()


def test_last_octet_within_one_subnet() -> None:
    # 10.0.1.2 and 10.0.2.2 share 10.0.0.0/16 and end in 2.
    assert found(a2("10.0.1.2", "10.0.2.2", netmask="255.255.0.0")) == {
        ("n1", d, "last-octet") for d in range(8)
    }


@pytest.mark.parametrize("bad", ["192.168.100.256", "192.168.100", "abc", " 192.168.100.101", "1.2.3.04"])
def test_invalid_addresses(bad: str) -> None:
    ips = list(MANUAL_SERVER0)
    ips[2] = bad
    assert found(one_server(ips)) == {("n1", 2, "ip-valid")}


def test_network_and_broadcast_addresses() -> None:
    ips = [f"10.0.0.{n}" for n in (0, 1, 2, 255)]
    assert found(one_server(ips, "atlas-a2")) == {("n1", 0, "ip-host-part"), ("n1", 3, "ip-host-part")}


def test_duplicate_address_across_servers() -> None:
    data = manual_plan()
    data["servers"][1]["device_ips"][2] = MANUAL_SERVER0[2]
    violations = check_plan(plan_from_dict(data))
    assert [(v.server, v.device, v.rule) for v in violations] == [("server1", 2, "ip-unique")]
    assert "device 2 of server0" in violations[0].message


def test_device_address_equal_to_a_host_address() -> None:
    data = manual_plan()
    data["servers"][0]["host_ip"] = MANUAL_SERVER1[0]
    assert found(data) == {("server1", 0, "ip-is-host")}


def test_host_addresses_and_names() -> None:
    data = manual_plan()
    data["servers"].append(
        {"host": "server0", "host_ip": "192.168.1.22", "device_ip_seed": "192.168.100.121"}
    )
    data["servers"].append({"host_ip": "192.168.1.300", "device_ip_seed": "192.168.100.131"})
    assert found(data) == {
        ("server0", None, "host-ip-unique"),
        ("server0", None, "host-unique"),
        ("192.168.1.300", None, "host-ip"),
    }


def test_violations_read_server_by_server() -> None:
    data = manual_plan()
    data["servers"][1]["device_ips"][0] = "bad"
    data["servers"][0]["device_ips"][7] = "bad"
    order = [(v.server, v.device) for v in check_plan(plan_from_dict(data))]
    assert order == sorted(order, key=lambda item: (item[0] != "server0", item[1]))


# --- malformed plans -------------------------------------------------------------------------------------


def without(data: dict[str, Any], *path: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    target: Any = data
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return data


def replaced(data: dict[str, Any], value: Any, *path: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    target: Any = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (["not", "a", "mapping"], "plan"),
        (without(manual_plan(), "product"), "'product'"),
        (replaced(manual_plan(), "atlas-900", "product"), "product"),
        (without(manual_plan(), "netmask"), "'netmask'"),
        (replaced(manual_plan(), "255.0.255.0", "netmask"), "netmask"),
        (replaced(manual_plan(), "/24", "netmask"), "netmask"),
        (replaced(manual_plan(), 24, "netmask"), "netmask"),
        (replaced(manual_plan(), "255.255.255.254", "netmask"), "netmask"),
        (without(manual_plan(), "servers"), "'servers'"),
        (replaced(manual_plan(), [], "servers"), "servers"),
        (without(manual_plan(), "servers", 1, "host_ip"), "servers[1]: missing key 'host_ip'"),
        (without(manual_plan(), "servers", 0, "device_ips"), "servers[0]: missing key 'device_ips'"),
        (replaced(manual_plan(), "192.168.100.101", "servers", 0, "device_ips"), "servers[0].device_ips"),
        (replaced(manual_plan(), 42, "servers", 0, "device_ips", 3), "servers[0].device_ips[3]"),
        (replaced(manual_plan(), "10.0.0.1", "servers", 0, "device_ip_seed"), "servers[0]"),
        (replaced(manual_plan(), 8, "servers", 0, "device_count"), "servers[0].device_count"),
        (replaced(manual_plan(), "x", "servers", 0, "netmask"), "'netmask'"),
        (replaced(manual_plan(), "x", "device_ip"), "'device_ip'"),
        (replaced(manual_plan(), "server-as-string", "servers", 1), "servers[1]"),
    ],
)
def test_malformed_plans_name_the_key(data: Any, named: str) -> None:
    with pytest.raises(IpPlanError) as error:
        plan_from_dict(data)
    assert named in str(error.value)


def test_seed_form_errors_name_the_server() -> None:
    data = manual_plan()
    data["servers"][1] = {"host_ip": "192.168.1.23", "device_ip_seed": "192.168.100.x"}
    with pytest.raises(IpPlanError, match=r"servers\[1\]\.device_ip_seed"):
        plan_from_dict(data)
    data["servers"][1] = {"host_ip": "192.168.1.23", "device_ip_seed": "255.255.255.250", "device_count": 8}
    data["product"] = "atlas-a2"
    with pytest.raises(IpPlanError, match="address space"):
        plan_from_dict(data)


def test_load_plan_rejects_bad_yaml(tmp_path: Path) -> None:
    path = tmp_path / "plan.yml"
    path.write_text("product: [unclosed\n")
    with pytest.raises(IpPlanError, match="not valid YAML"):
        load_plan(path)


# --- the Ansible-facing functions ------------------------------------------------------------------------


def test_check_plan_dict_gives_plain_dicts() -> None:
    data = manual_plan()
    data["servers"][0]["device_ips"][5] = "192.168.100.1000"
    assert check_plan_dict(data) == [
        {
            "server": "server0",
            "device": 5,
            "rule": "ip-valid",
            "message": "'192.168.100.1000' is not a valid IPv4 address",
            "severity": "error",
        }
    ]
    assert check_plan_dict(manual_plan()) == []


def test_check_plan_dict_reports_malformed_plans_instead_of_raising() -> None:
    [violation] = check_plan_dict(without(manual_plan(), "netmask"))
    assert violation["rule"] == "plan-format"
    assert "'netmask'" in violation["message"]


def test_normalize_plan_dict_expands_seeds() -> None:
    data = yaml.safe_load((DATA / "pytorch_manual_two_servers_seeded.yml").read_text())
    assert normalize_plan_dict(data) == manual_plan()


def test_violation_text_names_server_device_and_rule() -> None:
    text = str(Violation("server1", 5, "pair-subnet", "wrong subnet"))
    assert text == "error [pair-subnet] server server1, device 5: wrong subnet"
    assert str(Violation(None, None, "plan-format", "x")) == "error [plan-format] plan: x"


# --- command line ----------------------------------------------------------------------------------------


def test_cli_check_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert ipplan.main(["check", str(DATA / "pytorch_manual_two_servers.yml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK ") and out.count("\n") == 1
    assert "atlas-training, 2 server(s) x 8 device(s)" in out


def test_cli_check_prints_every_violation(capsys: pytest.CaptureFixture[str]) -> None:
    assert ipplan.main(["check", str(DATA / "pytorch_manual_broken.yml")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "error [pair-subnet] server server1, device 5: " in lines[1]
    assert "error [device-count] server server2: 6 devices" in lines[3]
    assert lines[-1].endswith("5 error(s), 0 warning(s)")
    assert len(lines) == 6


def test_cli_check_warnings_only_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = a2("10.0.0.2", "10.0.0.10")
    data["servers"][1]["device_count"] = 2
    path = tmp_path / "plan.yml"
    path.write_text(yaml.safe_dump(data))
    assert ipplan.main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "warning [device-count-uniform] server n1" in out
    assert "OK " in out and "1 warning(s)" in out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("product: [unclosed\n", "not valid YAML"),
        ("product: atlas-training\nservers: []\n", "missing key 'netmask'"),
        ("- just\n- a list\n", "expected a mapping"),
    ],
)
def test_cli_check_bad_input_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "plan.yml"
    path.write_text(text)
    assert ipplan.main(["check", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_cli_missing_file_and_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ipplan.main(["check", str(tmp_path / "absent.yml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert ipplan.main([]) == 2
    assert ipplan.main(["frobnicate", "x.yml"]) == 2


def test_cli_expand(capsys: pytest.CaptureFixture[str]) -> None:
    assert ipplan.main(["expand", str(DATA / "pytorch_manual_two_servers_seeded.yml")]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == manual_plan()


def test_cli_expand_of_a_plan_that_breaks_a_rule_prints_it_and_fails(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert ipplan.main(["expand", str(DATA / "pytorch_manual_broken.yml")]) == 1
    said = capsys.readouterr()
    assert yaml.safe_load(said.out)["servers"] and "[position-subnet]" in said.err
    assert "error(s): ddp-cluster ip-plan check says each" in said.err


def test_an_inventory_given_as_a_plan_is_named_with_the_check_it_wants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  children:\n    nodes:\n      hosts:\n        node0: {}\n")
    assert ipplan.main(["check", str(inventory)]) == 2
    said = capsys.readouterr().err
    assert (
        "this is an Ansible inventory, not a device-IP plan" in said and "site.yml --tags preflight" in said
    )


def test_ddp_cluster_dispatches_ip_plan(capsys: pytest.CaptureFixture[str]) -> None:
    from ddp_cluster.cli import main

    assert main(["ip-plan", "check", str(DATA / "pytorch_manual_broken.yml")]) == 1
    assert "[position-subnet]" in capsys.readouterr().out
