"""jobs.yml -e logs=ID on 2 and 16 local nodes: how long a tail takes, and how soon a follow shows a new line.

For each node count N: the local cluster made with DDP_LOCAL_NODES=N (site.yml; the node image stays), a long
digits job detached on all N nodes (one rank per node), then, once every rank has written its log:

- ``jobs.yml -e logs=ID`` run ``--rounds`` times (the whole playbook, as a user waits for it), and the node
  side alone (``docker exec node0 python -m ddp_cluster.supervisor.logs ID``: the mesh's reads, without
  Ansible's start);
- ``jobs.yml -e logs=ID -e follow=true`` for ``--follow`` seconds: each line it shows against the moment the
  line was first seen in the rank's log file (read every 20 ms through the node's workspace on this machine),
  so the figure is an upper bound of the follow's latency;

then the job stopped with jobs.yml -e stop=ID. Last, the local cluster is brought back to 2 nodes. Targets:
the tail within 5 s on 2 nodes and 10 s on 16; a followed line within 2 s.

    .venv/bin/python bench/bench_logs.py [--nodes 16 2] [--rounds 5] [--follow 30] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from common import PLAYBOOK, REPO, table, teardown

STATE_DIR = Path("/var/lib/ddp-cluster")
JOB_ARGS = "--dataset digits --epochs 100000 --batch-size 32 --lr 0.05 --log-every 10"
LINE = re.compile(r"^\[(node\d+) rank (\d+)\] (.*)$")
TARGETS = {2: 5.0, 16: 10.0}
LATENCY = 2.0


def env(nodes: int) -> dict[str, str]:
    return os.environ | {"ANSIBLE_NOCOLOR": "1", "DDP_LOCAL_NODES": str(nodes)}


def ansible(nodes: int, *args: str, bound: int = 1800) -> tuple[float, str]:
    """ansible-playbook ARGS on N local nodes: (seconds, output); a failure stops the benchmark."""
    start = time.perf_counter()
    done = subprocess.run(
        [PLAYBOOK, *args],
        cwd=REPO,
        env=env(nodes),
        capture_output=True,
        text=True,
        timeout=bound,
        check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(
            f"ansible-playbook {' '.join(args)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
        )
    return seconds, done.stdout


def rank_log(job: str, rank: int, ranks: int) -> Path:
    """A rank's log on its node (one rank per node; Open MPI pads the number: rank.03 of 16)."""
    number = str(rank).zfill(len(str(ranks - 1)))
    return STATE_DIR / f"node{rank}" / "workspace" / "jobs" / job / "logs" / "1" / f"rank.{number}" / "stdout"


def has_line(path: Path) -> bool:
    """Whether the log has a whole line (a tail shows only those)."""
    try:
        with open(path, "rb") as handle:
            return b"\n" in handle.read(64 * 1024)
    except OSError:
        return False


