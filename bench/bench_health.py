"""What the health gate costs, for 2 and 4 local nodes, next to the job it guards, side by side.

For each node count: site.yml brings the local cluster to that size, then, alternately, check.yml alone,
train.yml (digits, 5 epochs) and train.yml -e preflight=true, each --repeat times; medians are reported, with
the gate's own measuring time (health.json "seconds", inside the ranks), the gloo busbw it measured across all
ranks at the largest size and the median ring-pair busbw, and the ratio of a job with the gate to one without.
Target: check.yml within 15 s for 2 nodes.

    .venv/bin/python bench/bench_health.py [--repeat 3] [--nodes 2 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import uuid

from common import REPO, playbook, table

JOB_ARGS = "--dataset digits --epochs 5 --batch-size 32 --lr 0.05"


def run(kind: str, nodes: int) -> tuple[float, dict[str, object] | None]:
    job = f"bench-health-{kind}-{uuid.uuid4().hex[:6]}"
    common = ("-e", f"nodes={nodes}", "-e", f"job_id={job}")
    if kind == "check":
        wall, _, _ = playbook("check.yml", *common, nodes=nodes)
    else:
        extra = ("-e", "preflight=true") if kind == "preflight" else ()
        wall, _, _ = playbook("train.yml", *common, "-e", f"script_args='{JOB_ARGS}'", *extra, nodes=nodes)
    health = REPO / "runs" / job / "output" / "health.json"
    return wall, json.loads(health.read_text()) if health.exists() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    rows = []
    figures = []
    for nodes in args.nodes:
        playbook("site.yml", nodes=nodes)
        walls: dict[str, list[float]] = {"check": [], "train": [], "preflight": []}
        gates: list[dict[str, object]] = []
        for _ in range(args.repeat):
            for kind in walls:
                wall, health = run(kind, nodes)
                walls[kind].append(wall)
                if health is not None:
                    gates.append(health)
        check, train, preflight = (statistics.median(walls[kind]) for kind in ("check", "train", "preflight"))
        measuring = statistics.median(float(gate["seconds"]) for gate in gates)  # type: ignore[arg-type]
        busbw = statistics.median(float(gate["sweep"][-1]["busbw_gbps"]) for gate in gates)  # type: ignore[index]
        pairs = statistics.median(
            float(pair["busbw_gbps"])
            for gate in gates
            for pair in gate["pairs"]  # type: ignore[attr-defined]
        )
        rows.append(
            (
                str(nodes),
                f"{check:.1f}",
                f"{measuring:.1f}",
                f"{train:.1f}",
                f"{preflight:.1f}",
                f"{preflight / train:.2f}x",
            )
        )
        figures.append((str(nodes), f"{busbw:.3f}", f"{pairs:.3f}", str(len(gates))))
    print(
        table(
            rows,
            (
                "nodes",
                "check.yml s",
                "gate measuring s",
                "train.yml s",
                "train.yml preflight=true s",
                "with / without",
            ),
        )
    )
    print()
    print(
        table(figures, ("nodes", "all-reduce busbw GB/s (16 MiB)", "ring pair busbw GB/s (median)", "gates"))
    )
    print(f"\nmedians of {args.repeat}; target: check.yml within 15 s for 2 nodes")


if __name__ == "__main__":
    main()
