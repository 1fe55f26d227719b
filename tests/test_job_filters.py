"""The job launcher's filters (plugins/filter/ddp_job.py): launch argv per launcher and accelerator, the node
probe, the networks mpirun keeps to, the job's own rank table. No containers needed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("ddp_job_filters", REPO / "plugins" / "filter" / "ddp_job.py")
assert _spec is not None and _spec.loader is not None
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)

JOB_DIR = "/workspace/jobs/j1"


def plan(**changes: Any) -> dict[str, Any]:
    if changes.get("launcher") == "torch_npu_run":
        changes.setdefault("accelerator", "npu")  # torch_npu's launcher is for npu clusters only
    base = {
        "id": "j1",
        "nodes": ["sim-server0", "sim-server1"],
        "nproc_per_node": 2,
        "launcher": "mpirun",
        "script": "",
        "script_args": ["--epochs", "2"],
        "resume_checkpoint": "",
        "master_port": 29501,
        "device": "cpu",
        "accelerator": "cpu",
        "hccl_init": "rank_table",
    }
    return base | changes


def exported(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, part in enumerate(argv) if part == "-x" and "=" in argv[i + 1]]
    return dict(pair.split("=", 1) for pair in pairs)


def mca(argv: list[str], name: str) -> str:
    return next(argv[i + 2] for i, part in enumerate(argv) if part == "--mca" and argv[i + 1] == name)


def test_every_rank_gets_the_jobs_device_backend_and_launcher() -> None:
    variables = exported(filters.ddp_launch_argv(plan(device="cuda", accelerator="gpu"), JOB_DIR, ["10.0.0.0/24"]))
    assert variables["DDP_DEVICE"] == "cuda"
    assert variables["DDP_BACKEND"] == "nccl"
    assert variables["DDP_LAUNCHER"] == "mpirun"
    assert "RANK_TABLE_FILE" not in variables and "ASCEND_PROCESS_LOG_PATH" not in variables


def test_npu_job_gets_its_own_rank_table_and_ascend_logs_in_the_job_directory() -> None:
    variables = exported(filters.ddp_launch_argv(plan(device="npu", accelerator="npu"), JOB_DIR, ["10.0.0.0/24"]))
    assert variables["RANK_TABLE_FILE"] == f"{JOB_DIR}/rank_table.json"
    assert variables["ASCEND_PROCESS_LOG_PATH"] == f"{JOB_DIR}/ascend"
    assert variables["DDP_BACKEND"] == "hccl"


def test_master_addr_mode_sets_no_rank_table() -> None:
    argv = filters.ddp_launch_argv(plan(device="npu", accelerator="npu", hccl_init="master_addr"), JOB_DIR, ["x/24"])
    assert "RANK_TABLE_FILE" not in exported(argv)


def test_cpu_on_an_npu_cluster_when_asked_keeps_the_ascend_logs_but_trains_on_gloo() -> None:
    variables = exported(filters.ddp_launch_argv(plan(device="cpu", accelerator="npu"), JOB_DIR, ["10.0.0.0/24"]))
    assert (variables["DDP_DEVICE"], variables["DDP_BACKEND"]) == ("cpu", "gloo")
    assert variables["ASCEND_PROCESS_LOG_PATH"] == f"{JOB_DIR}/ascend"


def test_mpirun_keeps_to_the_nodes_networks_not_an_interface_name() -> None:
    argv = filters.ddp_launch_argv(plan(), JOB_DIR, ["172.30.99.0/24", "10.1.0.0/16"])
    assert mca(argv, "btl_tcp_if_include") == "172.30.99.0/24,10.1.0.0/16"
    assert mca(argv, "oob_tcp_if_include") == "172.30.99.0/24,10.1.0.0/16"


def test_a_users_script_runs_through_ddp_cluster_run_under_every_launcher() -> None:
    for launcher in ("mpirun", "torchrun", "torch_npu_run"):
        argv = filters.ddp_launch_argv(plan(launcher=launcher, script="/home/u/train_me.py"), JOB_DIR, ["n/24"])
        tail = argv[argv.index("ddp_cluster.run") - 1 :]
        assert tail == ["-m", "ddp_cluster.run", f"{JOB_DIR}/train_me.py", "--epochs", "2"], launcher


def test_a_project_directory_is_the_ranks_working_directory_under_every_launcher() -> None:
    for launcher in ("mpirun", "torchrun", "torch_npu_run"):
        job = plan(launcher=launcher, script="src/train.py", workdir="/home/u/proj")
        argv = filters.ddp_launch_argv(job, JOB_DIR, ["n/24"])
        assert argv[argv.index("--wdir") + 1] == f"{JOB_DIR}/workdir", launcher
        tail = argv[argv.index("ddp_cluster.run") - 1 :]
        assert tail == ["-m", "ddp_cluster.run", f"{JOB_DIR}/workdir/src/train.py", "--epochs", "2"], launcher
    # Without one, the job's directory, as before.
    argv = filters.ddp_launch_argv(plan(script="/home/u/train_me.py"), JOB_DIR, ["n/24"])
    assert argv[argv.index("--wdir") + 1] == JOB_DIR


@pytest.mark.parametrize("launcher", ["torchrun", "torch_npu_run"])
def test_torchrun_like_launchers_run_one_agent_per_node_with_the_runner_named(launcher: str) -> None:
    argv = filters.ddp_launch_argv(plan(launcher=launcher), JOB_DIR, ["n/24"])
    assert argv[argv.index("-np") + 1] == "2"
    assert argv[argv.index("ddp_cluster.torchrun_agent") + 1 : argv.index("ddp_cluster.torchrun_agent") + 3] == [
        "--runner",
        launcher,
    ]
    assert argv[argv.index("--master-addr") + 1] == "sim-server0"


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun", "torch_npu_run"])
@pytest.mark.parametrize("kind", ["check", "preflight"])
def test_the_health_gate_runs_under_the_jobs_own_launcher_and_environment(launcher: str, kind: str) -> None:
    gate_args = ["--max-bytes", "65536", "--fraction", "0.5"]
    job = plan(kind="train", launcher=launcher, script_args=["--epochs", "2"])
    gate = plan(kind=kind, launcher=launcher, script_args=gate_args, script="", workdir="")
    job_argv = filters.ddp_launch_argv(job, JOB_DIR, ["n/24"], {"NCCL_DEBUG": "INFO"})
    gate_argv = filters.ddp_launch_argv(gate, JOB_DIR, ["n/24"], {"NCCL_DEBUG": "INFO"})
    program = ["-m", "ddp_cluster.gate", "--output-dir", f"{JOB_DIR}/output", *gate_args]
    assert gate_argv[-len(program) :] == program
    # everything before the program, launcher and environment, is the job's own
    assert gate_argv[: -len(program)] == job_argv[: job_argv.index("-m", len(job_argv) - 8)]
    assert exported(gate_argv)["NCCL_DEBUG"] == "INFO"


def test_unknown_launcher_or_device_or_no_network_is_refused() -> None:
    with pytest.raises(AnsibleFilterError, match="launcher='deepspeed' is unknown"):
        filters.ddp_launch_argv(plan(launcher="deepspeed"), JOB_DIR, ["n/24"])
    with pytest.raises(AnsibleFilterError, match="device='gpu' is unknown"):
        filters.ddp_launch_argv(plan(device="gpu"), JOB_DIR, ["n/24"])
    with pytest.raises(AnsibleFilterError, match="no cluster network"):
        filters.ddp_launch_argv(plan(), JOB_DIR, [])


def test_probe_and_networks() -> None:
    probe = filters.ddp_job_probe(
        "interface: eth1\naddress: 172.30.99.10/24\naddress: 10.1.2.3/16\nlistening: LISTEN 0 128 *:29501 *:*\n"
        "cpu-binding: 0=144-167;1=144-167\n"
    )
    assert probe == {
        "interface": "eth1",
        "addresses": ["172.30.99.10/24", "10.1.2.3/16"],
        "listening": "LISTEN 0 128 *:29501 *:*",
        "cpu_binding": "0=144-167;1=144-167",
    }
    assert filters.ddp_job_probe("interface: eth9\nlistening: \n") == {
        "interface": "eth9",
        "addresses": [],
        "listening": "",
        "cpu_binding": "",
    }
    assert filters.ddp_job_networks(["172.30.99.10/24", "172.30.99.11/24", "10.1.2.3/16"]) == [
        "172.30.99.0/24",
        "10.1.0.0/16",
    ]
    with pytest.raises(AnsibleFilterError, match="not an address with a prefix"):
        filters.ddp_job_networks(["eth0"])


def test_the_jobs_rank_table_filter_gives_the_tables_text() -> None:
    data = {
        "product": "atlas-training",
        "netmask": "255.255.255.0",
        "servers": [
            {"host": "s0", "host_ip": "10.0.0.10", "device_ip_seed": "192.168.100.101"},
            {"host": "s1", "host_ip": "10.0.0.11", "device_ip_seed": "192.168.100.111"},
        ],
    }
    table = json.loads(filters.ddp_job_rank_table(data, ["s1"], 4, {"s1": "0,1,2,3"}))
    assert table["server_count"] == "1"
    assert table["server_list"][0]["server_id"] == "10.0.0.11"
    with pytest.raises(AnsibleFilterError, match=r"node s1: .*span both groups"):
        filters.ddp_job_rank_table(data, ["s1"], 4, {"s1": "2,3,4,5"})


def test_a_report_keeps_every_line_printable_as_a_block() -> None:
    lines = ["job j1 failed: a rank exited with an error", "Traceback:\t(most recent call last)  ", "bell\x07 end\r", 3]
    assert filters.ddp_report_text(lines) == (
        "job j1 failed: a rank exited with an error\nTraceback:  (most recent call last)\nbell end\n3"
    )


def test_each_device_pings_its_counterpart_on_the_next_server() -> None:
    plan = {
        "servers": [
            {"host": "a", "device_ips": ["192.168.100.1", "192.168.101.1", "192.168.102.1"]},
            {"host": "b", "device_ips": ["192.168.100.2", "192.168.101.2", "192.168.102.2"]},
            {"host": "c", "device_ips": ["192.168.100.3", "192.168.101.3", "192.168.102.3"]},
        ]
    }
    targets = filters.ddp_hccn_ping_targets(plan, ["a", "b", "c"], 2, {"a": "", "b": "1,2", "c": ""})
    assert [(t["device"], t["peer"], t["peer_device"], t["address"]) for t in targets["a"]] == [
        (0, "b", 1, "192.168.101.2"),
        (1, "b", 2, "192.168.102.2"),
    ]
    assert [t["address"] for t in targets["c"]] == ["192.168.100.1", "192.168.101.1"]
    assert filters.ddp_hccn_ping_targets(plan, ["a"], 2, {}) == {"a": []}
    with pytest.raises(AnsibleFilterError, match="b has no address for device 1 in the device-IP plan"):
        filters.ddp_hccn_ping_targets(
            {"servers": [{"host": "a", "device_ips": ["x"] * 3}, {"host": "b", "device_ips": ["y"]}]}, ["a", "b"], 3, {}
        )
