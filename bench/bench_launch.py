"""Launch overhead of train.yml next to a bare mpirun of the same job typed in node0, side by side.

The same job (digits, 2 epochs, one rank per node) both ways: train.yml -e nodes=N (plan, node checks, start,
progress, results fetched and reported) and `docker exec node0 mpirun ...` (no checks, nothing fetched). Runs
alternate (train.yml, bare, ...) so that both see the same machine load; the medians are reported, and the
difference of the wall times is the launch cost. Targets: <= 3 s for 2 nodes, <= 5 s for 8 nodes.
Brings the local cluster up to the largest node count first (site.yml with DDP_LOCAL_NODES).

    .venv/bin/python bench/bench_launch.py [--nodes 2 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
import uuid

from common import playbook, table

JOB_ARGS = "--dataset digits --epochs 2 --batch-size 32 --lr 0.05"
TARGETS = {2: 3.0, 8: 5.0}


def via_train_yml(nodes: int) -> float:
    job = f"bench-launch-{uuid.uuid4().hex[:6]}"
    wall, _, _ = playbook(
        "train.yml",
        "-e",
        f"nodes={nodes}",
        "-e",
        f"job_id={job}",
        "-e",
        f"script_args='{JOB_ARGS}'",
        nodes=nodes,
    )  # it stops the benchmark, with its output, if the job fails
    return wall


def via_bare_mpirun(nodes: int) -> float:
    out = f"/workspace/bench-bare-{uuid.uuid4().hex[:6]}"
    hosts = ",".join(f"node{index}:1" for index in range(nodes))
    command = (
        f"mpirun -H {hosts} -np {nodes} --bind-to none --mca btl_tcp_if_include eth0 "
        f"--mca oob_tcp_if_include eth0 -x MASTER_ADDR=node0 -x MASTER_PORT=29501 -x PATH "
        f"python -m ddp_cluster.train --output-dir {out} {JOB_ARGS} > /dev/null"
    )
    start = time.perf_counter()
    subprocess.run(
        ["docker", "exec", "node0", "bash", "-lc", command], capture_output=True, text=True, check=True
    )
    wall = time.perf_counter() - start
    subprocess.run(["docker", "exec", "node0", "rm", "-rf", out], check=True)
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    playbook("site.yml", nodes=max(args.nodes))
    rows = []
    for nodes in args.nodes:
        runs: dict[str, list[float]] = {"train.yml": [], "bare mpirun": []}
        for _ in range(args.repeat):
            runs["train.yml"].append(via_train_yml(nodes))
            runs["bare mpirun"].append(via_bare_mpirun(nodes))
        yml, bare = statistics.median(runs["train.yml"]), statistics.median(runs["bare mpirun"])
        target = TARGETS.get(nodes)
        verdict = "" if target is None else ("met" if yml - bare <= target else "NOT met")
        rows.append(
            (
                str(nodes),
                f"{yml:.1f}",
                f"{bare:.1f}",
                f"{yml - bare:.1f}",
                f"<= {target:g} s {verdict}" if target else "",
            )
        )
    print(table(rows, ("nodes", "train.yml s", "bare mpirun s", "launch cost s", "target")))
    print(f"\nmedians of {args.repeat}, alternating; digits, 2 epochs, one rank per node")


if __name__ == "__main__":
    main()
