#!/usr/bin/env python3
"""Unpack each node's archive of a job into runs/<job-id>/: the first node's outputs (metrics.jsonl,
summary.json, checkpoints/) at the top, every node's files under nodes/<node>/, and each rank's log, which
mpirun writes on that rank's node, copied to logs/rank.N.log.

With torchrun (or torch_npu_run) mpirun's processes are the per-node agents: their output goes to
logs/agent.N.log (N: the node's place in the job), and each worker's own log (torchrun's stdout.log, then its
stderr.log, of the last attempt) to logs/rank.R.log, R = N x processes per node + local rank.

    layout_run.py RUN_DIR FIRST_NODE NODE,NODE,... [PROCESSES_PER_NODE (torchrun only)]
"""

import re
import shutil
import sys
import tarfile
from pathlib import Path

RANK_LOG = re.compile(r"^logs/[^/]+/rank\.(\d+)/stdout$")
WORKER_LOG = re.compile(r"^logs/torchrun/[^/]+/attempt_(\d+)/(\d+)/stdout\.log$")


def worker_logs(target: Path, node_index: int, nproc: int, logs: Path) -> None:
    latest: dict[int, tuple[int, Path]] = {}
    for path in target.glob("logs/torchrun/*/attempt_*/*/stdout.log"):
        if match := WORKER_LOG.match(path.relative_to(target).as_posix()):
            attempt, local = int(match.group(1)), int(match.group(2))
            if attempt >= latest.get(local, (-1, path))[0]:
                latest[local] = (attempt, path)
    for local, (_, stdout) in sorted(latest.items()):
        stderr = stdout.with_name("stderr.log")
        text = stdout.read_bytes() + (stderr.read_bytes() if stderr.exists() else b"")
        (logs / f"rank.{node_index * nproc + local}.log").write_bytes(text)


def main(run_dir: Path, first: str, nodes: list[str], torchrun_nproc: int | None = None) -> None:
    incoming = run_dir / ".incoming"
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    for index, node in enumerate(nodes):
        archive = incoming / f"{node}.tar.gz"
        if not archive.exists():
            print(f"{node}: no archive came back", file=sys.stderr)
            continue
        target = run_dir / "nodes" / node
        with tarfile.open(archive) as tar:
            tar.extractall(target, filter="data")
        name = "agent" if torchrun_nproc else "rank"
        for path in sorted(target.rglob("*")):
            relative = path.relative_to(target).as_posix()
            if match := RANK_LOG.match(relative):
                shutil.copyfile(path, run_dir / "logs" / f"{name}.{match.group(1)}.log")
        if torchrun_nproc:
            worker_logs(target, index, torchrun_nproc, run_dir / "logs")
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
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3].split(","), int(sys.argv[4]) if len(sys.argv) > 4 else None)
