"""Jobs and the health gate on the Ascend servers: every device pair measured and pinged (hccn_tool),
torch_npu in the ranks on both servers, a one-node job on cpu, CANN's and the driver's versions, a rank that
cannot use its NPU, two nodes training on the CANN base."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from .conftest import (
    DOUBLES_CONFIG,
    QUICK,
    RUNS,
    SERVERS,
    SIM_ASCEND,
    job_id,
    on_server,
    train,
    write_doubles_config,
)
from conftest import REPO, PlaybookResult, run_playbook


@pytest.fixture
def device_fabric(ascend_cluster: PlaybookResult) -> Iterator[str]:
    """A second network between the servers (eth1 on each), opened in their firewalls: each node's local rank
    1 pairs on it (DDP_GLOO_DEVICE_IFNAMES), as a chip's own NIC carries its traffic."""
    name = f"ddp-sim-dev1-{uuid.uuid4().hex[:6]}"
    subprocess.run(["docker", "network", "create", name], check=True, capture_output=True)
    try:
        for server in SERVERS:
            subprocess.run(["docker", "network", "connect", name, server], check=True, capture_output=True)
            on_server(server, "ufw allow in on eth1 >/dev/null")
        yield name
    finally:
        for server in SERVERS:
            on_server(
                server, "ufw delete allow in on eth1 >/dev/null; tc qdisc del dev eth1 root", check=False
            )
            subprocess.run(
                ["docker", "network", "disconnect", "-f", name, server], capture_output=True, check=False
            )
        subprocess.run(["docker", "network", "rm", name], capture_output=True, check=False)


def test_ascend_gate_measures_every_device_pair_and_names_a_slow_device_link(device_fabric: str) -> None:
    # What sim-server1's local rank 1 sends goes through a token bucket; its local rank 0 is not slowed.
    on_server("sim-server1", "tc qdisc add dev eth1 root tbf rate 100mbit burst 64kb latency 100ms")
    job = job_id("npu-devices")
    result = run_playbook(
        "check.yml",
        extravars={"job_id": job, "nodes": 2, "device": "cpu", "cluster_nproc_per_node": 2,
                   "ddp_job_env": {"DDP_GLOO_DEVICE_IFNAMES": "eth0,eth1"}},
        inventory=SIM_ASCEND,
    )  # fmt: skip
    assert result.rc != 0
    flat = " ".join(result.stdout.split())
    assert (
        f"health gate {job} failed: the link sim-server0 device 1 <-> sim-server1 device 1 is slow" in flat
    ), flat[-4000:]
    health = json.loads((RUNS / job / "output" / "health.json").read_text())
    assert [(pair["a"], pair["b"], pair["device"]) for pair in health["pairs"]] == [
        ("sim-server0", "sim-server1", 0), ("sim-server0", "sim-server1", 1)
    ]  # fmt: skip
    assert len(health["verdict"]["problems"]) == 1, health["verdict"]["problems"]
    # Before the ranks, every device pinged its counterpart on the other server with hccn_tool.
    calls = on_server("sim-server0", "cat /var/lib/ddp-doubles/calls.log").stdout
    assert "hccn_tool -i 0 -ping -g address 192.168.100.111" in calls
    assert "hccn_tool -i 1 -ping -g address 192.168.101.111" in calls


def test_ascend_gate_names_a_device_pair_that_hccn_ping_cannot_reach(ascend_cluster: PlaybookResult) -> None:
    write_doubles_config("sim-server0", DOUBLES_CONFIG | {"unreachable": ["192.168.101.111"]})
    try:
        job = job_id("npu-ping")
        result = run_playbook(
            "check.yml",
            extravars={"job_id": job, "nodes": 2, "device": "cpu", "cluster_nproc_per_node": 2},
            inventory=SIM_ASCEND,
        )
    finally:
        write_doubles_config("sim-server0", DOUBLES_CONFIG)
    assert result.rc != 0
    flat = " ".join(result.stdout.split())
    assert (
        "sim-server0: hccn_tool -ping failed for device 1 -> sim-server1 at 192.168.101.111 (rc 1: 3 packets"
        " transmitted, 0 received, 100.00% packet loss)" in flat
    ), flat[-4000:]
    assert "device 0 ->" not in flat.split("hccn_tool -ping failed for")[1].split(".")[0]
    assert not (RUNS / job / "output" / "health.json").exists()


def npu_reports(job: str) -> list[dict[str, object]]:
    """The npu_probe.py report of every rank, from each rank's own log (the agents' logs repeat them)."""
    return [
        json.loads(line.split("npu-probe ", 1)[1])
        for log in sorted((RUNS / job / "logs").glob("rank.*.log"))
        for line in log.read_text().splitlines()
        if "npu-probe {" in line
    ]


