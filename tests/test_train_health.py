"""The health gate on the local cluster: check.yml alone and train.yml -e preflight=true; a clean cluster
passes, a node whose link is slowed (tc in its network namespace) is named, a node whose environment differs
is named, a node that is down is reported like a job's. Runs after test_train.py: it brings a third node
up."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, STATE_DIR, PlaybookResult, docker, node_exec, run_playbook, running_cluster

RUNS = REPO / "runs"
THREE = {"DDP_LOCAL_NODES": "3"}


def job_id(name: str) -> str:
    return f"test-health-{name}-{uuid.uuid4().hex[:6]}"


def health_of(run: Path) -> dict[str, object]:
    results: dict[str, object] = json.loads((run / "output" / "health.json").read_text())
    return results


def check(job: str, nodes: int, **extravars: object) -> PlaybookResult:
    env = THREE if nodes == 3 else None
    return run_playbook("check.yml", extravars={"job_id": job, "nodes": nodes, **extravars}, env=env)


def test_a_clean_cluster_passes_the_gate(local_cluster: PlaybookResult) -> None:
    job = job_id("clean")
    result = check(job, 2)
    assert result.rc == 0, result.stdout[-5000:]
    assert "health gate PASSED: 2 node(s), 2 rank(s), gloo on cpu, mpirun" in result.stdout
    assert "algbw (GB/s)  busbw (GB/s)" in result.stdout and "node0 <-> node1" in result.stdout
    results = health_of(RUNS / job)
    assert results["verdict"]["passed"] and results["nodes"] == ["node0", "node1"]  # type: ignore[index]
    sweep = results["sweep"]
    assert [row["bytes"] for row in sweep] == [4096 * 4**step for step in range(7)]  # type: ignore[attr-defined]
    assert all(row["busbw_gbps"] > 0 for row in sweep)  # type: ignore[attr-defined]
    variables = results["reports"][1]["variables"]  # type: ignore[index]
    assert variables["GLOO_SOCKET_IFNAME"] == "<the node's cluster interface>"
    assert f"health gate {job}: succeeded after" in result.stdout
    assert "final loss:" not in result.stdout  # no training summary for a gate


def test_preflight_runs_the_gate_then_the_job_and_keeps_its_results(local_cluster: PlaybookResult) -> None:
    job = job_id("preflight")
    args = "--dataset digits --epochs 2 --batch-size 32 --lr 0.05"
    result = run_playbook(
        "train.yml",
        extravars={"job_id": job, "nodes": 2, "preflight": True, "launcher": "torchrun", "script_args": args},
    )
    assert result.rc == 0, result.stdout[-5000:]
    gate, job_text = result.stdout.split("PLAY [Plan the job]")
    assert "health gate PASSED" in gate and f"health gate {job}-preflight: succeeded" in gate
    assert f"job {job}: succeeded" in job_text
    assert f"health gate: passed before the job, {RUNS / job}/output/health.json" in job_text
    assert health_of(RUNS / job)["launcher"] == "torchrun"
    assert (RUNS / job / "preflight" / "output" / "health.json").read_bytes() == (
        RUNS / job / "output" / "health.json"
    ).read_bytes()
    assert json.loads((RUNS / job / "output" / "summary.json").read_text())["world_size"] == 2


def test_preflight_packs_a_project_once_for_the_gate_and_the_job(local_cluster: PlaybookResult) -> None:
    job = job_id("preflight-workdir")
    project = REPO / "tests" / "projects" / "tiny"
    result = run_playbook(
        "train.yml",
        extravars={"job_id": job, "nodes": 2, "preflight": True, "workdir": str(project),
                   "script": "train.py", "script_args": "--steps=2 --label=gated"},
    )  # fmt: skip
    assert result.rc == 0, result.stdout[-5000:]
    gate, job_text = result.stdout.split("PLAY [Plan the job]")
    # Packed (and checked) in the gate's plan, before the gate; the job after it takes that archive.
    flat_gate = " ".join(gate.split())
    assert f"in {project} (" in flat_gate and "as packed for its health gate" not in flat_gate, flat_gate[
        -3000:
    ]
    flat = " ".join(job_text.split())  # the callback folds long messages
    assert "MiB, as packed for its health gate)" in flat, flat[-3000:]
    assert f"job {job}: succeeded" in flat and f"in {project} (" in flat
    assert (RUNS / job / "workdir.tar.gz").is_file()
    logs = "\n".join(path.read_text() for path in (RUNS / job / "logs").iterdir())
    assert f"project rank 1/2 cwd=/workspace/jobs/{job}/workdir rows=24 label=gated" in logs, logs[-3000:]


def test_preflight_asked_where_the_gate_play_cannot_see_it_starts_nothing(
    local_cluster: PlaybookResult,
) -> None:
    # The role's own name set (as group_vars would): no gate ran, so the job must not start as if one passed.
    job = job_id("unseen")
    result = run_playbook("train.yml", extravars={"job_id": job, "nodes": 2, "ddp_job_preflight": True})
    assert result.rc != 0
    assert f"no health gate ran for job {job}: pass it on the command line" in result.stdout, result.stdout[
        -3000:
    ]
    assert not (STATE_DIR / "node0" / "workspace" / "jobs" / job).exists()


@pytest.fixture(scope="module")
def three_nodes(local_cluster_made: list[PlaybookResult]) -> Iterator[None]:
    running_cluster(local_cluster_made)
    result = run_playbook("site.yml", env=THREE)
    assert result.rc == 0, result.stdout[-5000:]
    yield


def nsenter_tc(node: str, *args: str) -> subprocess.CompletedProcess[str]:
    pid = docker("inspect", "-f", "{{.State.Pid}}", node).stdout.strip()
    return subprocess.run(
        ["nsenter", "-t", pid, "-n", "tc", *args], capture_output=True, text=True, check=False
    )


def undrain(node: str) -> None:
    """A failed gate drains the node it names slow: give it back for the tests after."""
    node_exec(node, "rm -f /workspace/jobs/.drained", check=False)
    node_exec(node, f"scontrol update nodename={node} state=resume", check=False)  # drained in Slurm too


def test_a_node_with_a_slow_link_is_named(three_nodes: None) -> None:
    job = job_id("slow")
    # netem is not in this kernel; a token bucket on node1's interface slows everything node1 sends.
    slowed = nsenter_tc(
        "node1",
        "qdisc",
        "add",
        "dev",
        "eth0",
        "root",
        "tbf",
        "rate",
        "200mbit",
        "burst",
        "64kb",
        "latency",
        "100ms",
    )
    assert slowed.returncode == 0, slowed.stderr
    try:
        result = check(job, 3)
    finally:
        nsenter_tc("node1", "qdisc", "del", "dev", "eth0", "root")
        undrain("node1")
    assert result.rc != 0
    assert f"drained: node1 (health gate {job}: node node1 is slow" in " ".join(result.stdout.split())
    assert f"health gate {job} failed: node node1 is slow: its best pair reached" in result.stdout, (
        result.stdout[-4000:]
    )
    verdict = health_of(RUNS / job)["verdict"]
    assert len(verdict["problems"]) == 1  # type: ignore[index]
    assert [row["node"] for row in verdict["node_figures"] if row["slow"]] == ["node1"]  # type: ignore[index]


@pytest.fixture
def second_fabric(three_nodes: None) -> Iterator[str]:
    """A second network joined to every node (eth1): each node's local rank 1 pairs on it, as a device's own
    NIC would carry its traffic."""
    name = f"ddp-test-dev1-{uuid.uuid4().hex[:6]}"
    docker("network", "create", name)
    nodes = ["node0", "node1", "node2"]
    try:
        for node in nodes:
            docker("network", "connect", name, node)
        yield name
    finally:
        for node in nodes:
            subprocess.run(
                ["docker", "network", "disconnect", "-f", name, node], capture_output=True, check=False
            )
        subprocess.run(["docker", "network", "rm", name], capture_output=True, check=False)


def test_every_device_pair_is_measured_and_a_slow_device_is_named_by_node_and_device(
    second_fabric: str,
) -> None:
    job = job_id("device")
    # A token bucket on node2's eth1: only what node2's local rank 1 sends (its "device 1" NIC) is slowed.
    slowed = nsenter_tc(
        "node2",
        "qdisc",
        "add",
        "dev",
        "eth1",
        "root",
        "tbf",
        "rate",
        "100mbit",
        "burst",
        "64kb",
        "latency",
        "100ms",
    )
    assert slowed.returncode == 0, slowed.stderr
    try:
        result = check(job, 3, cluster_nproc_per_node=2, ddp_job_env={"DDP_GLOO_DEVICE_IFNAMES": "eth0,eth1"})
    finally:
        nsenter_tc("node2", "qdisc", "del", "dev", "eth1", "root")
        undrain("node2")
    assert result.rc != 0
    flat = " ".join(result.stdout.split())
    assert f"health gate {job} failed: node node2 device 1 is slow: its best pair reached" in flat, flat[
        -4000:
    ]
    results = health_of(RUNS / job)
    pairs = results["pairs"]
    # Each pair's figure is the fastest of its probe and at least two more operations, the slowed ones too.
    assert all(pair["iterations"] >= 2 for pair in pairs), pairs  # type: ignore[attr-defined]
    assert [(pair["a"], pair["b"], pair["device"]) for pair in pairs] == [  # type: ignore[attr-defined]
        (a, b, device)
        for device in (0, 1)
        for a, b in (("node0", "node1"), ("node1", "node2"), ("node2", "node0"))
    ]
    verdict = results["verdict"]
    assert len(verdict["problems"]) == 1, verdict["problems"]  # type: ignore[index]
    slow = [(row["node"], row["device"]) for row in verdict["node_figures"] if row["slow"]]  # type: ignore[index]
    assert slow == [("node2", 1)]


def test_a_node_whose_environment_differs_is_named_and_preflight_starts_nothing(three_nodes: None) -> None:
    job = job_id("env")
    env_file = STATE_DIR / "node2" / "etc" / "node.env"
    original = env_file.read_text()
    env_file.write_text(original + "export NCCL_SOCKET_NTHREADS=4\n")
    try:
        result = run_playbook(
            "train.yml", extravars={"job_id": job, "nodes": 3, "preflight": True}, env=THREE
        )
    finally:
        env_file.write_text(original)
    assert result.rc != 0
    assert (
        f"health gate {job}-preflight failed: NCCL_SOCKET_NTHREADS differs: node node2 (rank 2) has '4'; "
        "the others have it unset; the job was not started" in result.stdout
    ), result.stdout[-4000:]
    assert "PLAY [Plan the job]" not in result.stdout
    assert not (STATE_DIR / "node0" / "workspace" / "jobs" / job).exists()
    assert health_of(RUNS / job)["verdict"]["passed"] is False  # type: ignore[index]


def test_a_node_that_is_down_is_reported_like_a_jobs(three_nodes: None) -> None:
    job = job_id("down")
    docker("stop", "-t", "1", "node2")
    try:
        result = check(job, 3)
    finally:
        docker("start", "node2")
    assert result.rc != 0
    assert "node2: the node container node2 does not run" in result.stdout, result.stdout[-4000:]
    assert not (STATE_DIR / "node0" / "workspace" / "jobs" / job).exists()
