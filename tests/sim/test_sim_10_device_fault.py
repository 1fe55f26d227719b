"""A device that goes bad during a job, on the Ascend servers: the supervisor's telemetry (every 2 s here)
sees the npu-smi double report a chip's health turn from OK to Alarm on sim-server1, ends the attempt as a
device fault naming node and device, drains sim-server1 (its own /workspace/jobs/.drained, with the fault as
the reason) and restarts the job without it. The sim has two servers and so no spare: max_restarts=1 with
min_nodes=1 lets the restart go on with sim-server0 alone (with a spare in the inventory, the restart takes it
instead: the spare choice is the same as after a lost node's)."""

from __future__ import annotations

import json
import os
import signal
import time

from .conftest import RUNS, SIM_ASCEND, STATE, job_id, on_node, on_server, wait_for_progress
from conftest import PlaybookResult, start_train

FAULT = "device-fault: node sim-server1 device 1: health alarm (npu-smi)"


def test_a_device_made_unhealthy_mid_job_ends_the_attempt_drains_its_node_and_the_job_goes_on(
    ascend_cluster: PlaybookResult,
) -> None:
    job = job_id("device-fault")
    args = "--dataset digits --epochs 400 --batch-size 32 --log-every 10 --checkpoint-every 50"
    extra = ("-e", "device=cpu", "-e", "max_restarts=1", "-e", "min_nodes=1", "-e", "telemetry_interval=2")
    playbook = start_train(job, args, SIM_ASCEND, extra=extra)
    telemetry = f"{STATE}/sim-server0/workspace/jobs/{job}/telemetry/sim-server1.jsonl"
    drained_file = f"{STATE}/sim-server1/workspace/jobs/.drained"
    try:
        wait_for_progress(playbook, job, mark='"step": 5')
        # sim-server1's chips seen healthy first: the fault is a change during the job, not a node's state.
        deadline = time.monotonic() + 60
        while (
            '"health": "ok"'
            not in on_server("sim-server0", f"cat {telemetry} 2>/dev/null", check=False).stdout
        ):
            assert playbook.poll() is None, "train.yml ended before sim-server1's devices were sampled"
            assert time.monotonic() < deadline, (
                f"no sample of sim-server1's devices within 60 s ({telemetry})"
            )
            time.sleep(1)
        on_node("sim-server1", "npu-smi double-set-health -i 1 Alarm")
        output, _ = playbook.communicate(timeout=400)
    finally:
        if playbook.poll() is None:
            os.killpg(playbook.pid, signal.SIGTERM)
        drained = on_server("sim-server1", f"cat {drained_file} 2>/dev/null", check=False).stdout
        # The next tests get sim-server1 back: its chip healthy again, the node undrained.
        on_node("sim-server1", "rm -f /var/lib/ddp-doubles/state.json", check=False)
        on_server("sim-server1", f"rm -f {drained_file}", check=False)
        on_node("sim-server1", "scontrol update nodename=sim-server1 state=resume", check=False)
    assert playbook.returncode == 0, output[-5000:]
    status = json.loads((RUNS / job / "status.json").read_text())
    [restart] = status["restarts"]
    assert restart["cause"] == FAULT, restart
    assert restart["drained"] == ["sim-server1"] and restart["nodes_after"] == ["sim-server0"], restart
    record = json.loads(drained)
    assert record["node"] == "sim-server1" and record["reason"] == f"{FAULT} (job {job})", record
    assert json.loads((RUNS / job / "output" / "summary.json").read_text())["world_size"] == 1
    # The telemetry came back with the job: the chip's health over time, and the report names the problem.
    samples = [
        json.loads(line) for line in (RUNS / job / "telemetry" / "sim-server1.jsonl").read_text().splitlines()
    ]
    healths = [sample["devices"][1]["health"] for sample in samples]
    assert healths[0] == "ok" and healths[-1] == "alarm", healths
    assert (RUNS / job / "telemetry" / "sim-server0.jsonl").is_file()
    assert "device problem: sim-server1 device 1: health alarm" in output, output[-4000:]
    assert (RUNS / job / "output" / "telemetry.png").is_file()
