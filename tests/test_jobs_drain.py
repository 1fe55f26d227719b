"""Drained nodes on the local cluster (3 nodes): a health gate that names node1 slow (tc in its network
namespace, as test_train_health.py slows it) drains it; jobs.yml -e drain=node0 -e reason=... drains node0 and
the list shows both with when, who and why; a 1-node job skips both and runs on node2, saying so; a job that
needs more undrained nodes than there are is refused before anything starts; undrain gives them back.

One gate and one short job in all. The tests run in order and share the cluster's state (the drains); the
module's fixture undrains every node at the end and takes the cluster back to the 2 nodes the files after it
expect (a 3-node site.yml pins node2's host key on node0 and node1; test_site.py checks a 2-node re-run
changes nothing)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, STATE_DIR, PlaybookResult, docker, node_exec, run_playbook, running_cluster

THREE = {"DDP_LOCAL_NODES": "3"}
NODES = ("node0", "node1", "node2")
RUNS = REPO / "runs"
QUICK = "--dataset digits --epochs 1 --batch-size 32 --lr 0.05"


def job_id(name: str) -> str:
    return f"test-drain-{name}-{uuid.uuid4().hex[:6]}"


def playbook(name: str, **extravars: object) -> PlaybookResult:
    return run_playbook(name, extravars=extravars, env=THREE)


def flat(result: PlaybookResult) -> str:
    return " ".join(result.stdout.split())  # the callback folds long messages


def record_of(node: str) -> dict[str, str] | None:
    """The node's drain record, as it lies in its jobs' directory (None: not drained)."""
    path = STATE_DIR / node / "workspace" / "jobs" / ".drained"
    return json.loads(path.read_text()) if path.exists() else None


def nsenter_tc(node: str, *args: str) -> subprocess.CompletedProcess[str]:
    pid = docker("inspect", "-f", "{{.State.Pid}}", node).stdout.strip()
    return subprocess.run(
        ["nsenter", "-t", pid, "-n", "tc", *args], capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="module")
def three(local_cluster_made: list[PlaybookResult]) -> Iterator[None]:
    running_cluster(local_cluster_made)
    result = run_playbook("site.yml", env=THREE)
    assert result.rc == 0, result.stdout[-5000:]
    try:
        yield
    finally:
        for node in NODES:
            node_exec(node, "rm -f /workspace/jobs/.drained", check=False)
            node_exec(node, f"scontrol update nodename={node} state=resume", check=False)
        back = run_playbook("site.yml")
        assert back.rc == 0, back.stdout[-4000:]


def test_a_gate_that_names_a_node_slow_drains_it(three: None) -> None:
    job = job_id("gate")
    # netem is not in this kernel; a token bucket on node1's interface slows everything node1 sends.
    slowed = nsenter_tc(
        "node1", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "200mbit", "burst", "64kb",
        "latency", "100ms",
    )  # fmt: skip
    assert slowed.returncode == 0, slowed.stderr
    try:
        result = playbook("check.yml", job_id=job, nodes=3)
    finally:
        nsenter_tc("node1", "qdisc", "del", "dev", "eth0", "root")
    said = flat(result)
    assert result.rc != 0 and f"health gate {job} failed: node node1 is slow" in said, said[-4000:]
    drained = f"drained: node1 (health gate {job}: node node1 is slow: its best pair reached"
    assert drained in said, said[-4000:]
    found = record_of("node1")
    assert found is not None and found["reason"].startswith(f"health gate {job}: node node1 is slow")
    assert record_of("node0") is None and record_of("node2") is None  # only the node the verdict names


def test_drain_refuses_an_unknown_node_and_a_missing_reason(three: None) -> None:
    unknown = playbook("jobs.yml", drain="node9", reason="x")
    assert unknown.rc != 0
    assert "-e drain=node9 is not a node of the inventory (nodes: node0, node1, node2)" in flat(unknown)
    bare = playbook("jobs.yml", drain="node0")
    assert bare.rc != 0 and "a drain needs a reason" in flat(bare)
    checked = run_playbook(
        "jobs.yml", extravars={"drain": "node0", "reason": "fan 3 failed"}, env=THREE, cmdline="--check"
    )
    assert checked.rc == 0 and "node0 would be drained: fan 3 failed" in flat(checked), flat(checked)[-3000:]
    assert record_of("node0") is None


def test_a_drained_node_is_listed_with_when_who_and_why(three: None) -> None:
    drained = playbook("jobs.yml", drain="node0", reason="fan 3 failed")
    assert drained.rc == 0, drained.stdout[-4000:]
    assert "node0 drained: fan 3 failed. The next jobs skip it" in flat(drained)
    found = record_of("node0")
    assert found is not None and found["reason"] == "fan 3 failed" and "@" in found["by"]
    listed = playbook("jobs.yml")
    assert listed.rc == 0
    assert f"node0: drained since {found['since']} by {found['by']}: fan 3 failed" in listed.stdout
    assert "node1: drained since" in listed.stdout and "node2: free" in listed.stdout
    # drained in Slurm too, with the reason and who drained it
    slurm = node_exec("node0", "sinfo -h -N -n node0 -o '%t|%E'").stdout.strip()
    assert slurm.startswith("drain|fan 3 failed (by ") and "@" in slurm, slurm


def test_a_job_skips_the_drained_nodes_and_too_many_asked_is_refused(three: None) -> None:
    refused = playbook("train.yml", job_id=job_id("many"), nodes=2, script_args=QUICK)
    said = flat(refused)
    assert refused.rc != 0 and "nodes=2 but only 1 of the inventory's 3 nodes are undrained (node2)" in said
    assert "node0 (drained since" in said and "jobs.yml -e undrain=NODE" in said
    job = job_id("job")
    result = playbook("train.yml", job_id=job, nodes=1, script_args=QUICK)
    said = flat(result)
    assert result.rc == 0, said[-4000:]
    assert f"job {job}: skipped drained node(s): node0 (drained since" in said and "fan 3 failed" in said
    assert f"job {job}: mpirun on node2," in said and f"job {job}: succeeded" in said
    assert json.loads((RUNS / job / "plan.json").read_text())["nodes"] == ["node2"]


def test_undrain_gives_the_nodes_back(three: None) -> None:
    for node in ("node0", "node1"):
        result = playbook("jobs.yml", undrain=node)
        said = flat(result)
        assert result.rc == 0 and f"{node} undrained (it was drained since" in said, said[-3000:]
        assert record_of(node) is None
    again = playbook("jobs.yml", undrain="node0")
    assert again.rc == 0 and "node0 is not drained: nothing to undrain" in flat(again)
    listed = playbook("jobs.yml")
    assert all(f"{node}: free" in listed.stdout for node in NODES), listed.stdout[-3000:]
    assert not Path(STATE_DIR / "node0" / "workspace" / "jobs" / ".drained").exists()
    states = node_exec("node0", "sinfo -h -N -o '%N %t'").stdout.split()
    assert dict(zip(states[::2], states[1::2], strict=True)) == dict.fromkeys(NODES, "idle"), states
