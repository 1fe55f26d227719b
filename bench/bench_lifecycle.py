"""A job's lifecycle, on the local inventory with 3 nodes (node2 the spare of a 2-node job):

* detach: train.yml -e detach=true's wall time, and its return after every rank ran (target: within 10 s);
* jobs.yml on 2 nodes (target: within 5 s), median of --repeat runs;
* recovery: a 2-node digits job with max_restarts=1 and --checkpoint-every 50, node1 killed mid-job: the
  seconds from the kill to training again on node0 + node2 (target 60 s), the steps redone, and the final
  accuracy against the same job undisturbed, run side by side (target: within 0.02).

Brings the 3 nodes up first (site.yml with DDP_LOCAL_NODES=3) and again after the kill.

    .venv/bin/python bench/bench_lifecycle.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import time
import uuid
from pathlib import Path

from common import PLAYBOOK, REPO, docker, playbook, table

JOB_ARGS = "--dataset digits --epochs 200 --batch-size 32 --lr 0.05 --log-every 10 --checkpoint-every 50"
JOBS = Path("/var/lib/ddp-cluster/node0/workspace/jobs")


def status(job: str) -> dict[str, object]:
    try:
        return dict(json.loads((JOBS / job / "status.json").read_text()))
    except (OSError, ValueError):
        return {}


def detach(repeat: int) -> tuple[list[float], list[float]]:
    """train.yml -e detach=true: its wall time, and the supervisor's time from its start (files handed out,
    launcher started, every rank seen running) to the status the playbook returned on."""
    walls, after = [], []
    for _ in range(repeat):
        job = f"bench-detach-{uuid.uuid4().hex[:6]}"
        wall, _, _ = playbook(
            "train.yml", "-e", "nodes=2", "-e", f"job_id={job}", "-e", "detach=true",
            "-e", "script_args='--dataset digits --epochs 100'", nodes=3,
        )  # fmt: skip
        found = status(job)
        walls.append(wall)
        after.append(float(found.get("elapsed") or 0))
        playbook("jobs.yml", "-e", f"stop={job}", nodes=3)
    return walls, after


def recovery() -> dict[str, float]:
    reference = f"bench-undisturbed-{uuid.uuid4().hex[:6]}"
    asked = ["-e", "nodes=2", "-e", f"script_args='{JOB_ARGS}'"]
    playbook("train.yml", *asked, "-e", f"job_id={reference}", nodes=3)
    expected = json.loads((REPO / "runs" / reference / "output" / "summary.json").read_text())["accuracy"]
    job = f"bench-restart-{uuid.uuid4().hex[:6]}"
    args = [*asked, "-e", f"job_id={job}", "-e", "max_restarts=1"]
    env = os.environ | {"ANSIBLE_NOCOLOR": "1", "DDP_LOCAL_NODES": "3"}
    proc = subprocess.Popen(
        [PLAYBOOK, "train.yml", *args], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    while True:
        progress = status(job).get("progress")
        if isinstance(progress, dict) and int(progress.get("step", 0)) > 1000:
            break
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit(f"job {job} made no progress")
        time.sleep(0.2)
    docker("kill", "node1")
    killed = time.time()
    output, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"the restarted job failed:\n{output[-4000:]}")
    restart = json.loads((REPO / "runs" / job / "status.json").read_text())["restarts"][0]
    accuracy = json.loads((REPO / "runs" / job / "output" / "summary.json").read_text())["accuracy"]
    return {
        "found_s": float(restart["lost_at"]) - killed,
        "training_again_s": float(restart["lost_at"]) + float(restart["training_again_s"]) - killed,
        "steps_redone": float(restart["steps_redone"]),
        "accuracy": accuracy,
        "undisturbed_accuracy": expected,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    playbook("site.yml", nodes=3)
    walls, before = detach(args.repeat)
    listed = [playbook("jobs.yml", nodes=2)[0] for _ in range(args.repeat)]
    found = recovery()
    playbook("site.yml", nodes=3)  # node1 back
    rows = [
        ("detach: train.yml wall s (all of it)", f"{statistics.median(walls):.1f}", "<= 10 after ranks run"),
        ("detach: supervisor's start -> every rank runs s", f"{statistics.median(before):.1f}", "-"),
        ("jobs.yml on 2 nodes s", f"{statistics.median(listed):.1f}", "<= 5"),
        ("node1 killed -> found s", f"{found['found_s']:.1f}", "-"),
        ("node1 killed -> training again on node0+node2 s", f"{found['training_again_s']:.1f}", "<= 60"),
        ("steps redone (--checkpoint-every 50)", f"{found['steps_redone']:.0f}", "<= 50"),
        ("final accuracy, restarted / undisturbed",
         f"{found['accuracy']:.4f} / {found['undisturbed_accuracy']:.4f}", "within 0.02"),
    ]  # fmt: skip
    print(table(rows, ("measure", "value", "target")))
    signal.signal(signal.SIGINT, signal.SIG_DFL)


if __name__ == "__main__":
    main()
