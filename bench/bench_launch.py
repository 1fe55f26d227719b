"""Launch overhead of train.yml next to a bare mpirun of the same job from inside node0, side by side.

overhead = wall time - the training time that summary.json reports. Runs alternate (train.yml, bare, ...) so
that both see the same machine load; the median of each is reported. Target: train.yml's overhead is under
10 s more than bare mpirun's, for 2 nodes. Needs the local cluster up (site.yml).

    .venv/bin/python bench/bench_launch.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
import uuid

from common import REPO, playbook, table

JOB_ARGS = "--dataset digits --epochs 5 --batch-size 32 --lr 0.05"


def via_train_yml() -> tuple[float, float]:
    job = f"bench-launch-{uuid.uuid4().hex[:6]}"
    wall, _, _ = playbook("train.yml", "-e", "nodes=2", "-e", f"job_id={job}", "-e", f"script_args='{JOB_ARGS}'")
    summary = json.loads((REPO / "runs" / job / "summary.json").read_text())
    return wall, float(summary["seconds"])


def via_bare_mpirun() -> tuple[float, float]:
    out = f"/workspace/bench-bare-{uuid.uuid4().hex[:6]}"
    command = (
        f"mpirun -H node0:1,node1:1 -np 2 --bind-to none --mca btl_tcp_if_include eth0 "
        f"--mca oob_tcp_if_include eth0 -x MASTER_ADDR=node0 -x MASTER_PORT=29501 -x PATH "
        f"python -m ddp_cluster.train --output-dir {out} {JOB_ARGS} > /dev/null && cat {out}/summary.json"
    )
    start = time.perf_counter()
    argv = ["docker", "exec", "node0", "bash", "-lc", command]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    subprocess.run(["docker", "exec", "node0", "rm", "-rf", out], check=True)
    return wall, float(json.loads(done.stdout)["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {"train.yml": [], "bare mpirun": []}
    for _ in range(args.repeat):
        results["train.yml"].append(via_train_yml())
        results["bare mpirun"].append(via_bare_mpirun())
    rows = []
    overhead = {}
    for name, runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        trained = statistics.median(t for _, t in runs)
        overhead[name] = statistics.median(w - t for w, t in runs)
        rows.append((name, f"{wall:.1f}", f"{trained:.1f}", f"{overhead[name]:.1f}"))
    print(table(rows, ("launch (2 nodes, digits 5 epochs)", "wall s", "training s", "overhead s")))
    extra = overhead["train.yml"] - overhead["bare mpirun"]
    print(f"\ntrain.yml costs {extra:.1f} s more than bare mpirun (target: under 10 s); median of {args.repeat}")


if __name__ == "__main__":
    main()