def node_side(job: str) -> float:
    """The node side alone, from node0: its seconds."""
    command = f". /etc/ddp-cluster/env.sh && python -m ddp_cluster.supervisor.logs {job} --tail 20"
    start = time.perf_counter()
    done = subprocess.run(["docker", "exec", "node0", "bash", "-c", command], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the node side failed: {done.stderr[-2000:]}")
    return seconds


def follow(nodes: int, job: str, seconds: float) -> list[float]:
    """Each followed line's delay after its rank wrote it (an upper bound: first seen in the file, read
    every 20 ms)."""
    paths = {str(rank): rank_log(job, rank, nodes) for rank in range(nodes)}
    seen: dict[tuple[str, str], float] = {}
    count: dict[tuple[str, str], int] = {}  # a text written more than once (a blank line) says no time
    halt = threading.Event()

    def watch() -> None:
        offsets = {rank: path.stat().st_size for rank, path in paths.items()}
        while not halt.is_set():
            for rank, path in paths.items():
                with open(path, "rb") as handle:
                    handle.seek(offsets[rank])
                    data = handle.read()
                whole = data[: data.rfind(b"\n") + 1]
                offsets[rank] += len(whole)
                now = time.monotonic()
                for line in whole.decode("utf-8", "replace").splitlines():
                    seen.setdefault((rank, line), now)
                    count[(rank, line)] = count.get((rank, line), 0) + 1
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    args = [PLAYBOOK, "jobs.yml", "-e", f"logs={job}", "-e", "follow=true", "-e", "tail=1"]
    process = subprocess.Popen(
        args, cwd=REPO, env=env(nodes), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    shown: list[tuple[str, str, float]] = []
    stop_at = time.monotonic() + seconds
    hung = threading.Timer(seconds + 60, lambda: os.killpg(process.pid, signal.SIGKILL))  # never ends
    hung.start()
    assert process.stdout is not None
    for line in process.stdout:
        if match := LINE.match(line.rstrip("\n")):
            shown.append((match.group(2), match.group(3), time.monotonic()))
        if time.monotonic() > stop_at:
            break
    os.killpg(process.pid, signal.SIGINT)
    process.communicate(timeout=60)
    hung.cancel()
    halt.set()
    return [at - seen[(rank, text)] for rank, text, at in shown[nodes:] if count.get((rank, text)) == 1]


def stop(nodes: int, job: str) -> None:
    """jobs.yml -e stop=ID; the job must have ended (what the collect after the stop does is not measured)."""
    subprocess.run(
        [PLAYBOOK, "jobs.yml", "-e", f"stop={job}"],
        cwd=REPO,
        env=env(nodes),
        capture_output=True,
        check=False,
    )
    status = STATE_DIR / "node0" / "workspace" / "jobs" / job / "status.json"
    state = json.loads(status.read_text()).get("state") if status.is_file() else None
    if state not in ("succeeded", "failed"):
        raise SystemExit(f"jobs.yml -e stop={job} left it {state}: stop it by hand")


def measure(nodes: int, rounds: int, follow_seconds: float) -> dict[str, Any]:
    teardown(64)
    subprocess.run(["docker", "network", "rm", "ddp-cluster-local"], capture_output=True, check=False)
    ansible(nodes, "site.yml")
    job = f"bench-logs-{nodes}-{uuid.uuid4().hex[:6]}"
    ansible(nodes, "train.yml", "-e", f"nodes={nodes}", "-e", f"job_id={job}", "-e", "detach=true",
            "-e", f"script_args='{JOB_ARGS}'", "-e", "job_timeout=3600")  # fmt: skip
    try:
        # mpirun makes each rank's file at the launch, empty; a rank's first line comes a minute later on 16
        # nodes (torch's import on a shared machine): a tail before that has no line to show
        deadline = time.monotonic() + 300
        while missing := [rank for rank in range(nodes) if not has_line(rank_log(job, rank, nodes))]:
            if time.monotonic() > deadline:
                status = STATE_DIR / "node0" / "workspace" / "jobs" / job / "status.json"
                said = status.read_text()[-3000:] if status.is_file() else "no status.json on node0"
                raise SystemExit(f"ranks {missing} of {job} wrote no line within 300 s; its status:\n{said}")
            time.sleep(1)
        tails = []
        for _ in range(rounds):
            seconds, out = ansible(nodes, "jobs.yml", "-e", f"logs={job}")
            ranks = {match.group(2) for match in map(LINE.match, out.splitlines()) if match}
            if len(ranks) != nodes:
                raise SystemExit(f"jobs.yml -e logs showed {len(ranks)} of {nodes} ranks:\n{out[-3000:]}")
            tails.append(seconds)
        sides = [node_side(job) for _ in range(rounds)]
        delays = follow(nodes, job, follow_seconds)
    finally:
        stop(nodes, job)
    return {
        "nodes": nodes,
        "tail_s": tails,
        "node_side_s": sides,
        "follow_delays_s": delays,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--follow", type=float, default=30.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    found = []
    try:
        for nodes in args.nodes:
            found.append(measure(nodes, args.rounds, args.follow))
            print(json.dumps(found[-1]), flush=True)
    finally:
        if len(found) < len(args.nodes) or args.nodes[-1] != 2:  # else the last count left 2 nodes already
            teardown(64)
            ansible(2, "site.yml")
    rows = []
    for item in found:
        delays = sorted(item["follow_delays_s"]) or [float("nan")]
        target = TARGETS.get(item["nodes"])
        tail = statistics.median(item["tail_s"])
        rows.append(
            (
                str(item["nodes"]),
                f"{tail:.2f}",
                f"{min(item['tail_s']):.2f}-{max(item['tail_s']):.2f}",
                f"{statistics.median(item['node_side_s']):.2f}",
                f"{statistics.median(delays):.2f}",
                f"{delays[int(0.95 * (len(delays) - 1))]:.2f}",
                f"{delays[-1]:.2f}",
                str(len(item["follow_delays_s"])),
                ("ok" if tail <= target else "MISSED") if target else "",
            )
        )
    header = ("nodes", "tail s", "range", "node side s", "follow p50", "p95", "max", "lines", "tail target")
    print(table(rows, header))
    if args.json:
        args.json.write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main()
