#!/usr/bin/env python3
"""Unpack each node's archive of a job into runs/<job-id>/: the first node's outputs (metrics.jsonl,
summary.json, checkpoints/) at the top, every node's files under nodes/<node>/, and each rank's log, which
mpirun writes on that rank's node, copied to logs/rank.N.log.

    layout_run.py RUN_DIR FIRST_NODE NODE,NODE,...
"""

import re
import shutil
import sys
import tarfile
from pathlib import Path

RANK_LOG = re.compile(r"^logs/[^/]+/rank\.(\d+)/stdout$")


def main(run_dir: Path, first: str, nodes: list[str]) -> None:
    incoming = run_dir / ".incoming"
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    for node in nodes:
        archive = incoming / f"{node}.tar.gz"
        if not archive.exists():
            print(f"{node}: no archive came back", file=sys.stderr)
            continue
        target = run_dir / "nodes" / node
        with tarfile.open(archive) as tar:
            tar.extractall(target, filter="data")
        for path in sorted(target.rglob("*")):
            relative = path.relative_to(target).as_posix()
            if match := RANK_LOG.match(relative):
                shutil.copyfile(path, run_dir / "logs" / f"rank.{match.group(1)}.log")
        if node == first and (target / "output").is_dir():
            for item in (target / "output").iterdir():
                destination = run_dir / item.name
                if destination.exists():
                    shutil.rmtree(destination) if destination.is_dir() else destination.unlink()
                shutil.move(str(item), destination)
            (target / "output").rmdir()
        status = target / "status.json"
        if node == first and status.exists():
            shutil.copyfile(status, run_dir / "status.json")
    shutil.rmtree(incoming, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3].split(","))
