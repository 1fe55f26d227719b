"""The hccn_tool, npu-smi and nvidia-smi test doubles: documented outputs, state kept in files, injected
failures."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

DOUBLES = Path(__file__).resolve().parents[2] / "tests" / "doubles"


class Machine:
    """One simulated host: a state directory and the tools run against it."""

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
    for name in ("hccn_tool", "npu-smi", "nvidia-smi"):
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
    # The Ascend PyTorch DDP manual: "ipaddr:192.168.100.101" / "netmask:255.255.255.0"
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
def test_injected_net_health_uses_the_checklist_names(tmp_path: Path, injected: Any, name: str) -> None:
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
        ("-i", "0", "-ip", "\u2013g"),  # the Ascend PyTorch DDP manual writes "-ip \u2013g" (an en dash)
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


# npu-smi info -t topo on an Atlas 800T A2 (8x 910B), as the vendor prints it.
ATLAS_A2_TOPO = (Path(__file__).parent / "data" / "topology" / "npu-smi-topo-atlas-a2.txt").read_text()


def test_npu_smi_topo_prints_the_atlas_a2_sample(machine: Machine) -> None:
    result = machine.run("npu-smi", "info", "-t", "topo")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == ATLAS_A2_TOPO
    assert machine.calls() == ["npu-smi info -t topo"]


def test_npu_smi_topo_follows_the_config(tmp_path: Path) -> None:
    config = {
        "chip_count": 4,
        "missing": [1],
        "topo_link": "PXB",
        "devices": {"2": {"cpu_affinity": "0-63,128-191"}},
    }
    lines = Machine(tmp_path, config).run("npu-smi", "info", "-t", "topo").stdout.splitlines()
    assert lines[0] == "\t   NPU0       NPU2       NPU3       CPU Affinity"
    assert lines[1] == "NPU0       X          PXB        PXB        144-167"
    assert lines[2] == "NPU2       PXB        X          PXB        0-63,128-191"
    assert lines[3] == "NPU3       PXB        PXB        X          96-119"
    assert lines[4:6] == ["", "Legend:"]


def test_npu_smi_topo_default_affinity_repeats_for_sixteen_chips(tmp_path: Path) -> None:
    m = Machine(tmp_path, {"chip_count": 16, "topo_label": "Phy-ID"})
    rows = [
        line for line in m.run("npu-smi", "info", "-t", "topo").stdout.splitlines() if line.startswith("Phy")
    ]
    pairs = ["144-167", "96-119", "0-23", "48-71"]
    assert [row.split()[-1] for row in rows] == [pairs[(chip // 2) % 4] for chip in range(16)]
    assert rows[0].split()[-1] == rows[9].split()[-1] == "144-167"
    assert rows[12].startswith("Phy-ID12   HCCS       ")


def test_npu_smi_topo_without_affinity_column_and_unsupported(tmp_path: Path) -> None:
    m = Machine(tmp_path, {"chip_count": 2, "topo_affinity": False})
    lines = m.run("npu-smi", "info", "-t", "topo").stdout.splitlines()
    assert lines[:3] == [
        "\t   NPU0       NPU1       ",
        "NPU0       X          HCCS       ",
        "NPU1       HCCS       X          ",
    ]
    m = Machine(tmp_path, {"topo": False})
    result = m.run("npu-smi", "info", "-t", "topo")
    assert (result.returncode, result.stdout) == (0, "This device does not support querying topo.\n")
    m = Machine(tmp_path, {"driver": False})
    result = m.run("npu-smi", "info", "-t", "topo")
    assert (result.returncode, result.stdout) == (1, "")


def ping(m: Machine, device: int, address: str, *more: str) -> tuple[int, str]:
    result = m.hccn(device, "-ping", "-g", "address", address, *more)
    return result.returncode, result.stdout


def test_ping_reachable_prints_the_documented_output(tmp_path: Path) -> None:
    m = Machine(tmp_path, {"devices": {"3": {"ipaddr": "29.1.137.10", "netmask": "255.255.0.0"}}})
    assert ping(m, 3, "29.1.137.205") == (
        0,
        "device 3 PING 29.1.137.205\n"
        "recv seq=0,time=1.418000ms\n"
        "recv seq=1,time=0.034000ms\n"
        "recv seq=2,time=0.040000ms\n"
        "3 packets transmitted, 3 received, 0.00% packet loss\n",
    )
    status, output = ping(m, 3, "29.1.0.1", "pkt", "5")
    assert status == 0 and output.count("recv seq=") == 5
    assert output.endswith("\n5 packets transmitted, 5 received, 0.00% packet loss\n")
    assert m.calls() == [
        "hccn_tool -i 3 -ping -g address 29.1.137.205",
        "hccn_tool -i 3 -ping -g address 29.1.0.1 pkt 5",
    ]


UNREACHABLE = (
    "device 0 PING 10.0.0.9\n"
    "recv time out seq=0\n"
    "recv time out seq=1\n"
    "recv time out seq=2\n"
    "3 packets transmitted, 0 received, 100.00% packet loss\n"
)


@pytest.mark.parametrize(
    "device_config",
    [
        {"ipaddr": "10.1.0.5", "netmask": "255.255.255.0"},  # another subnet, no gateway
        {"ipaddr": "10.0.0.5"},  # no netmask
        {},  # no address
        {"ipaddr": "10.0.0.5", "netmask": "255.255.255.0", "link": "DOWN"},
        {"ipaddr": "10.0.0.5", "netmask": "255.255.255.0", "unreachable": ["10.0.0.9"]},
        {"ipaddr": "10.0.0.5", "netmask": "255.255.255.0", "ping_loss": 3},
        {"ipaddr": "10.0.0.5", "netmask": "255.255.255.0", "ping_loss": 7},
    ],
)
def test_ping_unreachable_loses_every_packet(tmp_path: Path, device_config: dict[str, Any]) -> None:
    m = Machine(tmp_path, {"devices": {"0": device_config}})
    assert ping(m, 0, "10.0.0.9") == (1, UNREACHABLE)


def test_ping_unreachable_list_and_gateway(tmp_path: Path) -> None:
    device = {"ipaddr": "10.0.1.5", "netmask": "255.255.255.0"}
    m = Machine(tmp_path, {"unreachable": ["10.0.1.7"], "devices": {"0": device, "1": device}})
    assert ping(m, 1, "10.0.1.7")[0] == 1
    assert ping(m, 1, "10.0.1.8")[0] == 0
    assert ping(m, 0, "10.0.9.1")[0] == 1
    m.ok(0, "-gateway", "-s", "gateway", "10.0.1.1")
    assert ping(m, 0, "10.0.9.1")[0] == 0
    m.ok(0, "-link", "-s", "down")
    assert ping(m, 0, "10.0.1.6")[0] == 1


def test_ping_partial_loss_exits_non_zero(tmp_path: Path) -> None:
    m = Machine(
        tmp_path, {"devices": {"2": {"ipaddr": "10.0.0.5", "netmask": "255.255.255.0", "ping_loss": 1}}}
    )
    assert ping(m, 2, "10.0.0.6") == (
        1,
        "device 2 PING 10.0.0.6\n"
        "recv time out seq=0\n"
        "recv seq=1,time=0.034000ms\n"
        "recv seq=2,time=0.040000ms\n"
        "3 packets transmitted, 2 received, 33.33% packet loss\n",
    )
    status, output = ping(m, 2, "10.0.0.6", "pkt", "4")
    assert status == 1 and output.endswith("\n4 packets transmitted, 3 received, 25.00% packet loss\n")


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (("10.0.0.300",), 1, "Invalid ip address: 10.0.0.300"),
        (("host",), 1, "Invalid ip address: host"),
        (("10.0.0.6", "pkt", "x"), 1, "Invalid pkt: x"),
        (("10.0.0.6", "pkt", "0"), 1, "Invalid pkt: 0"),
        (("10.0.0.6", "count", "3"), 2, "usage: hccn_tool"),
    ],
)
def test_ping_invalid_arguments(machine: Machine, args: tuple[str, ...], status: int, message: str) -> None:
    result = machine.hccn(0, "-ping", "-g", "address", *args)
    assert result.returncode == status
    assert message in result.stderr
    assert result.stdout == ""


def test_ping_missing_device_and_driver(tmp_path: Path) -> None:
    m = Machine(tmp_path, {"missing": [5]})
    result = m.hccn(5, "-ping", "-g", "address", "10.0.0.1")
    assert result.returncode == 1 and "device 5 does not exist" in result.stderr
    m = Machine(tmp_path, {"driver": False})
    result = m.hccn(0, "-ping", "-g", "address", "10.0.0.1")
    assert result.returncode == 1 and "driver is not loaded" in result.stderr


# nvidia-smi topo -m on a DGX A100, the GPU rows and NIC0 as published (NIC1..NIC9 alike).
DGX_A100_GPU_ROWS = [
    "GPU0\t X \tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tPXB\tPXB" + "\tSYS" * 8 + "\t48-63,176-191\t3",
    "GPU1\tNV12\t X \tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tPXB\tPXB" + "\tSYS" * 8 + "\t48-63,176-191\t3",
    "GPU2\tNV12\tNV12\t X \tNV12\tNV12\tNV12\tNV12\tNV12\tSYS\tSYS\tPXB\tPXB"
    + "\tSYS" * 6
    + "\t16-31,144-159\t1",
    "GPU3\tNV12\tNV12\tNV12\t X \tNV12\tNV12\tNV12\tNV12\tSYS\tSYS\tPXB\tPXB"
    + "\tSYS" * 6
    + "\t16-31,144-159\t1",
    "GPU4\tNV12\tNV12\tNV12\tNV12\t X \tNV12\tNV12\tNV12"
    + "\tSYS" * 4
    + "\tPXB\tPXB"
    + "\tSYS" * 4
    + "\t112-127,240-255\t7",
    "GPU5\tNV12\tNV12\tNV12\tNV12\tNV12\t X \tNV12\tNV12"
    + "\tSYS" * 4
    + "\tPXB\tPXB"
    + "\tSYS" * 4
    + "\t112-127,240-255\t7",
    "GPU6\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\t X \tNV12"
    + "\tSYS" * 6
    + "\tPXB\tPXB\tSYS\tSYS\t80-95,208-223\t5",
    "GPU7\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\t X "
    + "\tSYS" * 6
    + "\tPXB\tPXB\tSYS\tSYS\t80-95,208-223\t5",
]
DGX_A100_HEADER = (
    "\t"
    + "\t".join([f"GPU{g}" for g in range(8)] + [f"NIC{n}" for n in range(10)])
    + "\tCPU Affinity\tNUMA Affinity"
)
DGX_A100_NIC0 = "NIC0\tPXB\tPXB" + "\tSYS" * 6 + "\t X \tPXB" + "\tSYS" * 8 + "\t\t"


def test_nvidia_smi_topo_prints_the_dgx_a100_sample(tmp_path: Path) -> None:
    m = Machine(tmp_path, {"nic_count": 10})
    result = m.run("nvidia-smi", "topo", "-m")
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert lines[0] == DGX_A100_HEADER
    assert lines[1:9] == DGX_A100_GPU_ROWS
    assert lines[9] == DGX_A100_NIC0
    assert lines[18] == "NIC9" + "\tSYS" * 16 + "\tPXB\t X \t\t"
    assert lines[19:22] == ["", "Legend:", ""]
    assert "  NV#  = Connection traversing a bonded set of # NVLinks" in lines
    assert lines[-12:] == ["NIC Legend:", ""] + [f"  NIC{n}: mlx5_{n}" for n in range(10)]


def test_nvidia_smi_topo_variants(tmp_path: Path) -> None:
    config = {
        "gpu_count": 2,
        "gpu_link": "NV18",
        "topo_ansi": True,
        "topo_gpu_numa_id": True,
        "nic_count": 1,
        "gpus": {"1": {"cpu_affinity": "0-55,112-167", "numa_affinity": "0"}},
    }
    lines = Machine(tmp_path, config).run("nvidia-smi", "topo", "-m").stdout.splitlines()
    assert lines[0] == "\x1b[4m\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    assert lines[1] == "GPU0\t X \tNV18\tPXB\t48-63,176-191\t3\t\tN/A"
    assert lines[2] == "GPU1\tNV18\t X \tPXB\t0-55,112-167\t0\t\tN/A"
    assert lines[3] == "NIC0\tPXB\tPXB\t X \t\t\t"
    assert "NIC Legend:" in lines
    plain = Machine(tmp_path, {"gpu_count": 1}).run("nvidia-smi", "topo", "-m").stdout
    assert plain.startswith("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t48-63,176-191\t3\n\nLegend:")
    assert "NIC Legend" not in plain


def test_nvidia_smi_list_and_driver_version(tmp_path: Path) -> None:
    m = Machine(
        tmp_path, {"gpu_count": 2, "gpu_name": "NVIDIA A100-SXM4-80GB", "driver_version": "535.161.08"}
    )
    listing = m.run("nvidia-smi", "-L").stdout.splitlines()
    assert len(listing) == 2
    assert re.fullmatch(
        r"GPU 1: NVIDIA A100-SXM4-80GB \(UUID: GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\)", listing[1]
    )
    assert listing == m.run("nvidia-smi", "-L").stdout.splitlines()  # the same UUIDs every time
    query = m.run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
    assert (query.returncode, query.stdout) == (0, "535.161.08\n535.161.08\n")
    assert m.run("nvidia-smi", "--format=csv", "--query-gpu=driver_version").stdout == (
        "driver_version\n535.161.08\n535.161.08\n"
    )
    default = Machine(tmp_path, {})
    assert default.run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").stdout == (
        "550.54.15\n" * 8
    )
    assert default.run("nvidia-smi", "-L").stdout.startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    assert m.calls()[0] == "nvidia-smi -L"


def test_nvidia_smi_without_driver(tmp_path: Path) -> None:
    m = Machine(tmp_path, {"driver": False})
    for args in (("-L",), ("topo", "-m"), ("--query-gpu=driver_version", "--format=csv,noheader")):
        result = m.run("nvidia-smi", *args)
        assert result.returncode == 9
        assert result.stdout == (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n"
        )


@pytest.mark.parametrize(
    "args",
    [(), ("topo",), ("topo", "-p2p", "r"), ("--query-gpu=clocks.sm", "--format=csv"), ("-L", "-i", "0")],
)
def test_nvidia_smi_unknown_arguments(machine: Machine, args: tuple[str, ...]) -> None:
    result = machine.run("nvidia-smi", *args)
    assert result.returncode == 2
    assert "nvidia-smi (double): unsupported arguments" in result.stderr
    assert result.stdout == ""
    assert len(machine.calls()) == 1


TELEMETRY_QUERY = (
    "--query-gpu=index,utilization.gpu,memory.used,memory.total,temperature.gpu,"
    "ecc.errors.uncorrected.volatile.total"
)


def test_nvidia_smi_answers_the_telemetry_query_from_its_settings(tmp_path: Path) -> None:
    gpus = {"0": {"utilization": 97, "memory_used": 72908, "temperature": 61}, "1": {"ecc": False}}
    m = Machine(tmp_path, {"gpu_count": 2, "gpus": gpus})
    result = m.run("nvidia-smi", TELEMETRY_QUERY, "--format=csv,noheader,nounits")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "0, 97, 72908, 81559, 61, 0\n1, 0, 1, 81559, 34, [N/A]\n"
    with_units = m.run("nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used", "--format=csv").stdout
    assert with_units.splitlines() == [
        "index, utilization.gpu [%], memory.used [MiB]",
        "0, 97 %, 72908 MiB",
        "1, 0 %, 1 MiB",
    ]


def test_nvidia_smi_can_be_told_a_gpu_counts_uncorrectable_ecc_errors(tmp_path: Path) -> None:
    m = Machine(tmp_path, {"gpu_count": 2})
    assert m.run("nvidia-smi", "double-set-ecc", "-i", "1", "3").returncode == 0
    lines = m.run("nvidia-smi", TELEMETRY_QUERY, "--format=csv,noheader,nounits").stdout.splitlines()
    assert [line.rsplit(", ", 1)[1] for line in lines] == ["0", "3"]
    assert m.run("nvidia-smi", "double-set-ecc", "-i", "2", "1").returncode == 1  # no GPU 2
    assert m.run("nvidia-smi", "double-set-ecc", "-i", "1").returncode == 2


def test_npu_smi_info_takes_its_figures_and_a_health_set_mid_job(tmp_path: Path) -> None:
    m = Machine(tmp_path, {"chip_count": 2, "devices": {"0": {"aicore": 87, "hbm_used": 59356, "temp": 48}}})
    lines = m.run("npu-smi", "info").stdout.splitlines()
    assert lines[6].split("|")[3].split()[1] == "48"
    assert lines[7].split("|")[3].split() == ["87", "0", "/", "0", "59356/", "65536"]
    assert m.run("npu-smi", "double-set-health", "-i", "1", "Critical").returncode == 0
    rows = [line for line in m.run("npu-smi", "info").stdout.splitlines() if line.startswith("| 1     910B ")]
    assert [row.split("|")[2].strip() for row in rows] == ["Critical"]
    assert m.run("npu-smi", "double-set-health", "-i", "1", "Bad").returncode == 2
    assert m.run("npu-smi", "double-set-health", "-i", "5", "OK").returncode == 1  # no chip 5
    # hccn_tool reads the same state file: the health kept there changes nothing of its own.
    assert m.ok(1, "-link", "-g") == "link status: UP\n"
