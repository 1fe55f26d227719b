"""Shared helpers of the benchmarks: run a playbook and time it, print a table."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = str(REPO / ".venv" / "bin" / "ansible-playbook")


def playbook(*args: str, nodes: int = 2) -> tuple[float, int, str]:
    """Run ansible-playbook ARGS on the local inventory: (seconds, changed count summed over hosts,
    output)."""
    env = os.environ | {"ANSIBLE_NOCOLOR": "1", "DDP_LOCAL_NODES": str(nodes)}
    start = time.perf_counter()
    done = subprocess.run([PLAYBOOK, *args], cwd=REPO, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(
            f"ansible-playbook {' '.join(args)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
        )
    changed = sum(int(count) for count in re.findall(r"changed=(\d+)", done.stdout))
    return seconds, changed, done.stdout


def docker(*args: str, check: bool = True) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check).stdout


def teardown(nodes: int = 16) -> None:
    subprocess.run(
        ["docker", "rm", "-f", *[f"node{i}" for i in range(nodes)]], capture_output=True, check=False
    )
    subprocess.run(["docker", "network", "rm", "ddp-cluster-local"], capture_output=True, check=False)
    subprocess.run(["rm", "-rf", "/var/lib/ddp-cluster"], check=False)


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


Rows = list[tuple[str, ...]]


def over_server_counts(
    description: str, bench: Callable[[int], tuple[Rows, dict[str, float]]]
) -> tuple[Rows, dict[int, dict[str, float]]]:
    """A sim benchmark's command line (--servers 2 4, --json FILE): bench(servers) for each count, in turn;
    the rows of all, and the figures per count (also written to FILE)."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument("--servers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    rows: Rows = []
    figures: dict[int, dict[str, float]] = {}
    for servers in args.servers:
        more, figures[servers] = bench(servers)
        rows += more
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return rows, figures
