"""Device telemetry: the vendors' outputs parsed (samples in data/telemetry/, their sources in its README),
the sample script run against the doubles, the records, the device-fault decision, the sampler's files and
the supervisor's handling of a fault."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ddp_cluster.accelerators import gpu, npu, telemetry
from ddp_cluster.supervisor import drain, failures, loop
from ddp_cluster.supervisor import telemetry as sampler
from ddp_cluster.supervisor.remote import pattern

DATA = Path(__file__).parent / "data" / "telemetry"
DOUBLES = Path(__file__).resolve().parents[2] / "tests" / "doubles"
RECORD_KEYS = {"time", "node", "processes", "devices"}
DEVICE_KEYS = {
    "index",
    "kind",
    "utilization_percent",
    "memory_used_mb",
    "memory_total_mb",
    "temperature_c",
    "health",
    "ecc_uncorrectable",
    "link",
    "problem",
}


# --- the vendors' samples ----------------------------------------------------------------------------------
def test_npu_smi_info_of_an_atlas_a2_reads_every_chip_with_its_hbm() -> None:
    devices = npu.npu_telemetry((DATA / "npu_smi_info_910b3_8p.txt").read_text())
    assert [device["index"] for device in devices] == list(range(8))
    first = devices[0]
    assert first["health"] == "ok" and first["kind"] == "npu"
    assert (first["temperature_c"], first["utilization_percent"]) == (43.0, 0.0)
    assert (first["memory_used_mb"], first["memory_total_mb"]) == (
        3318.0,
        65536.0,
    )  # HBM, not the DDR's 0 / 0
    assert devices[7]["memory_used_mb"] == 3315.0 and devices[6]["temperature_c"] == 45.0


def test_npu_smi_info_with_alarms_and_the_older_chip_device_row() -> None:
    devices = npu.npu_telemetry((DATA / "npu_smi_info_310b1_alarm.txt").read_text())
    assert len(devices) == 6
    assert {device["health"] for device in devices} == {"alarm"}
    assert (devices[0]["memory_used_mb"], devices[0]["memory_total_mb"], devices[0]["temperature_c"]) == (
        600.0,
        7578.0,
        49.0,
    )
    assert telemetry.problem(devices[0]) == "health alarm"


def test_npu_smi_info_of_the_manual() -> None:
    (device,) = npu.npu_telemetry((DATA / "npu_smi_info_200i_a2.txt").read_text())
    assert (device["index"], device["health"], device["temperature_c"]) == (0, "ok", 66.0)
    assert (device["memory_used_mb"], device["memory_total_mb"]) == (957.0, 10810.0)


def test_npu_smi_info_five_digit_hbm_without_a_space_and_the_process_table_not_read() -> None:
    text = (
        "| 0     910B2C              | OK            | 86.8        35                0    / 0             |\n"
        "| 0                         | 0000:66:00.0  | 17          0    / 0          59356/ 65536         |\n"
        "+===========================+===============+====================================================+\n"
        "| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |\n"
        "| 0       0                 | 1712733       | python                   | 48954                   |\n"
    )
    (device,) = npu.npu_telemetry(text)
    assert (device["utilization_percent"], device["memory_used_mb"]) == (17.0, 59356.0)


def test_nvidia_smi_query_reads_each_gpu_and_its_ecc_errors() -> None:
    gpus = gpu.gpu_telemetry((DATA / "nvidia_smi_query_h100_8p.csv").read_text())
    assert [item["index"] for item in gpus] == list(range(8))
    assert gpus[0] | {"problem": None} == {
        "index": 0,
        "kind": "gpu",
        "utilization_percent": 97.0,
        "memory_used_mb": 72908.0,
        "memory_total_mb": 81559.0,
        "temperature_c": 61.0,
        "health": "ok",
        "ecc_uncorrectable": 0,
        "link": None,
        "problem": None,
    }
    assert telemetry.problem(gpus[5]) == "2 uncorrectable ECC error(s)"


def test_nvidia_smi_query_without_ecc_and_the_driver_message() -> None:
    (one,) = gpu.gpu_telemetry((DATA / "nvidia_smi_query_geforce_no_ecc.csv").read_text())
    assert one["ecc_uncorrectable"] is None and one["memory_total_mb"] == 5934.0
    failed = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
    assert gpu.gpu_telemetry(failed) == []


@pytest.mark.parametrize(
    ("said", "state"),
    [
        ("link status: UP", "up"),
        ("link status: DOWN\n", "down"),
        ("device 3 does not exist", None),
        ("", None),
    ],
)
def test_hccn_link_state(said: str, state: str | None) -> None:
    assert npu.link_state(said) == state


# --- the sample's output and the record -------------------------------------------------------------------
STAT = (
    "4242 (python3 -m x (y)) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 3 0 1000 123456 2048"
    " 18446744"
)


def test_a_proc_stat_line_with_spaces_and_parentheses_in_the_name() -> None:
    found = telemetry.process(STAT)
    assert found == telemetry.Process(pid=4242, ticks=300, started=1000, rss_pages=2048)
    assert telemetry.process("garbage") is None


def answer(uptime: float, stat: str = STAT, devices: str = "") -> str:
    return f"@@uptime {uptime}\n@@pagesize 4096\n@@procs\n{stat}\n{devices}"


def test_the_record_has_the_conventions_fields_and_the_cpu_since_the_last_sample() -> None:
    first = telemetry.read_sample(answer(40.0))
    assert first is not None
    record = telemetry.record("node0", 1700000000.0, first, None)
    assert set(record) == RECORD_KEYS and record["devices"] == []
    # 300 ticks (3 s of CPU) since the process started at 10 s of uptime, 30 s ago: 10 % of a core.
    assert record["processes"] == {"count": 1, "cpu_percent": 10.0, "rss_mb": 8.0}
    later = telemetry.read_sample(answer(50.0, STAT.replace(" 250 50 ", " 650 150 ")))
    assert later is not None
    # 500 more ticks in 10 s: 50 % of a core.
    assert telemetry.record("node0", 1700000010.0, later, first)["processes"]["cpu_percent"] == 50.0


def test_a_node_that_did_not_answer_gives_no_sample() -> None:
    assert telemetry.read_sample("") is None
    assert telemetry.read_sample("ssh: connect to host node1 port 2222: Connection refused\n") is None


def test_npu_sections_carry_each_devices_link() -> None:
    table = (DATA / "npu_smi_info_910b3_8p.txt").read_text()
    hccn = "".join(f"{index} link status: {'DOWN' if index == 3 else 'UP'}\n" for index in range(8))
    sample = telemetry.read_sample(answer(40.0, devices=f"@@npu-smi\n{table}@@hccn\n{hccn}"))
    assert sample is not None
    assert [device["link"] for device in sample.devices] == ["up"] * 3 + ["down"] + ["up"] * 4
    assert sample.devices[3]["problem"] == "link down"
    assert all(set(device) == DEVICE_KEYS for device in sample.devices)


# --- the device-fault decision ----------------------------------------------------------------------------
def reading(index: int = 1, **fields: Any) -> dict[str, Any]:
    base = {"index": index, "kind": "npu", "health": "ok", "ecc_uncorrectable": None, "link": "up"}
    return base | fields


def test_a_device_that_turned_bad_is_a_fault_naming_it() -> None:
    first = {1: reading(), 2: reading(2)}
    assert telemetry.device_faults(first, [reading(), reading(2)]) == []
    assert telemetry.device_faults(first, [reading(health="alarm"), reading(2)]) == [
        (1, "health alarm (npu-smi)")
    ]
    assert telemetry.device_faults(first, [reading(), reading(2, link="down")]) == [
        (2, "link down (hccn_tool)")
    ]


def test_ecc_errors_count_only_when_they_grew_during_the_job() -> None:
    first = {0: reading(0, kind="gpu", ecc_uncorrectable=2, link=None)}
    assert telemetry.device_faults(first, [reading(0, kind="gpu", ecc_uncorrectable=2, link=None)]) == []
    assert telemetry.device_faults(first, [reading(0, kind="gpu", ecc_uncorrectable=3, link=None)]) == [
        (0, "1 new uncorrectable ECC error(s) (3 since the driver loaded)")
    ]


def test_a_device_bad_from_its_first_reading_is_no_fault() -> None:
    bad = reading(health="warning", link="down")
    assert telemetry.device_faults({1: bad}, [bad]) == []
    assert telemetry.device_faults({}, [bad]) == []  # its first reading is this one


# --- the script, run against the doubles ------------------------------------------------------------------
@pytest.fixture
def job_process(tmp_path: Path) -> Iterator[str]:
    """A process whose command line holds a job's tag, as a rank's does; the tag."""
    tag = f"{tmp_path}/job/"
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", tag])
    time.sleep(0.3)
    try:
        yield tag
    finally:
        process.kill()
        process.wait()


def run_script(tag: str, accelerator: str, state: Path) -> str:
    env = {**os.environ, "PATH": f"{DOUBLES}:{os.environ['PATH']}", "DDP_DOUBLES_STATE": str(state)}
    command = telemetry.sample_script(pattern(tag), accelerator)
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, timeout=60)
    return done.stdout


def test_the_script_on_a_cpu_node_finds_the_jobs_processes_and_not_itself(
    job_process: str, tmp_path: Path
) -> None:
    sample = telemetry.read_sample(run_script(job_process, "cpu", tmp_path / "state"))
    assert sample is not None and sample.devices == []
    assert len(sample.processes) == 1  # the python process: not the script's own sh, pgrep or ssh
    assert telemetry.record("n", 0.0, sample, None)["processes"]["rss_mb"] > 1


def test_the_script_on_an_npu_node_and_a_device_made_unhealthy(job_process: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    before = telemetry.read_sample(run_script(job_process, "npu", state))
    assert before is not None
    assert len(before.devices) == 8 and {device["link"] for device in before.devices} == {"up"}
    assert before.devices[0]["memory_total_mb"] == 65536.0
    subprocess.run(
        [sys.executable, str(DOUBLES / "npu-smi"), "double-set-health", "-i", "2", "Critical"],
        env={**os.environ, "DDP_DOUBLES_STATE": str(state)},
        check=True,
    )
    subprocess.run(
        [sys.executable, str(DOUBLES / "hccn_tool"), "-i", "5", "-link", "-s", "down"],
        env={**os.environ, "DDP_DOUBLES_STATE": str(state)},
        check=True,
    )
    after = telemetry.read_sample(run_script(job_process, "npu", state))
    assert after is not None
    first = {int(device["index"]): device for device in before.devices}
    assert telemetry.device_faults(first, after.devices) == [
        (2, "health critical (npu-smi)"),
        (5, "link down (hccn_tool)"),
    ]


def test_the_script_on_a_gpu_node_and_ecc_errors_that_grew(job_process: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "config.json").write_text(json.dumps({"gpu_count": 2, "gpus": {"1": {"utilization": 88}}}))
    before = telemetry.read_sample(run_script(job_process, "gpu", state))
    assert before is not None
    assert [(device["index"], device["utilization_percent"]) for device in before.devices] == [
        (0, 0.0),
        (1, 88.0),
    ]
    subprocess.run(
        [sys.executable, str(DOUBLES / "nvidia-smi"), "double-set-ecc", "-i", "1", "4"],
        env={**os.environ, "DDP_DOUBLES_STATE": str(state)},
        check=True,
    )
    after = telemetry.read_sample(run_script(job_process, "gpu", state))
    assert after is not None
    first = {int(device["index"]): device for device in before.devices}
    assert telemetry.device_faults(first, after.devices) == [
        (1, "4 new uncorrectable ECC error(s) (4 since the driver loaded)")
    ]


# --- the sampler ------------------------------------------------------------------------------------------
def test_the_sampler_writes_one_file_per_node_and_keeps_the_first_fault(
    job_process: str, tmp_path: Path
) -> None:
    states = {"node0": tmp_path / "s0", "node1": tmp_path / "s1"}
    env = {**os.environ, "PATH": f"{DOUBLES}:{os.environ['PATH']}"}

    def run(node: str, command: str, timeout: float) -> str:
        if node == "gone":
            return ""
        shell_env = env | {"DDP_DOUBLES_STATE": str(states[node])}
        return subprocess.run(
            ["sh", "-c", command], capture_output=True, text=True, env=shell_env, timeout=timeout
        ).stdout

    job_dir = tmp_path / "job"
    watched = ["node0", "node1", "gone"]
    sampling = sampler.Sampler(job_dir, lambda: watched, "npu", job_process, 15.0, run, clock=lambda: 1000.0)
    assert len(sampling.sample()) == 2 and sampling.fault() is None
    subprocess.run(
        [sys.executable, str(DOUBLES / "npu-smi"), "double-set-health", "-i", "1", "Alarm"],
        env={**os.environ, "DDP_DOUBLES_STATE": str(states["node1"])},
        check=True,
    )
    sampling.sample()
    assert sampling.fault() == sampler.DeviceFault("node1", 1, "health alarm (npu-smi)", 1000.0)
    lines = (job_dir / "telemetry" / "node1.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 2 and all(set(record) == RECORD_KEYS for record in records)
    assert records[1]["devices"][1]["problem"] == "health alarm"
    assert records[0]["processes"]["count"] == 1
    assert not (job_dir / "telemetry" / "gone.jsonl").exists()
    sampling.forget("node1")
    assert sampling.fault() is None


def test_the_sampler_thread_samples_on_its_own_and_stops(tmp_path: Path) -> None:
    asked: list[str] = []

    def run(node: str, command: str, timeout: float) -> str:
        asked.append(node)
        return answer(10.0)

    sampling = sampler.Sampler(tmp_path, lambda: ["a"], "cpu", "/x/", 0.05, run).start()
    time.sleep(0.3)
    sampling.stop()
    count = len(asked)
    time.sleep(0.15)
    assert count >= 3 and len(asked) == count
    assert sampler.Sampler(tmp_path, lambda: ["a"], "cpu", "/x/", 0, run).start()._thread is None  # 0: off


def test_node_names_make_safe_file_names() -> None:
    assert sampler.file_name("sim-server0") == "sim-server0.jsonl"
    assert sampler.file_name("../etc/x") == ".._etc_x.jsonl"


# --- the supervisor's handling of a fault -----------------------------------------------------------------
def test_a_device_fault_is_a_restartable_failure_naming_node_and_device() -> None:
    failure = failures.device_fault("node1", 3, "health alarm (npu-smi)")
    assert failure.reason == "device-fault: node node1 device 3: health alarm (npu-smi)"
    assert (failure.node, failure.device, failure.cause, failure.restartable) == (
        "node1",
        3,
        "device-fault",
        True,
    )
    assert failures.restart_cause(failure, ["Traceback...\nZeroDivisionError: x"]) == failure.reason


def supervisor_stub(me: str, nodes: list[str]) -> Any:
    written: list[dict[str, Any]] = []
    forgotten: list[str] = []
    return SimpleNamespace(
        spec=SimpleNamespace(id="job-7"),
        job_dir=Path("/workspace/jobs/job-7"),
        mesh=SimpleNamespace(me=me),
        me=me,
        nodes=nodes,
        telemetry=SimpleNamespace(forget=forgotten.append),
        status=SimpleNamespace(write=lambda **fields: written.append(fields)),
        written=written,
        forgotten=forgotten,
    )


def test_the_faulty_node_is_drained_with_the_reason_and_left_out_of_the_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(drain, "drain_remote", lambda *args: calls.append(args) or True)
    stub = supervisor_stub("node0", ["node0", "node1", "node2"])
    failure = failures.device_fault("node1", 3, "health alarm (npu-smi)")
    assert loop.Supervisor.leave_faulty_node(stub, failure) == "node1"
    assert calls == [
        (
            stub.mesh,
            "node1",
            "/workspace/jobs",
            "device-fault: node node1 device 3: health alarm (npu-smi) (job job-7)",
            "supervisor on node0",
        )
    ]
    assert stub.nodes == ["node0", "node2"] and stub.forgotten == ["node1"] and failure.restartable


def test_a_fault_on_the_first_node_ends_the_job_and_a_failed_drain_is_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(drain, "drain_remote", lambda *args: False)
    stub = supervisor_stub("node0", ["node0", "node1"])
    failure = failures.device_fault("node0", 0, "health critical (npu-smi)")
    assert loop.Supervisor.leave_faulty_node(stub, failure) == ""
    assert not failure.restartable and stub.nodes == ["node0", "node1"]
    assert "node0 could not be drained: drain it with jobs.yml -e drain=node0" in failure.reason
    assert "not restarted: node0 is the job's first node" in failure.reason


# --- the report -------------------------------------------------------------------------------------------
def test_the_report_draws_the_telemetry_and_names_a_device_problem(tmp_path: Path) -> None:
    from test_jobreport import archive, planned

    from ddp_cluster.job import report as jobreport
    from ddp_cluster.job.status import Status

    run_dir = planned(tmp_path)
    fault = "device-fault: node s1 device 2: health alarm (npu-smi)"
    failed = Status(state="failed", reason=fault, failed_node="s1")
    ok = {"index": 2, "kind": "npu", "health": "ok", "problem": None, "utilization_percent": 90.0}
    bad = ok | {"health": "alarm", "problem": "health alarm"}
    lines = [
        {"time": 100.0, "node": "s1", "processes": {"count": 2, "cpu_percent": 150.0, "rss_mb": 800.0},
         "devices": [ok]},
        {"time": 160.0, "node": "s1", "processes": {"count": 2, "cpu_percent": 150.0, "rss_mb": 800.0},
         "devices": [bad]},
    ]  # fmt: skip
    telemetry_lines = "".join(json.dumps(line) + "\n" for line in lines)
    archive(run_dir, "s0", {"status.json": failed.dumps(), "telemetry/s1.jsonl": telemetry_lines})
    done = jobreport.report(run_dir)
    assert done.failure.startswith(f"job j1 failed: {fault} (node s1)")
    assert f"telemetry: 1 node(s), 2 sample(s): {run_dir / 'telemetry'}" in done.lines[-2]
    assert done.lines[-1] == "device problem: s1 device 2: health alarm (first seen 1.0 min into the job)"
    assert (run_dir / "output" / "telemetry.png").read_bytes()[:4] == b"\x89PNG"


def test_a_job_with_fewer_than_two_samples_per_node_gets_no_empty_plot_and_is_told_why(
    tmp_path: Path,
) -> None:
    from test_jobreport import archive, planned

    from ddp_cluster.job import report as jobreport
    from ddp_cluster.job.status import Status

    run_dir = planned(tmp_path)
    one = {"time": 100.0, "node": "s1", "processes": {"count": 1, "cpu_percent": 90.0, "rss_mb": 300.0}}
    done = Status(state="succeeded", rc=0)
    archive(run_dir, "s0", {"status.json": done.dumps(), "telemetry/s1.jsonl": json.dumps(one) + "\n"})
    said = "\n".join(jobreport.report(run_dir).lines)
    assert "telemetry: 1 node(s), 1 sample(s)" in said and "not drawn: fewer than two samples" in said
    assert not (run_dir / "output" / "telemetry.png").exists()


def test_npu_links_are_asked_every_few_samples_and_a_link_down_is_a_fault(tmp_path: Path) -> None:
    table = (DATA / "npu_smi_info_910b3_8p.txt").read_text()
    link = {"state": "UP"}
    asked: list[bool] = []

    def run(node: str, command: str, timeout: float) -> str:
        asked.append("@@hccn" in command)
        hccn = "".join(
            f"{index} link status: {link['state'] if index == 6 else 'UP'}\n" for index in range(8)
        )
        return answer(10.0, devices=f"@@npu-smi\n{table}" + (f"@@hccn\n{hccn}" if asked[-1] else ""))

    sampling = sampler.Sampler(tmp_path, lambda: ["n0"], "npu", "/x/", 15.0, run, clock=lambda: 5.0)
    for _ in range(sampler.LINKS_EVERY + 1):
        sampling.sample()
        link["state"] = "DOWN"  # from the second sample on, which does not ask
    assert asked == [True] + [False] * (sampler.LINKS_EVERY - 1) + [True]
    assert sampling.fault() == sampler.DeviceFault("n0", 6, "link down (hccn_tool)", 5.0)
    records = [json.loads(line) for line in (tmp_path / "telemetry" / "n0.jsonl").read_text().splitlines()]
    assert [record["devices"][6]["link"] for record in records] == ["up", None, None, None, "down"]


# --- the common faults: a device gone, a GPU that needs a reset, any health word of npu-smi ----------------
GPU_LOST = (
    "0, 97, 72908, 81559, 61, 0\n"
    "Unable to determine the device handle for GPU 00000000:19:00.0: GPU is lost. Reboot the system to"
    " recover this GPU\n"
)


def gpu_answer(text: str, rc: int = 0) -> str:
    return answer(40.0, devices=f"@@nvidia-smi\n{text}@@tool-rc {rc}\n")


def test_a_gpu_no_longer_listed_is_a_fault_quoting_what_nvidia_smi_said() -> None:
    before = telemetry.read_sample(gpu_answer("0, 97, 72908, 81559, 61, 0\n1, 90, 72908, 81559, 60, 0\n"))
    after = telemetry.read_sample(gpu_answer(GPU_LOST, rc=15))
    assert before is not None and after is not None and after.listed
    first = {int(device["index"]): device for device in before.devices}
    assert telemetry.device_faults(first, after.devices, after.listed, after.said) == [
        (
            1,
            "no longer listed by nvidia-smi (Unable to determine the device handle for GPU"
            " 00000000:19:00.0: GPU is lost. Reboot the system to recover this GPU)",
        )
    ]


def test_a_vendor_tool_cut_off_by_its_timeout_lists_nothing_and_finds_no_device_gone() -> None:
    before = telemetry.read_sample(gpu_answer("0, 97, 72908, 81559, 61, 0\n"))
    cut = telemetry.read_sample(gpu_answer("", rc=124))
    assert before is not None and cut is not None and not cut.listed
    first = {int(device["index"]): device for device in before.devices}
    assert telemetry.device_faults(first, cut.devices, cut.listed, cut.said) == []
    # the driver gone (nvidia-smi answered, listing nothing): every GPU gone
    gone = telemetry.read_sample(gpu_answer("NVIDIA-SMI has failed because it couldn't communicate\n", 9))
    assert gone is not None and telemetry.device_faults(first, gone.devices, gone.listed, gone.said) == [
        (0, "no longer listed by nvidia-smi")
    ]
    script = telemetry.sample_script("[/]x/", "npu")
    assert f"timeout -k {telemetry.KILL_AFTER} {telemetry.TOOL_TIMEOUT}" in script


@pytest.mark.parametrize(
    "row",
    [
        "1, [GPU requires reset], [GPU requires reset], [GPU requires reset], [GPU requires reset],"
        " [GPU requires reset]",
        "1, [N/A], [N/A], [N/A], [N/A], [N/A]",
        "1, 0, 1, 81559, 40, [Unknown Error]",
    ],
)
def test_a_gpu_row_of_errors_or_nothing_is_critical_and_a_fault(row: str) -> None:
    healthy = gpu.gpu_telemetry("1, 90, 72908, 81559, 60, 0\n")
    (broken,) = gpu.gpu_telemetry(row + "\n")
    assert (broken["index"], broken["health"]) == (1, "critical")
    assert telemetry.problem(broken) == "health critical"
    assert telemetry.device_faults({1: healthy[0]}, [broken]) == [(1, "health critical (nvidia-smi)")]


def npu_table(health: str) -> str:
    """Two devices of a 910B3 table, the second's health ``health``."""
    return (
        "| 0     910B3               | OK            | 101.8       43                0    / 0             |\n"
        "| 0                         | 0000:C1:00.0  | 0           0    / 0          3318 / 65536         |\n"
        "+===========================+===============+====================================================+\n"
        f"| 1     910B3               | {health:<14}| 92.2        44                0    / 0             |\n"
        "| 0                         | 0000:C2:00.0  | 0           0    / 0          3317 / 65536         |\n"
        "+===========================+===============+====================================================+\n"
    )


