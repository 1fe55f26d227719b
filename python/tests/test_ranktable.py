"""HCCL rank tables: the vendor manuals' own tables reproduced, master ordering, refusal of invalid plans."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_cluster.ascend import ranktable
from ddp_cluster.ascend.ipplan import load_plan, plan_from_dict
from ddp_cluster.ascend.ranktable import RankTableError, dumps, rank_table

DATA = Path(__file__).parent / "data"


def manual_plan() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DATA / "pytorch_manual_two_servers.yml").read_text())
    return data


def three_servers() -> dict[str, Any]:
    data = manual_plan()
    data["servers"].append(
        {"host": "server2", "host_ip": "192.168.1.24", "device_ip_seed": "192.168.100.121"}
    )
    return data


def test_mindocr_manual_table_reproduced_byte_for_byte() -> None:
    # hccl_tools.py --device_num "[0,8)" -> hccl_8p_10234567_127.0.0.1.json, as printed in the MindOCR
    # distributed training manual.
    table = rank_table(load_plan(DATA / "mindocr_manual_one_server.yml"))
    assert dumps(table) == (DATA / "mindocr_manual_hccl_8p_10234567_127.0.0.1.json").read_text()


def test_container_manual_two_host_table_matches_its_template() -> None:
    # The container training manual's hccl_json_16p_2_host.json: placeholders {device_N_ip} in rank order,
    # {host_K_ip} per server, and no host_nic_ip key.
    plan = load_plan(DATA / "pytorch_manual_two_servers.yml")
    template = (DATA / "container_manual_hccl_json_16p_2_host.json").read_text()
    device_ips = [ip for server in plan.servers for ip in server.device_ips]
    values = {f"device_{n}_ip": ip for n, ip in enumerate(device_ips)}
    values.update({f"host_{k + 1}_ip": server.host_ip for k, server in enumerate(plan.servers)})
    expected = json.loads(re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], template))
    assert rank_table(plan, host_nic_ip=None) == expected


def test_every_value_is_a_string() -> None:
    def leaves(node: Any) -> list[Any]:
        if isinstance(node, dict):
            return [leaf for value in node.values() for leaf in leaves(value)]
        if isinstance(node, list):
            return [leaf for value in node for leaf in leaves(value)]
        return [node]

    table = rank_table(plan_from_dict(three_servers()))
    assert all(isinstance(leaf, str) for leaf in leaves(table))
    assert table["server_count"] == "3"
    assert table["version"] == "1.0" and table["status"] == "completed"


def ranks_by_server(table: dict[str, Any]) -> list[tuple[str, list[str]]]:
    return [(s["server_id"], [d["rank_id"] for d in s["device"]]) for s in table["server_list"]]


@pytest.mark.parametrize("master", ["server1", "192.168.1.23"])
def test_master_first_then_plan_order(master: str) -> None:
    table = rank_table(plan_from_dict(three_servers()), master=master)
    assert ranks_by_server(table) == [
        ("192.168.1.23", [str(r) for r in range(0, 8)]),
        ("192.168.1.22", [str(r) for r in range(8, 16)]),
        ("192.168.1.24", [str(r) for r in range(16, 24)]),
    ]
    first = table["server_list"][0]["device"]
    assert [d["device_id"] for d in first] == [str(d) for d in range(8)]
    assert first[4]["device_ip"] == "192.168.100.110"


def test_default_master_is_the_first_server() -> None:
    table = rank_table(plan_from_dict(three_servers()))
    assert [server for server, _ in ranks_by_server(table)] == [
        "192.168.1.22",
        "192.168.1.23",
        "192.168.1.24",
    ]


def test_unknown_master() -> None:
    with pytest.raises(RankTableError, match=r"'10\.9\.9\.9' is not a server") as error:
        rank_table(plan_from_dict(manual_plan()), master="10.9.9.9")
    assert error.value.violations == []


def test_invalid_plan_is_refused_with_its_violations() -> None:
    data = manual_plan()
    data["servers"][1]["device_ips"] = data["servers"][1]["device_ips"][:6]
    with pytest.raises(RankTableError, match="device-count") as error:
        rank_table(plan_from_dict(data))
    assert {v.rule for v in error.value.violations} == {"device-count", "device-count-uniform"}


def test_warnings_do_not_block() -> None:
    data = {
        "product": "atlas-a3",
        "netmask": "255.255.255.0",
        "servers": [
            {"host_ip": "172.16.0.1", "device_ip_seed": "10.0.0.2", "device_count": 8},
            {"host_ip": "172.16.0.2", "device_ip_seed": "10.0.0.20", "device_count": 2},
        ],
    }
    table = rank_table(plan_from_dict(data))
    assert ranks_by_server(table) == [
        ("172.16.0.1", [str(r) for r in range(8)]),
        ("172.16.0.2", ["8", "9"]),
    ]


def test_cli_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert ranktable.main([str(DATA / "mindocr_manual_one_server.yml")]) == 0
    assert capsys.readouterr().out == (DATA / "mindocr_manual_hccl_8p_10234567_127.0.0.1.json").read_text()


def test_cli_writes_a_file_with_master(tmp_path: Path) -> None:
    out = tmp_path / "rank_table.json"
    assert (
        ranktable.main([str(DATA / "pytorch_manual_two_servers.yml"), "--master", "server1", "-o", str(out)])
        == 0
    )
    table = json.loads(out.read_text())
    assert table["server_list"][0]["server_id"] == "192.168.1.23"
    assert [p.name for p in tmp_path.iterdir()] == ["rank_table.json"]


def test_cli_invalid_plan_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert ranktable.main([str(DATA / "pytorch_manual_broken.yml")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "error [pair-subnet] server server1, device 5" in captured.err


def test_cli_bad_input_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ranktable.main([str(DATA / "pytorch_manual_two_servers.yml"), "--master", "nobody"]) == 2
    assert "'nobody' is not a server" in capsys.readouterr().err
    plan = tmp_path / "plan.yml"
    plan.write_text("product: atlas-training\nnetmask: 255.255.255.0\n")
    assert ranktable.main([str(plan)]) == 2
    assert "missing key 'servers'" in capsys.readouterr().err
    assert (
        ranktable.main(
            [str(DATA / "pytorch_manual_two_servers.yml"), "-o", str(tmp_path / "no" / "dir.json")]
        )
        == 2
    )
    assert ranktable.main([]) == 2


def test_ddp_cluster_dispatches_rank_table(capsys: pytest.CaptureFixture[str]) -> None:
    from ddp_cluster.cli import main

    assert main(["rank-table", str(DATA / "pytorch_manual_two_servers.yml")]) == 0
    assert json.loads(capsys.readouterr().out)["server_count"] == "2"


# --- one job's table: its own nodes, devices and master ---------------------------------------------


def test_job_on_one_of_two_nodes_lists_only_that_node_as_master() -> None:
    plan = plan_from_dict(manual_plan())
    second = plan.servers[1]
    table = ranktable.job_rank_table(plan, [second.host or second.host_ip], 8)
    assert table["server_count"] == "1"
    [server] = table["server_list"]
    assert server["server_id"] == second.host_ip
    assert [d["rank_id"] for d in server["device"]] == [str(rank) for rank in range(8)]
    assert [d["device_ip"] for d in server["device"]] == list(second.device_ips)


def test_job_of_4_of_8_devices_per_node_uses_the_visible_ones_with_ranks_ascending_across_nodes() -> None:
    plan = plan_from_dict(manual_plan())
    names = [server.host or server.host_ip for server in plan.servers]
    table = ranktable.job_rank_table(plan, names, 4, visible={names[1]: "4,5,6,7"})
    first, second = table["server_list"]
    assert [d["device_id"] for d in first["device"]] == ["0", "1", "2", "3"]
    assert [d["device_id"] for d in second["device"]] == ["4", "5", "6", "7"]
    assert [d["device_ip"] for d in second["device"]] == list(plan.servers[1].device_ips[4:8])
    assert [d["rank_id"] for d in first["device"] + second["device"]] == [str(rank) for rank in range(8)]


def test_job_started_from_another_node_makes_it_the_master() -> None:
    plan = plan_from_dict(manual_plan())
    names = [server.host or server.host_ip for server in plan.servers]
    table = ranktable.job_rank_table(plan, list(reversed(names)), 1)
    assert [server["server_id"] for server in table["server_list"]] == [
        plan.servers[1].host_ip,
        plan.servers[0].host_ip,
    ]
    assert [server["device"][0]["rank_id"] for server in table["server_list"]] == ["0", "1"]


@pytest.mark.parametrize(
    ("nproc", "visible", "message"),
    [
        (4, "2,3,4,5", r"span both groups of four \(0-3 and 4-7\)"),
        (4, "0,1", r"4 process\(es\) per node but 2 visible device\(s\)"),
        (1, "0,0", "name a device twice"),
        (1, "9", r"not among the 8 planned device\(s\) 0-7"),
        (1, "a,b", "not a comma-separated list"),
    ],
)
def test_job_devices_that_do_not_fit_are_refused_naming_the_node(
    nproc: int, visible: str, message: str
) -> None:
    plan = plan_from_dict(manual_plan())
    name = plan.servers[0].host or plan.servers[0].host_ip
    with pytest.raises(RankTableError, match=f"node {name}: .*{message}"):
        ranktable.job_rank_table(plan, [name], nproc, visible={name: visible})


def test_job_node_outside_the_plan_is_refused() -> None:
    with pytest.raises(RankTableError, match="node 'server9' of the job is not a server of the plan"):
        ranktable.job_rank_table(plan_from_dict(manual_plan()), ["server9"], 1)
