"""The same servers as Ascend ones (inventories/sim-ascend, the ascend_cluster fixture): the hosts stage on
the NPU doubles (device addresses, reserved HCCL ports, device nodes), and its preflight: a taken HCCL port,
mixed TLS across the devices."""

from __future__ import annotations

import subprocess
import time

from .conftest import SERVERS, SIM_ASCEND, on_node, on_server
from conftest import PlaybookResult, run_playbook


def test_ascend_hosts_stage_runs_on_the_doubles(ascend_cluster: PlaybookResult) -> None:
    for index, server in enumerate(SERVERS):
        calls = on_server(server, "cat /var/lib/ddp-doubles/calls.log").stdout
        assert "npu-smi info -l" in calls
        seed = 101 + 10 * index
        assert f"hccn_tool -i 0 -ip -s address 192.168.100.{seed}" in calls, calls[-2000:]
        assert on_server(server, "sysctl -n net.ipv4.ip_local_reserved_ports").stdout.strip() == "60000-60015"
        devices = on_node(
            server, "ls /dev/davinci0 /dev/davinci7 /dev/davinci_manager /dev/devmm_svm /dev/hisi_hdc"
        )
        assert len(devices.stdout.split()) == 5
        # No whole-cluster rank table in the node's settings directory: each job writes its own.
        assert on_node(server, "test ! -e /etc/ddp-cluster/node/rank_table.json", check=False).returncode == 0


def test_ascend_taken_hccl_port_stops_site_naming_it(ascend_cluster: PlaybookResult) -> None:
    subprocess.run(
        ["docker", "exec", "-d", "sim-server1", "python3", "-m", "http.server", "60005"], check=True
    )
    time.sleep(1)
    try:
        result = run_playbook("site.yml", inventory=SIM_ASCEND, cmdline="--tags preflight")
        assert result.rc != 0
        flat = " ".join(result.stdout.split())
        taken = (
            "sim-server1: the HCCL ports 60000-60015 (npu_host_hccl_base_port, npu_host_hccl_port_count)"
            " are taken"
        )
        assert taken in flat, result.stdout[-3000:]
        assert ":60005" in flat and "nothing was changed" in flat
    finally:
        on_server("sim-server1", "pkill -f 'http.server 60005'", check=False)


def test_ascend_mixed_tls_stops_site_naming_the_device(ascend_cluster: PlaybookResult) -> None:
    tool = "/usr/local/Ascend/driver/tools/hccn_tool"
    on_server("sim-server1", f"{tool} -i 3 -tls -s enable 1")
    try:
        result = run_playbook("site.yml", inventory=SIM_ASCEND, cmdline="--tags preflight")
    finally:
        on_server("sim-server1", f"{tool} -i 3 -tls -s enable 0")
    flat = " ".join(result.stdout.split())
    assert result.rc != 0
    assert "NPU devices differ in their TLS setting" in flat, result.stdout[-3000:]
    assert "Most devices have 0; these differ: sim-server1 device 3: tls switch 1 (enabled)." in flat