@pytest.mark.parametrize("word", ["Unknown", "NA", "Abnormal", "UNKNOWN", "critical"])
def test_an_npu_of_any_health_word_keeps_its_row_and_is_a_fault(word: str) -> None:
    first = {int(device["index"]): device for device in npu.npu_telemetry(npu_table("OK"))}
    devices = npu.npu_telemetry(npu_table(word))
    assert [(device["index"], device["memory_used_mb"]) for device in devices] == [(0, 3318.0), (1, 3317.0)]
    assert devices[1]["health"] == word.lower()
    assert telemetry.device_faults(first, devices) == [(1, f"health {word.lower()} (npu-smi)")]


def test_an_npu_warning_is_a_problem_in_the_record_but_no_fault() -> None:
    first = {int(device["index"]): device for device in npu.npu_telemetry(npu_table("OK"))}
    devices = npu.npu_telemetry(npu_table("Warning"))
    assert telemetry.problem(devices[1]) == "health warning"
    assert telemetry.device_faults(first, devices) == []
    alarm = npu.npu_telemetry(npu_table("Alarm"))
    assert telemetry.device_faults({1: devices[1]}, alarm[1:]) == [(1, "health alarm (npu-smi)")]


def test_the_script_on_a_gpu_node_and_gpus_lost_or_needing_a_reset(job_process: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "config.json").write_text(json.dumps({"gpu_count": 3}))
    before = telemetry.read_sample(run_script(job_process, "gpu", state))
    assert before is not None and len(before.devices) == 3
    for index, fault in ((1, "lost"), (2, "reset")):
        subprocess.run(
            [sys.executable, str(DOUBLES / "nvidia-smi"), "double-set-fault", "-i", str(index), fault],
            env={**os.environ, "DDP_DOUBLES_STATE": str(state)},
            check=True,
        )
    after = telemetry.read_sample(run_script(job_process, "gpu", state))
    assert after is not None
    first = {int(device["index"]): device for device in before.devices}
    (lost, reset) = telemetry.device_faults(first, after.devices, after.listed, after.said)
    assert lost[0] == 1 and lost[1].startswith("no longer listed by nvidia-smi (Unable to determine")
    assert reset == (2, "health critical (nvidia-smi)")


