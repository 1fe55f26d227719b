"""Per-node cost of each stage, from 2 to 32 local nodes and 2 to 8 simulated servers: site.yml (bring-up and
warm), a job's launch and its results fetch, the liveness watch on node0, a stop, check.yml.

Local, for each node count N, ascending: the cluster torn down (containers, network, node state; the node
image stays: it is built once per cluster, not per node, and bench_site.py measures the cold build), then
site.yml from no containers (bring-up) and again (warm: any changed task stops the benchmark); train.yml -e
nodes=N with a short job (digits, 1 epoch, one rank per node), its results fetch timed by Ansible's
profile_tasks (the collect task); a long synthetic job started with -e detach=true (train.yml returns once
every rank runs), node0's liveness watch sampled while it trains (its ssh sessions; the CPU time, from node0's
/proc, of those sessions and of the supervisor, whose reader threads are the rest of the watch), the job
stopped with jobs.yml -e stop=ID; check.yml -e nodes=N. Then the local cluster is brought back to 2 nodes.
Sim, for each server count: scripts/sim.sh up (bare servers: no image, no container), site.yml (bring-up: the
hosts prepared, the node image shipped from the controller's registry, containers, mesh) and again (warm),
train.yml and check.yml as above, scripts/sim.sh down.

Each stage's figure at each count, with a least-squares fit figure = fixed + per_node x N, as a table and a
plot (--png). Targets: local bring-up 16 / 2 nodes <= 3x, warm <= 2x. Needs what `make bench` needs (the base
image, the controller's registry for the sim).

    .venv/bin/python bench/bench_scale.py [--local 2 4 8 16 32] [--sim 2 4 8 | --no-sim] [--sample 30]
                                          [--json FILE] [--png bench/scale.png] [--from-json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import PLAYBOOK, REPO, table, teardown

LOCAL_MAX = 64  # the local inventory's most nodes: the teardown removes the cluster whatever its size was
SHORT_JOB = "--dataset digits --epochs 1 --batch-size 32 --lr 0.05"
LONG_JOB = "--dataset synthetic --synthetic-samples 400000 --epochs 50 --batch-size 64 --log-every 50"
LONG_JOB_TIMEOUT = 1200  # the long job ends itself by then, should the benchmark stop before it stops it
FETCH_TASK = "Bring each node's results to the controller"  # roles/ddp_job/tasks/main.yml's collect task
PROFILE = {  # ansible.cfg's own callback (Ctrl-C) stays; profile_tasks prints each task's seconds at the end
    "ANSIBLE_CALLBACKS_ENABLED": "ddp_job_interrupt,ansible.posix.profile_tasks",
    "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all",
    "PROFILE_TASKS_SORT_ORDER": "none",
}
BOUND = {"site.yml": 2400, "train.yml": 1200, "check.yml": 900, "jobs.yml": 600}
# node0's processes of the watch: its ssh sessions to its children, and the supervisor (kind utime stime pid).
NODE0_PROCESSES = (
    "for p in $(pgrep -f '^ssh .*ddp_cluster[.]liveness'); do echo ssh $(cut -d' ' -f14,15 /proc/$p/stat) $p;"
    " done 2>/dev/null; for p in $(pgrep -f 'ddp_cluster[.]supervise --job-dir'); do"
    " echo supervisor $(cut -d' ' -f14,15 /proc/$p/stat) $p; done 2>/dev/null"
)
STAGES: dict[str, tuple[str, str]] = {  # key (in --json): label, unit
    "bring_up": ("site.yml bring-up (from no containers)", "s"),
    "warm": ("site.yml warm (changed=0)", "s"),
    "train": ("train.yml, digits 1 epoch", "s"),
    "job": ("  job on the cluster (status.json elapsed)", "s"),
    "training": ("  training loop (summary.json seconds)", "s"),
    "fetch": ("  results fetch (collect task)", "s"),
    "running": ("train.yml detach=true: every rank runs", "s"),
    "sessions": ("node0 watch: ssh sessions (most seen)", "count"),
    "watch_cpu": ("node0 watch: its ssh sessions' CPU", "% core"),
    "supervisor_cpu": ("node0 supervisor's CPU (watch readers too)", "% core"),
    "stop": ("jobs.yml -e stop=ID (stop, fetch, report)", "s"),
    "stop_fetch": ("  its results fetch (collect task)", "s"),
    "check": ("check.yml", "s"),
    "gate": ("  gate measuring (health.json seconds)", "s"),
}
WALL = ("bring_up", "warm", "train", "fetch", "running", "stop", "check")  # the plot's left panel
WATCH = ("sessions", "watch_cpu", "supervisor_cpu")  # its right panel
TARGETS = (("bring_up", 3.0), ("warm", 2.0))  # local, 16 nodes / 2 nodes

Figures = dict[str, dict[str, dict[int, float]]]  # cluster ("local", "sim") -> stage -> count -> value
Note = Callable[[str, Any], None]
Run = tuple[float, int, str]  # seconds, changed (summed over hosts), output


def ansible(
    *args: str, nodes: int = 2, sim: int = 0, profile: bool = False, bound: int = 0, verdict: str = ""
) -> Run:
    """ansible-playbook ARGS (the playbook first), within a bound, on the local inventory with
    DDP_LOCAL_NODES=nodes, or on `sim` servers (inventories/sim, and build/sim/hosts.yml beyond two). A
    failure, or the bound passed, stops the benchmark with the output's tail; a failure whose output holds
    `verdict` (the health gate's own FAILED verdict: it measured and judged) is a measurement like another."""
    inventory = ["-i", "inventories/sim", *(["-i", "build/sim/hosts.yml"] if sim > 2 else [])] if sim else []
    env = os.environ | {"ANSIBLE_NOCOLOR": "1", "DDP_LOCAL_NODES": str(nodes)} | (PROFILE if profile else {})
    bound = bound or BOUND[args[0]]
    start = time.perf_counter()
    with subprocess.Popen([PLAYBOOK, *inventory, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as process:  # fmt: skip
        try:
            out, err = process.communicate(timeout=bound)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            raise SystemExit(
                f"ansible-playbook {' '.join(args)} ran past {bound} s (killed; a job it started may still"
                f" run: ansible-playbook jobs.yml lists it):\n{out[-4000:]}\n{err[-2000:]}"
            ) from None
    seconds = time.perf_counter() - start
    if process.returncode != 0 and verdict and verdict in out:
        print(f"  ({args[0]} ran to its verdict: {verdict})", flush=True)
    elif process.returncode != 0:
        raise SystemExit(f"ansible-playbook {' '.join(args)} failed:\n{out[-4000:]}\n{err[-2000:]}")
    return seconds, sum(int(count) for count in re.findall(r"changed=(\d+)", out)), out


def task_seconds(out: str, task: str) -> float | None:
    """A task's seconds in profile_tasks' recap (start to the next task's start), summed over its runs."""
    recap = out.rpartition("TASKS RECAP")[2]
    found = [
        float(m) for line in recap.splitlines() if task in line for m in re.findall(r"(\d+\.\d+)s\s*$", line)
    ]
    return sum(found) if found else None


def run_file(job: str, name: str) -> dict[str, Any]:
    # the controller's own status.json is the run's; what the job wrote is under its output/
    path = REPO / "runs" / job / (name if name == "status.json" else f"output/{name}")
    return dict(json.loads(path.read_text())) if path.is_file() else {}


def job_id(kind: str, count: int) -> str:
    return f"bench-scale-{kind}-{count}-{uuid.uuid4().hex[:6]}"


def site(note: Note, nodes: int = 2, sim: int = 0) -> None:
    """site.yml from no containers, then again: it must change nothing."""
    note("bring_up", ansible("site.yml", nodes=nodes, sim=sim)[0])
    seconds, changed, out = ansible("site.yml", nodes=nodes, sim=sim)
    if changed:
        raise SystemExit(f"site.yml's warm re-run changed {changed} task(s):\n{out[-4000:]}")
    note("warm", seconds)


def short_job(note: Note, count: int, sim: int = 0) -> None:
    job = job_id("train", count)
    seconds, _, out = ansible(
        "train.yml",
        *("-e", f"nodes={count}", "-e", f"job_id={job}", "-e", f"script_args='{SHORT_JOB}'"),
        nodes=count,
        sim=sim,
        profile=True,
    )
    note("train", seconds)
    note("job", run_file(job, "status.json").get("elapsed"))
    note("training", run_file(job, "summary.json").get("seconds"))
    note("fetch", task_seconds(out, FETCH_TASK))


def gate(note: Note, count: int, sim: int = 0) -> None:
    job = job_id("check", count)
    # On this machine every node shares 2 cores: the gate may judge a node slow, which is its verdict to give.
    seconds, _, _ = ansible(
        "check.yml",
        "-e",
        f"nodes={count}",
        "-e",
        f"job_id={job}",
        nodes=count,
        sim=sim,
        verdict="health gate FAILED",
    )
    note("check", seconds)
    note("gate", run_file(job, "health.json").get("seconds"))


def node0_processes() -> dict[tuple[str, str], int]:
    """node0's watch sessions and supervisor: (kind, pid) -> CPU ticks (user + system) so far."""
    command = ["docker", "exec", "node0", "sh", "-c", NODE0_PROCESSES]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False).stdout
    except subprocess.TimeoutExpired:
        raise SystemExit("docker exec node0 did not answer within 60 s") from None
    found = {}
    for fields in (line.split() for line in out.splitlines()):
        # a process gone between pgrep and cut leaves a short line
        if len(fields) == 4 and fields[1].isdigit() and fields[2].isdigit():
            found[(fields[0], fields[3])] = int(fields[1]) + int(fields[2])
    return found


def liveness(note: Note, count: int, sample: float) -> None:
    """A long job detached; node0's watch sampled once it trains; then the job stopped with jobs.yml."""
    job = job_id("watch", count)
    seconds, _, out = ansible(
        "train.yml",
        *("-e", f"nodes={count}", "-e", f"job_id={job}", "-e", "detach=true"),
        *("-e", f"job_timeout={LONG_JOB_TIMEOUT}", "-e", f"script_args='{LONG_JOB}'"),
        nodes=count,
        bound=600,  # detach waits at most 120 s for the ranks; past that train.yml follows the job to its end
    )
    if "detached: every rank runs" not in out:
        raise SystemExit(f"train.yml -e detach=true did not detach ({count} nodes):\n{out[-4000:]}")
    note("running", seconds)
    metrics = Path(f"/var/lib/ddp-cluster/node0/workspace/jobs/{job}/output/metrics.jsonl")
    deadline = time.monotonic() + 600
    while not (metrics.is_file() and metrics.stat().st_size > 0):
        if time.monotonic() > deadline:
            raise SystemExit(
                f"job {job} did not train within 600 s (it ends by job_timeout={LONG_JOB_TIMEOUT})"
            )
        time.sleep(1)
    before, start, sessions = node0_processes(), time.monotonic(), []
    while True:
        time.sleep(2)
        after = node0_processes()
        sessions.append(sum(kind == "ssh" for kind, _ in after))
        if time.monotonic() - start >= sample:
            break
    took, tick = time.monotonic() - start, os.sysconf("SC_CLK_TCK")
    for stage, kind in (("watch_cpu", "ssh"), ("supervisor_cpu", "supervisor")):
        ticks = sum(value - before.get(key, 0) for key, value in after.items() if key[0] == kind)
        note(stage, 100 * ticks / tick / took)
    print(f"  node0 watch sessions over {took:.0f} s: {min(sessions)}-{max(sessions)}", flush=True)
    note("sessions", max(sessions))
    seconds, _, out = ansible("jobs.yml", "-e", f"stop={job}", nodes=count, profile=True)
    note("stop", seconds)
    note("stop_fetch", task_seconds(out, FETCH_TASK))


def sim(action: str, servers: int) -> None:
    env = os.environ | {"SIM_SERVERS": str(servers), "PYTHON": str(REPO / ".venv" / "bin" / "python")}
    try:  # the first `up` builds the sim's images (minutes); later ones find them cached
        done = subprocess.run(["scripts/sim.sh", action], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=1800)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise SystemExit(f"scripts/sim.sh {action} ran past 1800 s") from None
    if done.returncode != 0:
        raise SystemExit(f"scripts/sim.sh {action} failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    if action == "down":  # Ansible's persistent ssh connections to the servers' addresses go with them
        shutil.rmtree(Path.home() / ".ansible" / "cp", ignore_errors=True)


def measure(args: argparse.Namespace) -> Figures:
    figures: Figures = {"local": {}, "sim": {}}

    def noter(cluster: str, count: int) -> Note:
        def note(stage: str, value: Any) -> None:
            label, unit = STAGES[stage]
            if value is None:
                print(f"{cluster} {count}: {label.strip()}: not recorded", flush=True)
                return
            figures[cluster].setdefault(stage, {})[count] = float(value)
            print(f"{cluster} {count}: {label.strip()}: {float(value):.2f} {unit}", flush=True)
            if args.json:  # as it comes: a later failure keeps what was measured
                save(figures, args.json)

        return note

    for nodes in args.local:
        note = noter("local", nodes)
        teardown(LOCAL_MAX)
        site(note, nodes=nodes)
        short_job(note, nodes)
        liveness(note, nodes, args.sample)
        gate(note, nodes)
    if args.local:
        teardown(LOCAL_MAX)
        ansible("site.yml", nodes=2)
    for servers in args.sim:
        note = noter("sim", servers)
        sim("down", servers)
        sim("up", servers)
        site(note, sim=servers)
        short_job(note, servers, sim=servers)
        gate(note, servers, sim=servers)
        sim("down", servers)
    return figures


def save(figures: Figures, path: Path) -> None:
    path.write_text(json.dumps(figures, indent=2) + "\n")


def load(path: Path) -> Figures:
    data = json.loads(path.read_text())
    return {
        cluster: {stage: {int(n): float(v) for n, v in points.items()} for stage, points in stages.items()}
        for cluster, stages in data.items()
    }


def fit(points: dict[int, float]) -> tuple[float, float] | None:
    """fixed, per_node of the least-squares line through the points (None below two counts)."""
    if len(points) < 2:
        return None
    slope, intercept = statistics.linear_regression(list(points), list(points.values()))
    return intercept, slope


def report(figures: Figures) -> str:
    counts = sorted({n for stages in figures.values() for points in stages.values() for n in points})
    rows = []
    for cluster, stages in figures.items():
        for stage, (label, unit) in STAGES.items():
            points = stages.get(stage)
            if not points:
                continue
            line = fit(points)
            cells = (f"{points[n]:.1f}" if n in points else "" for n in counts)
            fitted = (f"{line[0]:.2f}", f"{line[1]:.3f}") if line else ("", "")
            rows.append((cluster, label, unit, *cells, *fitted))
    header = ("cluster", "stage", "unit", *(f"N={n}" for n in counts), "fixed", "per node")
    lines = [table(rows, header), "", "N: nodes (local) or servers (sim); fit: figure = fixed + per node x N"]
    for stage, target in TARGETS:
        points = figures.get("local", {}).get(stage, {})
        if 2 in points and 16 in points:
            ratio = points[16] / points[2]
            verdict = "met" if ratio <= target else "NOT met"
            lines.append(
                f"local {STAGES[stage][0]}, 16 / 2 nodes: {ratio:.2f}x (target <= {target:g}x: {verdict})"
            )
    return "\n".join(lines)


MODEL_SIZES = (128, 1152)  # docs/scale.md's two cluster sizes


def model(figures: Figures) -> str:
    """Each stage's time at MODEL_SIZES servers, extrapolated along its fitted line: from the sim's servers
    where measured, else from the local nodes. Every server here shares this machine's 2 cores with the
    controller, so the per-node figure holds the servers' own work too: on a cluster (the servers' work in
    parallel on their own CPUs) it is an upper bound of the controller's share, which docs/scale.md models
    stage by stage."""
    rows = []
    for stage, (label, unit) in STAGES.items():
        if unit != "s":
            continue
        for cluster in ("sim", "local"):
            line = fit(figures.get(cluster, {}).get(stage, {}))
            if line:
                fixed, per_node = line
                times = (f"{(fixed + per_node * n) / 60:.1f}" for n in MODEL_SIZES)
                rows.append((label.strip(), cluster, f"{per_node:.3f}", *times))
                break
    header = ("stage", "fit from", "s per node", *(f"min at {n}" for n in MODEL_SIZES))
    return table(rows, header)


def plot(figures: Figures, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter, NullLocator

    fig, (wall, watch) = plt.subplots(1, 2, figsize=(14, 5.5))
    counts = sorted({n for stages in figures.values() for points in stages.values() for n in points})
    for cluster, style in (("local", "-"), ("sim", "--")):
        for axes, stages in ((wall, WALL), (watch, WATCH)):
            for index, stage in enumerate(stages):
                points = figures.get(cluster, {}).get(stage)
                if points:
                    xs = sorted(points)
                    label = f"{STAGES[stage][0].strip()} ({cluster})"
                    axes.plot(xs, [points[x] for x in xs], style, marker="o", color=f"C{index}", label=label)
    wall.set_yscale("log")  # 1, 2, 5, 10, 20, ... s: the short stages stay readable under the bring-up
    wall.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    wall.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    wall.yaxis.set_minor_formatter(NullFormatter())
    wall.set_ylabel("seconds")
    wall.set_title("wall time per stage (local solid, sim dashed)")
    watch.set_ylabel("sessions; % of one core")
    watch.set_title("node0's liveness watch while a job trains (local)")
    for axes in (wall, watch):
        axes.set_xscale("log", base=2)
        axes.xaxis.set_minor_locator(NullLocator())
        axes.set_xticks(counts, [str(n) for n in counts])
        axes.set_xlabel("nodes (local) / servers (sim)")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--local", type=int, nargs="*", default=[2, 4, 8, 16, 32], metavar="N",
                        help="local node counts, 1 to 64 (with none: no local cluster)")  # fmt: skip
    parser.add_argument("--sim", type=int, nargs="*", default=[2, 4, 8], metavar="SERVERS",
                        help="simulated server counts, 1 to 8 (with none: no sim)")  # fmt: skip
    parser.add_argument("--no-sim", dest="sim", action="store_const", const=[], help="no sim")
    parser.add_argument("--sample", type=float, default=30.0, help="seconds node0's watch is sampled")
    parser.add_argument("--json", type=Path, help="also write the figures here (as they come)")
    parser.add_argument("--png", type=Path, default=Path(__file__).resolve().parent / "scale.png")
    parser.add_argument("--from-json", type=Path, help="table and plot of a saved --json; measure nothing")
    args = parser.parse_args()
    if args.from_json:
        figures = load(args.from_json)
    else:
        args.local, args.sim = sorted(set(args.local)), sorted(set(args.sim))
        if any(not 1 <= n <= LOCAL_MAX for n in args.local) or any(not 1 <= n <= 8 for n in args.sim):
            parser.error("--local takes 1 to 64 nodes, --sim 1 to 8 servers")
        figures = measure(args)
        if args.json:
            save(figures, args.json)
    print(report(figures))
    print(f"\nExtrapolated along each fit to {' and '.join(map(str, MODEL_SIZES))} servers (docs/scale.md):")
    print(model(figures))
    plot(figures, args.png)
    print(f"\nplot: {args.png}")


if __name__ == "__main__":
    main()
