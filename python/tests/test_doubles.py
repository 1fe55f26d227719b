"""The hccn_tool and npu-smi test doubles: documented outputs, state kept in files, injected failures."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

DOUBLES = Path(__file__).resolve().parents[2] / "tests" / "doubles"


class Machine:
    """One simulated host: a state directory and the two tools run against it."""

    def __init__(self, state: Path, config: dict[str, Any] | None = None) -> None:
        self.state = state
        if config is not None:
            (state / "config.json").write_text(json.dumps(config))

    def run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DDP_DOUBLES_STATE": str(self.state)}
        return subprocess.run(
            [sys.executable, str(DOUBLES / tool), *args], env=env, capture_output=True, text=True, timeout=30
        )

    def hccn(self, device: int, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run("hccn_tool", "-i", str(device), *args)

    def ok(self, device: int, *args: str) -> str:
        result = self.hccn(device, *args)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def calls(self) -> list[str]:
        return (self.state / "calls.log").read_text().splitlines()


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def test_doubles_are_executable_scripts_for_old_pythons() -> None:
    for name in ("hccn_tool", "npu-smi"):
        path = DOUBLES / name
        assert os.access(path, os.X_OK), f"{path} is not executable"
        source = path.read_text()
        assert source.startswith("#!/usr/bin/env python3\n")
        ast.parse(source, feature_version=(3, 8))  # Debian containers may carry an older Python


def test_runs_directly_with_default_config(tmp_path: Path) -> None:
    env = {**os.environ, "DDP_DOUBLES_STATE": str(tmp_path / "fresh")}
    result = subprocess.run(
        [str(DOUBLES / "npu-smi"), "info", "-l"], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    assert result.stdout.startswith("\tTotal Count                    : 8\n")
    assert result.stdout.count("NPU ID") == 8


def test_ip_set_then_get_persists(machine: Machine) -> None:
    assert machine.ok(0, "-ip", "-g") == ""
    assert machine.ok(0, "-ip", "-s", "address", "192.168.100.101", "netmask", "255.255.255.0") == ""
    # Seed 000: "ipaddr:192.168.100.101" / "netmask:255.255.255.0"
    assert machine.ok(0, "-ip", "-g") == "ipaddr:192.168.100.101\nnetmask:255.255.255.0\n"
    assert machine.ok(1, "-ip", "-g") == ""
    state = json.loads((machine.state / "state.json").read_text())
    assert state == {"0": {"ipaddr": "192.168.100.101", "netmask": "255.255.255.0"}}
    assert machine.calls()[1] == "hccn_tool -i 0 -ip -s address 192.168.100.101 netmask 255.255.255.0"


def test_initial_addresses_come_from_config(tmp_path: Path) -> None:
    m = Machine(tmp_path, {"devices": {"3": {"ipaddr": "10.0.0.5", "netmask": "255.255.0.0"}}})
    assert m.ok(3, "-ip", "-g") == "ipaddr:10.0.0.5\nnetmask:255.255.0.0\n"
    m.ok(3, "-ip", "-s", "address", "10.0.0.6", "netmask", "255.255.0.0")
    assert m.ok(3, "-ip", "-g") == "ipaddr:10.0.0.6\nnetmask:255.255.0.0\n"


@pytest.mark.parametrize(
    "args",
    [
        ("-ip", "-s", "address", "192.168.100.300", "netmask", "255.255.255.0"),
        ("-ip", "-s", "address", "192.168.100.1", "netmask", "255.0.255.0"),
        ("-netdetect", "-s", "address", "nowhere"),
        ("-gateway", "-s", "gateway", "1.2.3"),
    ],
)
def test_invalid_values_are_refused_and_not_stored(machine: Machine, args: tuple[str, ...]) -> None:
    result = machine.hccn(0, *args)
    assert result.returncode == 1
    assert "Invalid" in result.stderr
    assert not (machine.state / "state.json").exists()


def test_netdetect_and_gateway(machine: Machine) -> None:
    assert machine.ok(2, "-netdetect", "-g") == ""
    machine.ok(2, "-netdetect", "-s", "address", "192.168.102.111")
    assert machine.ok(2, "-netdetect", "-g") == "netdetect address: 192.168.102.111\n"
    machine.ok(2, "-gateway", "-s", "gateway", "192.168.102.1")
    assert machine.ok(2, "-gateway", "-g") == "default gateway:192.168.102.1, Iface:eth2\n"


def test_net_health_follows_the_settings(machine: Machine) -> None:
    health = "-net_health", "-g"
    assert machine.ok(0, *health) == "net health status: Init\n"
    machine.ok(0, "-ip", "-s", "address", "192.168.100.101", "netmask", "255.255.255.0")
    assert machine.ok(0, *health) == "net health status: Init\n"
    machine.ok(0, "-netdetect", "-s", "address", "0.0.0.0")
    assert machine.ok(0, *health) == "net health status: Init\n"
    machine.ok(0, "-netdetect", "-s", "address", "10.9.9.9")
    assert machine.ok(0, *health) == "net health status: Unreachable\n"
    machine.ok(0, "-netdetect", "-s", "address", "192.168.100.111")
    assert machine.ok(0, *health) == "net health status: Success\n"
    machine.ok(0, "-link", "-s", "down")
    assert machine.ok(0, "-link", "-g") == "link status: DOWN\n"
    assert machine.ok(0, *health) == "net health status: Fault\n"


def test_gateway_makes_a_remote_detect_address_reachable(machine: Machine) -> None:
    machine.ok(0, "-ip", "-s", "address", "10.0.1.5", "netmask", "255.255.255.0")
    machine.ok(0, "-netdetect", "-s", "address", "10.0.9.1")
    machine.ok(0, "-gateway", "-s", "gateway", "10.0.1.1")
    assert machine.ok(0, "-net_health", "-g") == "net health status: Success\n"


@pytest.mark.parametrize(
    ("injected", "name"),
    [
        (0, "Success"),
        (1, "Socket fail"),
        (2, "Receive timeout"),
        (3, "Unreachable"),
        (4, "Time exceeded"),
        (5, "Fault"),
        (6, "Init"),
        (7, "Thread error"),
        (8, "Detect ip set"),
        (9, "Unknown"),
        ("2", "Receive timeout"),
        ("Socket fail", "Socket fail"),
    ],
)
def test_injected_net_health_uses_seed002_names(tmp_path: Path, injected: Any, name: str) -> None:
    m = Machine(tmp_path, {"devices": {"4": {"net_health": injected}}})
    assert m.ok(4, "-net_health", "-g") == f"net health status: {name}\n"
    assert m.ok(5, "-net_health", "-g") == "net health status: Init\n"


def test_lldp_reports_a_neighbour_unless_the_link_is_down(tmp_path: Path) -> None:
    m = Machine(
        tmp_path, {"devices": {"1": {"link": "DOWN"}, "2": {"lldp": False}, "3": {"lldp_port": "X1"}}}
    )
    report = m.ok(0, "-lldp", "-g")
    assert "Chassis ID TLV" in report and "\tIfname: 400GE1/0/1\n" in report
    assert "\tIfname: X1\n" in m.ok(3, "-lldp", "-g")
    assert m.ok(1, "-lldp", "-g") == ""
    assert m.ok(1, "-link", "-g") == "link status: DOWN\n"
    assert m.ok(2, "-lldp", "-g") == ""
    m.ok(1, "-link", "-s", "up")
    assert m.ok(1, "-lldp", "-g") != ""


def test_missing_device(tmp_path: Path) -> None:
    m = Machine(tmp_path, {"chip_count": 8, "missing": [3]})
    result = m.hccn(3, "-ip", "-g")
    assert result.returncode == 1 and "device 3 does not exist" in result.stderr
    listing = m.run("npu-smi", "info", "-l").stdout
    assert "Total Count                    : 7" in listing
    assert "NPU ID                         : 3\n" not in listing
    table = m.run("npu-smi", "info").stdout
    assert "| 2     910B" in table and "| 3     910B" not in table and "| 4     910B" in table


def test_set_error_is_injected_and_nothing_stored(tmp_path: Path) -> None:
    m = Machine(tmp_path, {"devices": {"7": {"set_error": "Cmd execute failed"}}})
    result = m.hccn(7, "-ip", "-s", "address", "192.168.103.100", "netmask", "255.255.255.0")
    assert (result.returncode, result.stderr) == (1, "Cmd execute failed\n")
    assert m.ok(7, "-ip", "-g") == ""


def test_missing_driver(tmp_path: Path) -> None:
    m = Machine(tmp_path, {"driver": False})
    for result in (m.hccn(0, "-ip", "-g"), m.run("npu-smi", "info"), m.run("npu-smi", "info", "-l")):
        assert result.returncode == 1
        assert "driver is not loaded" in result.stderr
        assert result.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("-i", "0"),
        ("-i", "x", "-ip", "-g"),
        ("-i", "8", "-ip", "-g"),
        ("-i", "0", "-ip", "\u2013g"),  # seed 000 writes "-ip \u2013g" (an en dash)
        ("-i", "0", "-ip", "-s", "address", "10.0.0.1"),
        ("-i", "0", "-net_health", "-s", "address", "10.0.0.1"),
        ("-i", "0", "-optical", "-g"),
        ("-ip", "-g", "-i", "0"),
    ],
)
def test_hccn_tool_unknown_arguments(machine: Machine, args: tuple[str, ...]) -> None:
    result = machine.run("hccn_tool", *args)
    assert result.returncode == 2
    assert "usage: hccn_tool" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("args", [(), ("info", "-t", "board"), ("-l",), ("info", "-l", "-i", "0")])
def test_npu_smi_unknown_arguments(machine: Machine, args: tuple[str, ...]) -> None:
    result = machine.run("npu-smi", *args)
    assert result.returncode == 2
    assert "unsupported arguments" in result.stderr


def test_npu_smi_info_table(tmp_path: Path) -> None:
    config = {
        "chip_count": 2,
        "npu_name": "910B4",
        "version": "24.1.rc2",
        "devices": {"1": {"health": "Warning"}},
    }
    m = Machine(tmp_path, config)
    lines = m.run("npu-smi", "info").stdout.splitlines()
    assert {len(line) for line in lines} == {98}
    assert lines[1].startswith("| npu-smi 24.1.rc2") and "Version: 24.1.rc2" in lines[1]
    header = (
        "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|"
    )
    assert lines[3] == header
    rows = [line for line in lines if line.startswith(("| 0     910B4 ", "| 1     910B4 "))]
    assert [row.split("|")[2].strip() for row in rows] == ["OK", "Warning"]
    assert sum("No running processes found in NPU" in line for line in lines) == 2


def test_calls_are_logged_including_failures(machine: Machine) -> None:
    machine.run("npu-smi", "info", "-l")
    machine.run("hccn_tool", "-i", "0", "-ip", "-g")
    machine.run("hccn_tool", "-i", "9", "-ip", "-g")
    assert machine.calls() == ["npu-smi info -l", "hccn_tool -i 0 -ip -g", "hccn_tool -i 9 -ip -g"]