def test_ascend_ranks_on_both_servers_import_torch_npu(ascend_cluster: PlaybookResult) -> None:
    job = job_id("npu")
    result = train(
        job,
        SIM_ASCEND,
        nodes=2,
        launcher="torch_npu_run",
        script=str(REPO / "tests" / "scripts" / "npu_probe.py"),
    )
    assert result.rc == 0, result.stdout[-5000:]
    reports = npu_reports(job)
    assert sorted(report["node"] for report in reports) == SERVERS
    job_dir = f"/workspace/jobs/{job}"
    for report in reports:
        assert report["torch_npu"], report
        assert report["npu_count"] == 8
        assert report["ranks_with_torch_npu"] == 2
        env = report["env"]
        assert env["DDP_DEVICE"] == "npu" and env["DDP_LAUNCHER"] == "torch_npu_run"
        # The base image's library dirs (and set_env.sh's), the site's appended directory last.
        assert (
            "/usr/local/Ascend/driver/lib64/common:/usr/local/Ascend/driver/lib64/driver:"
            in env["LD_LIBRARY_PATH"]
        )
        assert env["LD_LIBRARY_PATH"].endswith(":/opt/ddp-sim/lib64")
        assert "/usr/local/Ascend/ascend-toolkit/latest/bin" in env["PATH"]
        assert env["RANK_TABLE_FILE"] == f"{job_dir}/rank_table.json"
        assert env["ASCEND_PROCESS_LOG_PATH"] == f"{job_dir}/ascend"
    # The rank started by docker exec and the one started by sshd see the same environment; but for
    # ASCEND_VISIBLE_DEVICES, which sim-server0's container has in its own environment for
    # ascend-docker-runtime (read at creation; CANN reads ASCEND_RT_VISIBLE_DEVICES), and which docker exec
    # passes on.
    first = {name: value for name, value in reports[0]["env"].items() if name != "ASCEND_VISIBLE_DEVICES"}
    second = {name: value for name, value in reports[1]["env"].items() if name != "ASCEND_VISIBLE_DEVICES"}
    assert first == second
    table = json.loads((RUNS / job / "nodes" / "sim-server1" / "rank_table.json").read_text())
    assert [server["server_id"] for server in table["server_list"]] == ["172.30.99.10", "172.30.99.11"]
    # CANN's process logs came back with the job, from both servers.
    for server in SERVERS:
        assert list((RUNS / job / "nodes" / server / "ascend" / "plog").glob("plog-*.log")), server


def test_ascend_job_on_one_node_trains_on_cpu_when_asked_with_its_own_rank_table(
    ascend_cluster: PlaybookResult,
) -> None:
    # torchrun from the venv's torch (python -m torch.distributed.run), on the CANN base's own Python.
    job = job_id("npu-cpu")
    result = train(job, SIM_ASCEND, nodes=1, launcher="torchrun", device="cpu", script_args=QUICK)
    assert result.rc == 0, result.stdout[-5000:]
    assert "device cpu (asked for, on this npu cluster)" in result.stdout
    assert json.loads((RUNS / job / "output" / "summary.json").read_text())["world_size"] == 1
    table = json.loads((RUNS / job / "nodes" / "sim-server0" / "rank_table.json").read_text())
    assert table["server_count"] == "1"
    assert [device["device_id"] for device in table["server_list"][0]["device"]] == ["0"]


def test_ascend_gate_reports_cann_and_the_driver_and_names_a_server_whose_driver_differs(
    ascend_cluster: PlaybookResult,
) -> None:
    job = job_id("npu-check")
    result = run_playbook(
        "check.yml", extravars={"job_id": job, "nodes": 2, "device": "cpu"}, inventory=SIM_ASCEND
    )
    assert result.rc == 0, result.stdout[-5000:]
    report = json.loads((RUNS / job / "output" / "health.json").read_text())["reports"][1]
    # CANN's version from the toolkit's <arch>-linux/ascend_toolkit_install.info, as the CANN 8 package lays
    # it out.
    assert report["versions"]["cann"] == "8.2.RC1" and report["versions"]["npu_driver"] == "23.0.0"
    assert report["versions"]["torch_npu"] == "2.13.0"
    # The driver is the server's, mounted into its node: one server upgraded alone is named.
    info = "/usr/local/Ascend/driver/version.info"
    on_server("sim-server1", f"sed -i.orig 's/^Version=23.0.0$/Version=24.1.0/' {info}")
    try:
        job = job_id("npu-driver")
        result = run_playbook(
            "check.yml", extravars={"job_id": job, "nodes": 2, "device": "cpu"}, inventory=SIM_ASCEND
        )
    finally:
        on_server("sim-server1", f"mv {info}.orig {info}")
    assert result.rc != 0
    assert (
        f"health gate {job} failed: npu_driver differs: node sim-server0 (rank 0) has '23.0.0';"
        " node sim-server1 (rank 1) has '24.1.0'; no value is held by a majority" in result.stdout
    ), result.stdout[-5000:]


def test_ascend_rank_that_cannot_use_the_npu_fails_the_job_naming_it(ascend_cluster: PlaybookResult) -> None:
    # The driver's library is gone on sim-server1: torch_npu cannot load there; no rank trains on cpu instead.
    hal = "/usr/local/Ascend/driver/lib64/driver/libascend_hal.so"
    on_server("sim-server1", f"mv {hal} {hal}.away")
    try:
        job = job_id("npu-broken")
        result = train(job, SIM_ASCEND, nodes=2, script=str(REPO / "tests" / "scripts" / "npu_probe.py"))
    finally:
        on_server("sim-server1", f"mv {hal}.away {hal}")
    assert result.rc != 0
    assert (
        "node sim-server1 rank 1/2: the job's device is npu (DDP_DEVICE) but device npu needs torch_npu"
        in result.stdout
    ), result.stdout[-5000:]
    assert "libascend_hal.so" in result.stdout


def test_ascend_two_nodes_train_on_the_cann_base(ascend_cluster: PlaybookResult) -> None:
    job = job_id("npu-2")
    result = train(job, SIM_ASCEND, nodes=2, device="cpu", script_args=QUICK)
    assert result.rc == 0, result.stdout[-5000:]
    summary = json.loads((RUNS / job / "output" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["accuracy"] >= 0.8
