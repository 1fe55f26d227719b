"""The supervisor's liveness watch on 16 local nodes: what it costs the first node, and how soon a dead node
is named, with the node killed one level down the tree (a child of the first node) and two levels down.

For each case: site.yml brings the local cluster to --nodes nodes, train.yml starts a long synthetic job, and
once every rank trains, node0's ssh sessions of the watch are counted (``ssh ...
ddp_cluster.supervisor.liveness``,
sampled for --sample seconds) next to what the earlier design needed (one ssh login to every other node every
3 s), then the node is killed (docker kill) and the time until train.yml fails naming it is measured. Target:
named within 60 s; node0's sessions do not grow with the node count.

    .venv/bin/python bench/bench_liveness.py [--nodes 16] [--sample 15]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from common import PLAYBOOK, REPO, docker, playbook, table

sys.path.insert(0, str(REPO / "python" / "src"))
from ddp_cluster.supervisor.liveness import children, depth

JOB_ARGS = "--dataset synthetic --synthetic-samples 400000 --epochs 50 --batch-size 64 --log-every 50"


def sessions_on_node0() -> int:
    out = docker(
        "exec", "node0", "pgrep", "-c", "-f", "^ssh .*ddp_cluster.supervisor.liveness", check=False
    ).strip()
    return int(out or 0)


def run_case(nodes: int, victim: int, sample: float) -> tuple[str, ...]:
    job = f"bench-liveness-{uuid.uuid4().hex[:6]}"
    env = os.environ | {"ANSIBLE_NOCOLOR": "1", "DDP_LOCAL_NODES": str(nodes)}
    argv = [
        PLAYBOOK,
        "train.yml",
        "-e",
        f"nodes={nodes}",
        "-e",
        f"job_id={job}",
        "-e",
        f"script_args='{JOB_ARGS}'",
    ]
    train = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    metrics = Path(f"/var/lib/ddp-cluster/node0/workspace/jobs/{job}/output/metrics.jsonl")
    deadline = time.monotonic() + 600
    while not (metrics.exists() and metrics.stat().st_size > 0):
        if train.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the job did not start training:\n{train.communicate()[0][-3000:]}")
        time.sleep(1)
    counts = []
    end = time.monotonic() + sample
    while time.monotonic() < end:
        counts.append(sessions_on_node0())
        time.sleep(1)
    name = f"node{victim}"
    docker("kill", name)
    killed = time.monotonic()
    output, _ = train.communicate(timeout=600)
    took = time.monotonic() - killed
    named = f"node {name} stopped answering ssh" in output
    level = depth(victim + 1) if victim else 0
    return (
        str(nodes),
        f"{name} (level {level})",
        f"{min(counts)}-{max(counts)}",
        f"{(nodes - 1) / 3:.1f}",
        f"{took:.1f}",
        "yes" if named else "NO",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--sample", type=float, default=15.0)
    args = parser.parse_args()
    first_child = children(0, args.nodes)[-1]
    grandchild = children(first_child, args.nodes)[0] if children(first_child, args.nodes) else args.nodes - 1
    rows = []
    for victim in (first_child, grandchild):
        playbook("site.yml", nodes=args.nodes)
        rows.append(run_case(args.nodes, victim, args.sample))
    playbook("site.yml", nodes=args.nodes)
    header = (
        "nodes",
        "killed",
        "node0 watch sessions",
        "earlier design: ssh logins/s from node0",
        "s to fail naming it",
        "named",
    )
    print(table(rows, header))
    print(
        "\ntarget: a dead node named within 60 s; "
        "node0's sessions do not grow with the node count (4 = fanout)"
    )


if __name__ == "__main__":
    main()