def test_the_script_on_an_npu_node_and_a_device_of_unknown_health(job_process: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    before = telemetry.read_sample(run_script(job_process, "npu", state))
    assert before is not None
    subprocess.run(
        [sys.executable, str(DOUBLES / "npu-smi"), "double-set-health", "-i", "4", "Unknown"],
        env={**os.environ, "DDP_DOUBLES_STATE": str(state)},
        check=True,
    )
    after = telemetry.read_sample(run_script(job_process, "npu", state))
    assert after is not None and len(after.devices) == 8
    assert after.devices[4]["link"] == "up"  # its link asked too: the device row is found by its name
    first = {int(device["index"]): device for device in before.devices}
    assert telemetry.device_faults(first, after.devices, after.listed) == [(4, "health unknown (npu-smi)")]


def test_hung_hccn_tools_are_killed_and_asked_all_at_once(
    job_process: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight hccn_tools that ignore SIGTERM: each killed KILL_AFTER seconds after its timeout, all at once
    (one after the other, they would take 8 x (TOOL_TIMEOUT + KILL_AFTER))."""
    monkeypatch.setattr(telemetry, "TOOL_TIMEOUT", 1)
    monkeypatch.setattr(telemetry, "KILL_AFTER", 1, raising=False)
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "hccn_tool").write_text("#!/bin/sh\ntrap '' TERM\nexec sleep 60\n")
    (tools / "hccn_tool").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{tools}:{DOUBLES}:{os.environ['PATH']}",
        "DDP_DOUBLES_STATE": str(tmp_path / "state"),
    }
    began = time.monotonic()
    done = subprocess.run(
        ["sh", "-c", telemetry.sample_script(pattern(job_process), "npu")],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    took = time.monotonic() - began
    sample = telemetry.read_sample(done.stdout)
    assert sample is not None and len(sample.devices) == 8
    assert {device["link"] for device in sample.devices} == {None}
    assert took < 6, took


# --- the sampler's check, and a fault of a node that left ---------------------------------------------------
def healthy_or_gone(gone: set[str]) -> Any:
    """A runner: each node answers two healthy GPUs; a node in ``gone`` lists GPU 0 only (GPU 1 lost)."""

    def run(node: str, command: str, timeout: float) -> str:
        rows = "0, 10, 1, 81559, 40, 0\n" + ("" if node in gone else "1, 10, 1, 81559, 40, 0\n")
        return gpu_answer(rows if node not in gone else rows + GPU_LOST.splitlines()[1] + "\n", 15)

    return run


def test_a_check_samples_once_when_no_fault_is_known(tmp_path: Path) -> None:
    gone: set[str] = set()
    sampling = sampler.Sampler(tmp_path, lambda: ["n0", "n1"], "gpu", "/x/", 15.0, healthy_or_gone(gone))
    sampling.sample()
    assert sampling.check() is None
    gone.add("n1")
    fault = sampling.check()
    assert fault is not None and (fault.node, fault.device) == ("n1", 1)
    assert fault.problem.startswith("no longer listed by nvidia-smi")
    asked: list[str] = []
    off = sampler.Sampler(tmp_path, ["n1"].copy, "gpu", "/x/", 0, lambda *args: asked.append(args[0]) or "")
    assert off.check() is None and asked == []  # the telemetry off: no sample


def test_a_check_is_bounded_whatever_a_node_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler, "CHECK_GRACE", 0.1)
    release = threading.Event()

    def stuck(node: str, command: str, timeout: float) -> str:
        release.wait(10)
        return ""

    sampling = sampler.Sampler(tmp_path, lambda: ["n0"], "gpu", "/x/", 15.0, stuck)
    sampling.timeout = 0.2
    began = time.monotonic()
    assert sampling.check() is None
    release.set()
    assert time.monotonic() - began < 1.0


def test_a_fault_of_a_node_no_longer_in_the_job_is_ignored(tmp_path: Path) -> None:
    watched = ["n0", "n1"]
    sampling = sampler.Sampler(tmp_path, lambda: list(watched), "gpu", "/x/", 15.0, healthy_or_gone(set()))
    sampling.sample()
    sampling.run = healthy_or_gone({"n1"})
    sampling.sample()
    assert sampling.fault() is not None
    sampling.forget("n1")
    sampling.sample()  # a sample under way while n1 was being drained finds its GPU gone again
    watched.remove("n1")
    assert sampling.fault() is None
    sampling.run = healthy_or_gone({"n0"})
    sampling.sample()
    fault = sampling.fault()
    assert fault is not None and fault.node == "n0"  # the next fault is kept, not the left node's


def test_the_watch_checks_the_devices_when_the_launcher_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device fault kills the ranks at once: the launcher fails before the next periodic sample; the
    watch's one sample names the device, and the failure is a device fault (the restart leaves the node)."""
    from concurrent.futures import ThreadPoolExecutor

    from test_supervise_restart import faked

    supervisor, _ = faked(tmp_path, monkeypatch)
    gone: set[str] = set()
    supervisor.telemetry = sampler.Sampler(
        supervisor.job_dir, lambda: list(supervisor.nodes), "gpu", "/x/", 15.0, healthy_or_gone(gone)
    )
    supervisor.telemetry.sample()
    gone.add("n1")  # GPU 1 of n1 falls off the bus; the ranks die with it
    monkeypatch.setattr(supervisor.mesh, "down_now", lambda nodes, pool: [])
    process = SimpleNamespace(poll=lambda: 1, returncode=1)
    tree = SimpleNamespace(lost=lambda: (), suspects=lambda: [])
    with ThreadPoolExecutor(max_workers=2) as pool:
        failure = supervisor.watch(process, pool, tree)  # type: ignore[arg-type]
    assert failure is not None and failure.cause == failures.DEVICE_FAULT
    assert (failure.node, failure.device) == ("n1", 1)
    assert failure.reason.startswith("device-fault: node n1 device 1: no longer listed by nvidia-smi")
