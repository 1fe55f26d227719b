"""Jobs across servers: train.yml with both launchers, the health gate through the servers' firewalls, and a
server dying mid-job (killed, then started again: tests/sim/test_sim_4_preflight.py runs a job on it last)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from .conftest import (
    QUICK,
    RUNS,
    SIM,
    STATE,
    job_id,
    on_node,
    on_server,
    train,
    wait_engine,
    wait_for_progress,
)
from conftest import PlaybookResult, run_playbook, start_train


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_train_across_servers(sim_cluster: PlaybookResult, launcher: str) -> None:
    job = job_id(launcher)
    result = train(job, nodes=2, launcher=launcher, script_args=QUICK)
    assert result.rc == 0, result.stdout[-5000:]
    summary = json.loads((RUNS / job / "output" / "summary.json").read_text())
    assert summary["world_size"] == 2
    # torchrun: each worker's own log, and each node's agent's.
    agents = ["agent.0.log", "agent.1.log"] if launcher == "torchrun" else []
    assert sorted(p.name for p in (RUNS / job / "logs").iterdir()) == [*agents, "rank.0.log", "rank.1.log"]
    assert (RUNS / job / "nodes" / "sim-server1").is_dir()


def test_the_health_gate_measures_across_servers_through_their_firewalls(sim_cluster: PlaybookResult) -> None:
    job = job_id("check")
    result = run_playbook("check.yml", extravars={"job_id": job, "nodes": 2}, inventory=SIM)
    assert result.rc == 0, result.stdout[-5000:]
    assert "health gate PASSED: 2 node(s), 2 rank(s), gloo on cpu, mpirun" in result.stdout
    results = json.loads((RUNS / job / "output" / "health.json").read_text())
    assert [(pair["a"], pair["b"]) for pair in results["pairs"]] == [("sim-server0", "sim-server1")]
    assert results["pairs"][0]["busbw_gbps"] > 0 and results["check"]["ok"]


def test_dead_server_fails_the_job_within_60s_naming_it(sim_cluster: PlaybookResult) -> None:
    job = job_id("dead")
    args = "--dataset synthetic --synthetic-samples 200000 --epochs 50 --batch-size 64 --log-every 50"
    playbook = start_train(job, args, SIM)
    try:
        wait_for_progress(playbook, job)
        subprocess.run(["docker", "kill", "sim-server1"], check=True, capture_output=True)
        killed = time.monotonic()
        output, _ = playbook.communicate(timeout=150)
        took = time.monotonic() - killed
    finally:
        if playbook.poll() is None:
            os.killpg(playbook.pid, signal.SIGTERM)
        subprocess.run(["docker", "start", "sim-server1"], check=True, capture_output=True)
    assert playbook.returncode != 0
    assert took < 60, f"train.yml took {took:.0f} s to fail after sim-server1 died"
    assert f"job {job} failed: node sim-server1" in output, output[-4000:]
    left = on_node("sim-server0", f"pgrep -af '[/]workspace/jobs/{job}/' || true").stdout.strip()
    assert left == "", left
    wait_engine("sim-server1")


def test_a_killed_server_is_recovered_on_the_other_within_90s(sim_cluster: PlaybookResult) -> None:
    """max_restarts=1 with min_nodes=1 (the sim has no third server to spare): sim-server1 killed mid-job, the
    supervisor on sim-server0 restarts the job there alone from its newest checkpoint, and it finishes."""
    job = job_id("restart")
    args = "--dataset digits --epochs 400 --batch-size 32 --log-every 10 --checkpoint-every 50"
    playbook = start_train(job, args, SIM, extra=("-e", "max_restarts=1", "-e", "min_nodes=1"))
    try:
        wait_for_progress(playbook, job, mark='"step": 5')
        subprocess.run(["docker", "kill", "sim-server1"], check=True, capture_output=True)
        killed = time.time()
        output, _ = playbook.communicate(timeout=400)
    finally:
        if playbook.poll() is None:
            os.killpg(playbook.pid, signal.SIGTERM)
        subprocess.run(["docker", "start", "sim-server1"], check=True, capture_output=True)
    assert playbook.returncode == 0, output[-5000:]
    [restart] = json.loads((RUNS / job / "status.json").read_text())["restarts"]
    assert restart["lost"] == ["sim-server1"] and restart["nodes_after"] == ["sim-server0"], restart
    again = float(restart["lost_at"]) + float(restart["training_again_s"]) - killed
    assert again < 90, f"training again {again:.0f} s after sim-server1 was killed"
    assert json.loads((RUNS / job / "output" / "summary.json").read_text())["world_size"] == 1
    wait_engine("sim-server1")


def test_the_first_server_killed_its_standby_takes_over_within_120s(sim_cluster: PlaybookResult) -> None:
    """max_restarts=1 with min_nodes=1: sim-server0 (the job's first node: rank 0 and the supervisor) killed
    mid-job, the standby on sim-server1 takes the job over from the checkpoint copy it holds, and the
    controller follows it there to its end.

    Two voters: the standby wins only once sim-server0 is proven gone, when its neighbour entry on
    sim-server1 lapses (the kernel's reachable time, 15-45 s at random, then 8 s of probes): 26-56 s after
    the kill, measured 45-57 s here unloaded; the bound leaves the restart 60 s on a loaded machine (92 s
    was seen in CI)."""
    job = job_id("takeover")
    args = "--dataset digits --epochs 400 --batch-size 32 --log-every 10 --checkpoint-every 50"
    playbook = start_train(job, args, SIM, extra=("-e", "max_restarts=1", "-e", "min_nodes=1"))
    copies = f"{STATE}/sim-server1/workspace/jobs/{job}/output/checkpoints"
    try:
        deadline = time.monotonic() + 240
        while ".ckpt" not in on_server("sim-server1", f"ls {copies} 2>/dev/null", check=False).stdout:
            assert playbook.poll() is None, "train.yml ended before a checkpoint was copied to sim-server1"
            assert time.monotonic() < deadline, "no checkpoint copy on sim-server1 within 240 s"
            time.sleep(1)
        subprocess.run(["docker", "kill", "sim-server0"], check=True, capture_output=True)
        killed = time.time()
        output, _ = playbook.communicate(timeout=400)
    finally:
        if playbook.poll() is None:
            os.killpg(playbook.pid, signal.SIGTERM)
        subprocess.run(["docker", "start", "sim-server0"], check=True, capture_output=True)
    assert playbook.returncode == 0, output[-5000:]
    assert f"job {job}: followed to sim-server1, which took the job over" in output, output[-4000:]
    status = json.loads((RUNS / job / "status.json").read_text())
    [restart] = status["restarts"]
    assert restart["lost"] == ["sim-server0"] and restart["nodes_after"] == ["sim-server1"], restart
    assert restart["supervisor_moved"] == "sim-server0 -> sim-server1"
    again = float(restart["lost_at"]) + float(restart["training_again_s"]) - killed
    print(f"training again {again:.1f} s after sim-server0 was killed")
    assert again < 120, f"training again {again:.0f} s after sim-server0 was killed"
    assert json.loads((RUNS / job / "output" / "summary.json").read_text())["world_size"] == 1
    wait_engine("sim-server0")
