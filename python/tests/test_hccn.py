"""ddp_cluster.ascend.hccn: device settings from a plan, hccn_tool outputs, read-compare-set and health
verdicts; and
``ddp-cluster hccn`` against the stateful hccn_tool double (tests/doubles/hccn_tool)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_cluster.ascend import cli as ddp_cli
from ddp_cluster.ascend import hccn
from ddp_cluster.ascend.cli import main as cli

REPO = Path(__file__).resolve().parents[2]
DOUBLE = REPO / "tests" / "doubles" / "hccn_tool"
DATA = Path(__file__).parent / "data"


def plan() -> dict[str, Any]:
    return {
        "product": "atlas-training",
        "netmask": "255.255.255.0",
        "servers": [
            {
                "host": "s0",
                "host_ip": "10.0.0.10",
                "device_ips": [f"192.168.{100 + d % 4}.{101 - d // 4}" for d in range(8)],
            },
            {
                "host": "s1",
                "host_ip": "10.0.0.11",
                "device_ips": [f"192.168.{100 + d % 4}.{111 - d // 4}" for d in range(8)],
            },
        ],
    }


def readings(**per_device: dict[str, str]) -> dict[str, dict[str, dict[str, str]]]:
    return {
        device: {query: {"stdout": out} for query, out in queries.items()}
        for device, queries in per_device.items()
    }


def test_fields_and_net_health_as_the_manuals_print_them() -> None:
    assert hccn.fields("ipaddr:192.168.100.101\nnetmask:255.255.255.0\n") == {
        "ipaddr": "192.168.100.101",
        "netmask": "255.255.255.0",
    }
    assert hccn.net_health_name("net health status: Success") == "Success"
    assert hccn.net_health_name("net health status: 3") == "Unreachable"
    assert hccn.net_health_name("42") == "Unknown"
    assert hccn.net_health_name("") == "no answer"
    assert hccn.healthy("net health status: 0") and not hccn.healthy("net health status: Init")


def test_settings_detect_the_same_device_of_the_next_server() -> None:
    settings = hccn.device_settings(plan(), "s1")
    assert [s["detect"] for s in settings] == plan()["servers"][0]["device_ips"]
    with pytest.raises(hccn.HccnError, match="s9 is not a server of the NPU device-IP plan"):
        hccn.device_settings(plan(), "s9")
    with pytest.raises(hccn.HccnError, match="list of 8"):
        hccn.device_settings(plan(), "s0", ["192.168.100.1"])


def test_changes_only_what_differs_addresses_first_and_problems_per_device() -> None:
    settings = hccn.device_settings(plan(), "s0")[:2]
    first, second = (s["address"] for s in settings)
    found = readings(
        **{
            "0": {
                "-ip": f"ipaddr:{first}\nnetmask:255.255.255.0",
                "-netdetect": f"netdetect address: {settings[0]['detect']}",
            },
            "1": {"-ip": "ipaddr:192.168.1.50\nnetmask:255.255.0.0", "-netdetect": ""},
        }
    )
    changes = hccn.changes(settings, found)
    assert [(c["device"], c["setting"]) for c in changes] == [(1, "ip"), (1, "netdetect")]
    assert hccn.change_line(changes[0]) == f"device 1 ip: 192.168.1.50 255.255.0.0 -> {second} 255.255.255.0"
    problems = hccn.problems(settings, found)
    assert problems[0].startswith("device 0: net health no answer") and problems[1].startswith(
        "device 1: address is"
    )


def test_changes_name_the_calls_and_the_current_values() -> None:
    settings = hccn.device_settings(plan(), "s0")[:2]
    ips0, ips1 = (server["device_ips"] for server in plan()["servers"])
    found = readings(
        **{
            "0": {
                "-ip": f"ipaddr:{ips0[0]}\nnetmask:255.255.255.0\n",
                "-netdetect": f"netdetect address: {ips1[0]}\n",
            },
            "1": {"-ip": "ipaddr:192.168.1.50\nnetmask:255.255.0.0\n", "-netdetect": ""},
        }
    )
    changes = hccn.changes(settings, found)
    assert changes[0]["args"] == ["-ip", "-s", "address", ips0[1], "netmask", "255.255.255.0"]
    assert changes[0]["current"] == "192.168.1.50 255.255.0.0"
    assert hccn.change_line(changes[1]) == f"device 1 netdetect: unset -> {ips1[1]}"


def test_problems_name_each_device_and_status() -> None:
    settings = hccn.device_settings(plan(), "s0")[:3]
    ips0, ips1 = (server["device_ips"] for server in plan()["servers"])
    healthy = {"-link": "link status: UP\n", "-lldp": "Chassis ID TLV\n"}
    found = readings(
        **{
            "0": {
                "-ip": f"ipaddr:{ips0[0]}\nnetmask:255.255.255.0",
                "-net_health": "net health status: Success",
                **healthy,
            },
            "1": {
                "-ip": f"ipaddr:{ips0[1]}\nnetmask:255.255.255.0",
                "-net_health": "net health status: 2",
                **healthy,
            },
            "2": {
                "-ip": "",
                "-net_health": "net health status: Fault",
                "-link": "link status: DOWN",
                "-lldp": "",
            },
        }
    )
    assert hccn.problems(settings, found) == [
        f"device 1: net health Receive timeout (netdetect address {ips1[1]})",
        f"device 2: address is none, planned {ips0[2]} 255.255.255.0; net health Fault (netdetect address "
        f"{ips1[2]}); link DOWN; no LLDP neighbour (-lldp -g is empty: check the switch port)",
    ]
    assert hccn.problems(settings[2:], found, check_lldp=False)[0].endswith("link DOWN")


@pytest.fixture
def double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "doubles"
    state.mkdir()
    (state / "config.json").write_text('{"chip_count": 8}')
    monkeypatch.setenv("DDP_DOUBLES_STATE", str(state))
    tool = tmp_path / "hccn_tool"
    shutil.copy(DOUBLE, tool)
    tool.write_text(tool.read_text().replace("#!/usr/bin/env python3", f"#!{sys.executable}", 1))
    os.chmod(tool, 0o755)
    plan_file = tmp_path / "plan.yml"
    plan_file.write_text(yaml.safe_dump(plan()))
    return tool


def test_cli_diff_lists_the_calls_then_nothing_once_set(
    double: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_file = str(double.parent / "plan.yml")
    assert cli(["diff", plan_file, "--host", "s0", "--tool", str(double)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 16 and lines[0] == "device 0 ip: unset -> 192.168.100.101 255.255.255.0"
    for change in hccn.changes(hccn.device_settings(plan(), "s0"), {}):  # set them as the role would
        os.system(f"{double} -i {change['device']} {' '.join(change['args'])}")
    assert cli(["diff", plan_file, "--host", "s0", "--tool", str(double)]) == 0
    assert capsys.readouterr().out.strip() == "s0: nothing to set"
    assert cli(["check", plan_file, "--host", "s0", "--tool", str(double)]) == 0


def test_cli_names_a_host_outside_the_plan(double: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["diff", str(double.parent / "plan.yml"), "--host", "s7", "--tool", str(double)]) == 2
    assert "s7 is not a server of the NPU device-IP plan" in capsys.readouterr().err


def test_cli_without_hccn_tool_says_so_once(double: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = str(double.parent / "plan.yml")
    assert cli(["check", plan_file, "--host", "s0", "--tool", str(double.parent / "absent")]) == 2
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and "absent is not found on this machine" in said[0] and "--tool PATH" in said[0]


def test_cli_says_reads_that_failed_alike_once(
    double: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ddp_cli, "run", lambda argv: (1, "", "dsmi_get_device_info failed"))
    assert cli(["check", str(double.parent / "plan.yml"), "--host", "s0", "--tool", str(double)]) == 2
    said = capsys.readouterr().err.splitlines()
    assert (
        len(said) == 1 and "32 calls (-i 0 -ip, ...)" in said[0] and "dsmi_get_device_info failed" in said[0]
    )


def test_configure_reads_every_device_first_then_sets_only_what_differs(double: Path) -> None:
    settings = hccn.device_settings(plan(), "s0")[:2]
    calls: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        calls.append(argv)
        return ddp_cli.run([str(double), *argv[1:]])

    checked, failure = hccn.configure("hccn_tool", settings, run, check=True)
    assert failure == "" and checked["changed"] and checked["applied"] == []
    assert [change["line"] for change in checked["changes"]][:2] == [
        "device 0 ip: unset -> 192.168.100.101 255.255.255.0",
        "device 1 ip: unset -> 192.168.101.101 255.255.255.0",
    ]
    assert "device 0 ip: unset\n" in checked["diff"]["before"]
    assert all(argv[-1] == "-g" for argv in calls)  # check mode sets nothing
    assert [argv[2:4] for argv in calls] == [
        ["0", "-ip"],
        ["1", "-ip"],
        ["0", "-netdetect"],
        ["1", "-netdetect"],
    ]
    done, failure = hccn.configure("hccn_tool", settings, run, check=False)
    assert failure == "" and done["changed"] and len(done["applied"]) == 4
    assert (
        " ".join(done["applied"][0]) == "hccn_tool -i 0 -ip -s address 192.168.100.101 netmask 255.255.255.0"
    )
    again, _ = hccn.configure("hccn_tool", settings, run, check=False)
    assert not again["changed"] and again["changes"] == [] and again["applied"] == []


def test_configure_sets_nothing_when_a_read_fails_and_stops_at_a_refused_set() -> None:
    settings = hccn.device_settings(plan(), "s0")[:2]
    unreadable, failure = hccn.configure(
        "hccn_tool", settings, lambda argv: (127, "", "not found"), check=False
    )
    assert failure == "" and not unreadable["changed"] and unreadable["changes"] == []
    assert [(read["device"], read["query"], read["rc"]) for read in unreadable["failed_reads"]] == [
        (0, "-ip", 127),
        (0, "-netdetect", 127),
        (1, "-ip", 127),
        (1, "-netdetect", 127),
    ]

    def refuse(argv: list[str]) -> tuple[int, str, str]:
        return (1, "", "device busy") if "-s" in argv else (0, "", "")

    refused, failure = hccn.configure("hccn_tool", settings, refuse, check=False)
    assert failure == (
        "device 0: `hccn_tool -i 0 -ip -s address 192.168.100.101 netmask 255.255.255.0` failed (rc 1): "
        "device busy"
    )
    assert not refused["changed"] and refused["applied"] == []


def test_verify_polls_net_health_within_one_deadline_then_names_each_device() -> None:
    settings = hccn.device_settings(plan(), "s0")[:2]
    ips0 = plan()["servers"][0]["device_ips"]
    polls = {0: 0, 1: 0}
    now = [0.0]

    def run(argv: list[str]) -> tuple[int, str, str]:
        device, query = int(argv[2]), argv[3]
        if query == "-ip":
            return 0, f"ipaddr:{ips0[device]}\nnetmask:255.255.255.0\n", ""
        if query == "-net_health":
            polls[device] += 1
            ready = device == 0 and polls[device] >= 2  # device 0 after one wait; device 1 never
            return 0, f"net health status: {'Success' if ready else 'Init'}\n", ""
        return 0, {"-link": "link status: UP\n", "-lldp": "Chassis ID TLV\n"}[query], ""

    def sleep(seconds: float) -> None:
        now[0] += seconds

    checked = hccn.verify("hccn_tool", settings, run, True, 10, 3, clock=lambda: now[0], sleep=sleep)
    assert checked["problems"] == [f"device 1: net health Init (netdetect address {settings[1]['detect']})"]
    assert polls == {0: 2, 1: 4} and checked["health_seconds"] == 9.0
    assert checked["failed_reads"] == [] and checked["devices"]["0"]["-net_health"]["cmd"][-2:] == [
        "-net_health",
        "-g",
    ]
    once = hccn.verify("hccn_tool", settings[:1], run, True, 0, 3, clock=lambda: now[0], sleep=sleep)
    assert once["problems"] == [] and once["health_seconds"] == 0.0
