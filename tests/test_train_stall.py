"""The progress watchdog on the local cluster (2 nodes, a user's gloo script): a job whose rank 1 waits
forever outside a collective is stopped soon after its last progress, named as stalled with that rank, its
stacks kept; a job that prints nothing for longer than stall_timeout but calls ddp_cluster.heartbeat() runs to
its end."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest

from conftest import REPO, PlaybookResult, node_exec, run_playbook

RUNS = REPO / "runs"
STALL_TIMEOUT = 20
# Detection (the watch's polls, the tree's ages), the stacks' capture, the stop, then the results' collection.
ENDED_WITHIN = STALL_TIMEOUT + 30
QUIET = STALL_TIMEOUT + 15  # the heartbeat script's silence: past stall_timeout and what finding it takes
SCRIPT = f'''\
"""Trains a few steps printing each; then (stall) rank 1 waits outside any collective while rank 0 waits in a
barrier for it, or (heartbeat) every rank stays silent for {QUIET} s calling ddp_cluster.heartbeat()."""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ddp_cluster


def stuck_outside_a_collective():
    while True:
        time.sleep(3600)


def main():
    mode = sys.argv[1]
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        optimizer.zero_grad()
        model(torch.randn(16, 8)).pow(2).mean().backward()
        optimizer.step()
        print(f"stall-script rank {{rank}} step {{step}} at {{time.time():.3f}}", flush=True)
        time.sleep(0.5)
    if mode == "stall":
        if rank == 1:
            stuck_outside_a_collective()
        dist.barrier()
    quiet_until = time.time() + {QUIET}
    while time.time() < quiet_until:
        ddp_cluster.heartbeat()
        time.sleep(0.2)
    print(f"stall-script rank {{rank}} done at {{time.time():.3f}}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''
PRINTED = re.compile(r"stall-script rank (\d+) (step \d+|done) at (\d+\.\d+)")


def job_id(name: str) -> str:
    return f"test-stall-{name}-{uuid.uuid4().hex[:6]}"


def train(job: str, script: Path, mode: str, launcher: str = "mpirun") -> PlaybookResult:
    return run_playbook(
        "train.yml",
        extravars={
            "job_id": job,
            "launcher": launcher,
            "nodes": 2,
            "script": str(script),
            "script_args": mode,
            "stall_timeout": STALL_TIMEOUT,
            "stall_start_timeout": 120,
        },
    )


def printed(job: str) -> list[tuple[int, str, float]]:
    """Every (rank, what, when) line the script printed, from the job's rank logs."""
    lines = []
    for log in sorted((RUNS / job / "logs").glob("rank.*.log")):
        for match in PRINTED.finditer(log.read_text(errors="replace")):
            lines.append((int(match.group(1)), match.group(2), float(match.group(3))))
    return lines


def no_job_processes(node: str, job: str) -> bool:
    return node_exec(node, f"pgrep -af '[/]workspace/jobs/{job}/' || true").stdout.strip() == ""


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_a_stalled_job_is_stopped_naming_the_rank_outside_a_collective_its_stacks_kept(
    local_cluster: PlaybookResult, tmp_path: Path, launcher: str
) -> None:
    script = tmp_path / "stall_script.py"
    script.write_text(SCRIPT)
    job = job_id(f"stuck-{launcher}")
    result = train(job, script, "stall", launcher)
    ended = time.time()
    out = result.stdout
    assert result.rc != 0, out[-4000:]
    lines = printed(job)
    assert {(rank, what) for rank, what, _ in lines} >= {(0, "step 4"), (1, "step 4")}, lines
    last_progress = max(when for _, _, when in lines)
    took = ended - last_progress
    assert took < ENDED_WITHIN, f"train.yml ended {took:.0f} s after the last progress"
    assert f"stall_timeout={STALL_TIMEOUT}" in out, out[-4000:]
    assert "not in a collective: rank 1 on node1" in out, out[-4000:]
    status = json.loads((RUNS / job / "status.json").read_text())
    assert f"stall_timeout={STALL_TIMEOUT}" in status["reason"] and "rank 1 on node1" in status["reason"]
    assert "rank 0" not in status["reason"].split("not in a collective:")[1].split(";")[0], status["reason"]
    # The stacks, brought to the first node and collected with it: rank 1 where it waits, rank 0 in a barrier.
    stacks = RUNS / job / "nodes" / "node0" / "stacks"
    assert "stuck_outside_a_collective" in (stacks / "node1" / "rank.1.txt").read_text()
    assert "in barrier" in (stacks / "node0" / "rank.0.txt").read_text()
    assert no_job_processes("node0", job) and no_job_processes("node1", job)


def test_a_script_that_calls_heartbeat_while_silent_is_not_stopped(
    local_cluster: PlaybookResult, tmp_path: Path
) -> None:
    script = tmp_path / "stall_script.py"
    script.write_text(SCRIPT)
    job = job_id("heartbeat")
    result = train(job, script, "heartbeat")
    assert result.rc == 0, result.stdout[-4000:]
    lines = printed(job)
    for rank in (0, 1):
        steps = [when for who, what, when in lines if who == rank and what.startswith("step")]
        done = [when for who, what, when in lines if who == rank and what == "done"]
        assert steps and done, lines
        assert done[0] - max(steps) > STALL_TIMEOUT + 10, "the script was not silent for long"
