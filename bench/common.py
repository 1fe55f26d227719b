"""Shared helpers of the benchmarks: run a playbook and time it, print a table."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = str(REPO / ".venv" / "bin" / "ansible-playbook")


def playbook(*args: str, nodes: int = 2) -> tuple[float, int, str]:
    """Run ansible-playbook ARGS on the local inventory: (seconds, changed count summed over hosts, output)."""
    env = os.environ | {"ANSIBLE_NOCOLOR": "1", "DDP_LOCAL_NODES": str(nodes)}
    start = time.perf_counter()
    done = subprocess.run([PLAYBOOK, *args], cwd=REPO, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"ansible-playbook {' '.join(args)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    changed = sum(int(count) for count in re.findall(r"changed=(\d+)", done.stdout))
    return seconds, changed, done.stdout


def docker(*args: str, check: bool = True) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check).stdout


def teardown(nodes: int = 16) -> None:
    subprocess.run(["docker", "rm", "-f", *[f"node{i}" for i in range(nodes)]], capture_output=True, check=False)
    subprocess.run(["docker", "network", "rm", "ddp-cluster-local"], capture_output=True, check=False)
    subprocess.run(["rm", "-rf", "/var/lib/ddp-cluster"], check=False)


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
