"""jobs.yml -e sync=ID: the bytes and seconds of a first sync, of a second one right after it, and of one
after the job wrote for a while. Target: a second sync moves (almost) nothing; one after a while only what
the job appended.

Two ways, side by side in one run:
- ``cluster`` (default): the local cluster (site.yml's, --nodes nodes), a detached digits job, then
  ``jobs.yml -e sync=ID`` three times (the second at once, the third after --wait seconds); the figures are
  the ones the sync prints (files, bytes of files, bytes packed, bytes asked and answered) and the
  playbook's wall time. The job is stopped (jobs.yml -e stop=ID) at the end.
- ``--in-process``: no cluster; a node's job directory in a temporary folder (metrics.jsonl, two rank logs,
  an event file, telemetry; --mb MiB in all), the node side and the controller's merge called directly,
  the appends made between the syncs.

    .venv/bin/python bench/bench_sync.py [--nodes 2] [--wait 10]
    .venv/bin/python bench/bench_sync.py --in-process [--mb 64]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import REPO, playbook, table

sys.path.insert(0, str(REPO / "python" / "src"))
from ddp_cluster.job import sync
from ddp_cluster.job.transport import Done
from ddp_cluster.supervisor import sync as node_sync
from ddp_cluster.supervisor.remote import Mesh

# A job that writes little between two syncs (a metrics line and an event per 1000 steps, about one every 2 s
# here): what a second sync moves besides the job's own writes. tests/test_jobs_sync.py's digits job writes
# about 25 kB/s (a metrics line, an event and a log line every 10 steps), all of which a sync then brings.
JOB_ARGS = "--dataset synthetic --synthetic-samples 400000 --epochs 50 --batch-size 64 --log-every 1000"
BROUGHT = re.compile(r"brought (\d+) file\(s\), (\d+) bytes \((\d+) bytes packed, (\d+) bytes answered\)")
NOTHING = re.compile(r"nothing changed since the last sync \((\d+) bytes asked and answered\)")
HEADER = ("way", "sync", "files", "bytes", "packed", "asked+answered", "seconds")


def figures(output: str) -> tuple[str, str, str, str]:
    if found := BROUGHT.search(output):
        return found.group(1), found.group(2), found.group(3), found.group(4)
    if found := NOTHING.search(output):
        return "0", "0", "0", found.group(1)
    raise SystemExit(f"no sync line in:\n{output[-3000:]}")


def on_cluster(nodes: int, wait: float) -> list[tuple[str, ...]]:
    job = f"bench-sync-{uuid.uuid4().hex[:6]}"
    started = ("-e", f"job_id={job}", "-e", f"nodes={nodes}", "-e", "detach=true")
    playbook("train.yml", *started, "-e", f"script_args='{JOB_ARGS}'", nodes=nodes)
    metrics = Path(f"/var/lib/ddp-cluster/node0/workspace/jobs/{job}/output/metrics.jsonl")
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.stat().st_size > 0):
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job} wrote no metrics within 300 s")
        time.sleep(1)
    rows: list[tuple[str, ...]] = []
    try:
        for label, pause in (("first", 0.0), ("second, at once", 0.0), (f"after {wait:.0f} s", wait)):
            time.sleep(pause)
            seconds, _, output = playbook("jobs.yml", "-e", f"sync={job}", nodes=nodes)
            rows.append((f"cluster ({nodes} nodes)", label, *figures(output), f"{seconds:.1f}"))
    finally:
        try:
            playbook("jobs.yml", "-e", f"stop={job}", nodes=nodes)
        except SystemExit as error:  # the figures stand; the stop's failure is said after them
            print(str(error)[-2000:], file=sys.stderr)
    return rows


class InProcess:
    """The entry node's server for :func:`ddp_cluster.job.sync.sync`: the node side called here."""

    def __init__(self, jobs_dir: Path) -> None:
        self.jobs_dir = jobs_dir
        self.request = ""

    def put(self, local: str) -> str:
        self.request = Path(local).read_text()
        return local

    def run(self, command: str) -> Done:
        answer = node_sync.gather(
            "bench", str(self.jobs_dir), json.loads(self.request), Mesh("node0"), ["node0"], False
        )
        return Done(0, json.dumps(answer) + "\n")

    def close(self) -> None:
        pass


def in_process(mb: int) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        job = root / "workspace" / "jobs" / "bench"
        spec = {
            "id": "bench",
            "job_dir": "/workspace/jobs/bench",
            "nodes": ["node0"],
            "nproc_per_node": 2,
            "launcher": "mpirun",
            "device": "cpu",
            "networks": ["10.0.0.0/24"],
            "timeout": 600,
        }
        (job / "output" / "tensorboard").mkdir(parents=True)
        (job / "telemetry").mkdir()
        (job / "job.json").write_text(json.dumps(spec))
        share = (mb << 20) // 5
        line = (
            b'{"kind": "step", "step": 123456, "epoch": 12, "loss": 0.123456789, "samples_per_s": 1234.5}\n'
        )
        files = {
            job / "output" / "metrics.jsonl": line,
            job / "output" / "tensorboard" / "events.out.tfevents.1": b"\0\x12event\x01" * 10,
            job / "telemetry" / "node0.jsonl": b'{"time": 1, "node": "node0", "devices": []}\n',
        }
        for rank in (0, 1):
            log = job / "logs" / "1" / f"rank.{rank}" / "stdout"
            log.parent.mkdir(parents=True)
            files[log] = b"[rank] epoch 12 step 123456 loss 0.1234 samples/s 1234.5\n"
        for path, unit in files.items():
            path.write_bytes(unit * (share // len(unit)))
        node_sync.BUDGET = max(node_sync.BUDGET, 2 * (mb << 20))
        transport = InProcess(job.parent)
        run_dir = root / "runs" / "bench"
        for label in ("first", "second, at once", "after appends"):
            if label == "after appends":  # what ~10 s of a job writes: 100 metrics lines, logs, an event
                for path, unit in files.items():
                    with open(path, "ab") as handle:
                        handle.write(unit * 100)
            started = time.perf_counter()
            done = sync.sync(transport, "node0", str(job.parent), "bench", run_dir)
            seconds = time.perf_counter() - started
            row = (str(done.files), str(done.bytes), str(done.packed), str(done.answer), f"{seconds:.2f}")
            rows.append((f"in-process ({mb} MiB)", label, *row))
        metrics = job / "output" / "metrics.jsonl"
        assert os.path.getsize(run_dir / "output" / "metrics.jsonl") == os.path.getsize(metrics)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--wait", type=float, default=10.0, help="seconds before the third sync")
    parser.add_argument("--in-process", action="store_true", help="no cluster: the node side called here")
    parser.add_argument("--mb", type=int, default=64, help="--in-process: MiB of the job's files")
    args = parser.parse_args()
    rows = in_process(args.mb) if args.in_process else on_cluster(args.nodes, args.wait)
    print(table(rows, HEADER))


if __name__ == "__main__":
    main()
