"""The controller's side of site.yml and train.yml on 128 to 1152 servers, against virtual servers: no
container, no network, so what is measured is the controller alone (Ansible's main process, its forked
workers, the project's actions, filters and templates, and the processes they start).

The virtual servers (bench/virtual): the inventory script hosts.py (DDP_VIRTUAL_SERVERS=N servers of the sim's
shape: cpu, host network, ufw active, the node image built on a server), the connection ddp_virtual
(bench/plugins/connection: parses each module run's AnsiballZ payload and answers from the server's state file
as the real module would, updating it; the mesh play's ddp_docker is the same stand-in), bin/ssh for what the
controller runs over ssh itself. Counts come from the callback bench/callbacks/ddp_controller_counts.py.

For each N, ascending, in a fresh $DDP_VIRTUAL_DIR (and HOME: the controller's records, keys and compiled
files start empty):
- bring-up: site.yml on servers that have nothing of the cluster but its images (ufw rules, containers, mesh
  files are made; the image is present on every server, so neither a build nor a pull is measured);
- warm: site.yml again; it must report changed=0 on every server, else the benchmark stops and names them;
- plan: train.yml --check -e nodes=N, up to the job's start (--skip-tags ddp_job_run,ddp_job_collect): the
  plan play (the drained nodes read, the plan made, the nodes grouped) and the job's checks of its nodes: what
  the controller does for a job before a rank starts. Check mode, so no run directory is written and no bundle
  packed (the pack is one tar of the project, the same at any N). With --stages plan alone no site.yml runs:
  the servers are seeded as a bring-up leaves them for train.yml (containers running, the nodes' records).

Per stage: wall seconds; controller CPU seconds (getrusage(RUSAGE_CHILDREN) around the ansible-playbook run:
its workers and every process it started are reaped by then); task slots (host x task pairs started, skipped
included) per server; hostvars reads (HostVars.raw_get calls) per server; ssh per server (the commands a real
controller would start over ssh for that server: one per module run with pipelining, per command Ansible runs
by itself, per file put or fetched, per bin/ssh start).

Targets (printed, checked where the N was run): warm site.yml on 1152 servers <= 120 s; controller CPU per
server at 1152 <= 1.3x that at 128; train.yml's plan on 1152 <= 30 s.

    .venv/bin/python bench/bench_controller.py --servers 128,1152 --json FILE [--stages bringup,warm,plan]
        [--forks 64] [--repo PATH] [--keep]

--repo runs another checkout's playbooks and package with this one's stand-ins (a baseline: a git worktree of
an older commit).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import table

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VIRTUAL = HERE / "virtual"
STAGES = ("bringup", "warm", "plan")
# The tags of train.yml's tasks from the job's start on: the plan stage runs everything before them.
PLAN_SKIP = "ddp_job_run,ddp_job_collect"
TARGET_WARM_S, TARGET_CPU_RATIO, TARGET_PLAN_S = 120.0, 1.3, 30.0


class BenchError(Exception):
    """A stage failed or did not behave as a warm run must."""


def environment(count: int, folder: Path, counts: Path, forks: int, repo: Path) -> dict[str, str]:
    callbacks = os.environ.get("ANSIBLE_CALLBACKS_ENABLED", "ddp_job_interrupt,ddp_cluster_lock")
    return os.environ | {
        "DDP_VIRTUAL_SERVERS": str(count),
        "DDP_VIRTUAL_DIR": str(folder),
        "DDP_CONTROLLER_COUNTS": str(counts),
        "HOME": str(folder / "home"),
        "ANSIBLE_NOCOLOR": "1",
        # The package of the checkout that runs (the venv's editable install is this one's).
        "PYTHONPATH": str(repo / "python" / "src"),
        "ANSIBLE_FORKS": str(forks),
        # The stand-ins: ddp_virtual, and ddp_docker (the mesh play's connection) answered by it.
        "ANSIBLE_CONNECTION_PLUGINS": str(HERE / "plugins" / "connection"),
        "ANSIBLE_CALLBACK_PLUGINS": f"{HERE / 'callbacks'}:{REPO / 'plugins' / 'callback'}",
        "ANSIBLE_CALLBACKS_ENABLED": f"{callbacks},ddp_controller_counts",
    }


def log_lines(folder: Path) -> collections.Counter[str]:
    """Lines of each virtual server's log: the ssh commands made to it so far."""
    found: collections.Counter[str] = collections.Counter()
    for log in folder.glob("vs*/log.jsonl"):
        with log.open("rb") as handle:
            found[log.parent.name] = sum(1 for _ in handle)
    return found


def run_stage(
    stage: str, count: int, folder: Path, repo: Path, forks: int, args: list[str]
) -> dict[str, Any]:
    counts = folder / f"counts-{stage}.jsonl"
    before_logs = log_lines(folder)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        ["nice", str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(VIRTUAL / "hosts.py"), *args],
        cwd=repo,
        env=environment(count, folder, counts, forks, repo),
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    (folder / f"{stage}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise BenchError(
            f"{stage} on {count} virtual servers failed (rc {done.returncode}; the whole output is in "
            f"{folder / f'{stage}.log'}):\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
        )
    servers = [f"vs{index}" for index in range(count)]
    reads, slots, changed, by_host, plays = 0, 0, {}, {}, []
    reads_by_host: collections.Counter[str] = collections.Counter()
    for line in counts.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        if "reads" in entry:
            reads += int(entry["reads"])
            reads_by_host[entry["host"]] += int(entry["reads"])
        elif "slots" in entry:
            reads += int(entry["main_reads"])
            slots += sum(int(entry["slots"].get(server, 0)) for server in servers)
            changed = {host: n for host, n in entry["changed"].items() if n}
            by_host = {server: int(entry["slots"].get(server, 0)) for server in servers}
            plays = entry["plays"]
    logs = log_lines(folder)
    ssh = sum(logs[server] - before_logs[server] for server in servers)
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "task_slots_per_server": round(slots / count, 2),
        "hostvars_reads": round(reads / count, 2),
        "ssh_per_server": round(ssh / count, 2),
        "changed": changed,
        "slots_by_host": by_host,
        "reads_by_host": {server: reads_by_host[server] for server in servers},
        "plays": plays,
        "output": done.stdout,
    }


def changed_tasks(output: str, limit: int = 8) -> list[str]:
    """The 'TASK [...]: host' pairs a run reported changed (from its output)."""
    task, found = "", []
    for line in output.splitlines():
        if line.startswith("TASK ["):
            task = line.split("]")[0].removeprefix("TASK [")
        elif line.startswith("changed: ["):
            found.append(f"{task}: {line.split('[')[1].split(']')[0]}")
    return found[:limit]


def seed(count: int, folder: Path) -> None:
    """The servers as a bring-up leaves them for train.yml, without running one: each node container running
    (its state file) and each node's record on the controller (what the job's plan reads). For the plan stage
    alone, at sizes where a bring-up would take the controller an hour."""
    sys.path.insert(0, str(VIRTUAL))
    import server

    os.environ["DDP_VIRTUAL_DIR"] = str(folder)
    records = folder / "home" / ".ddp-cluster" / "virtual" / "nodes"
    records.mkdir(parents=True)
    for index in range(count):
        host = f"vs{index}"
        state = server.load(host)
        state["generation"] = 1
        state["container"] = {"spec": "{}", "running": True, "ssh_port": "12345"}
        server.save(host, state)
        record = {
            "address": f"{server.address_of(index)}/16",
            "container_workspace": "/workspace",
            "cpu_binding": "",
            "host_keys": {"ed25519": server.host_key(host, 1)},
            "interface": "eth0",
            "network": str(server.NETWORK),
            "workspace": f"/var/lib/ddp-cluster/{host}/workspace",
        }
        (records / f"{host}.json").write_text(json.dumps(record, indent=4, sort_keys=True) + "\n")


def bench(count: int, stages: list[str], repo: Path, forks: int, keep: bool) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"ddp-virtual-{count}-"))
    (folder / "home").mkdir()
    result: dict[str, Any] = {"servers": count}
    try:
        if stages == ["plan"]:
            seed(count, folder)
        else:
            up = run_stage("bringup", count, folder, repo, forks, ["site.yml"])
            result |= {
                "bringup_s": up["wall_s"],
                "bringup_cpu_s": up["cpu_s"],
                "bringup_task_slots_per_server": up["task_slots_per_server"],
                "bringup_hostvars_reads": up["hostvars_reads"],
                "bringup_ssh_per_server": up["ssh_per_server"],
            }
        if "warm" in stages:
            warm = run_stage("warm", count, folder, repo, forks, ["site.yml"])
            if warm["changed"]:
                raise BenchError(
                    f"the warm site.yml on {count} virtual servers changed {len(warm['changed'])} "
                    f"host(s) ({sorted(warm['changed'])[:8]}): {changed_tasks(warm['output'])}. A warm run "
                    "must report changed=0: either the stand-in (bench/virtual/server.py) does not keep "
                    "what the bring-up made, or a role changes something on every run."
                )
            result |= {
                "warm_site_s": warm["wall_s"],
                "controller_cpu_s": warm["cpu_s"],
                "controller_cpu_per_server_ms": round(1000 * warm["cpu_s"] / count, 1),
                "task_slots_per_server": warm["task_slots_per_server"],
                "hostvars_reads": warm["hostvars_reads"],
                "ssh_per_server": warm["ssh_per_server"],
            }
        if "plan" in stages:
            plan = run_stage(
                "plan",
                count,
                folder,
                repo,
                forks,
                ["train.yml", "--check", "-e", f"nodes={count}", "-e", "job_id=bench-controller",
                 "--skip-tags", PLAN_SKIP],
            )  # fmt: skip
            result |= {
                "plan_s": plan["wall_s"],
                "plan_cpu_s": plan["cpu_s"],
                "plan_task_slots_per_server": plan["task_slots_per_server"],
                "plan_hostvars_reads": plan["hostvars_reads"],
                "plan_ssh_per_server": plan["ssh_per_server"],
            }
    finally:
        if keep:
            print(f"{count} servers: kept {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return result


def targets(results: dict[str, dict[str, Any]]) -> list[str]:
    """The issue's targets, each 'PASS'/'FAIL'/'n/a' with its figures."""
    lines = []
    big, small = results.get("1152", {}), results.get("128", {})
    if "warm_site_s" in big:
        verdict = "PASS" if big["warm_site_s"] <= TARGET_WARM_S else "FAIL"
        lines.append(f"{verdict} warm site.yml on 1152: {big['warm_site_s']} s (<= {TARGET_WARM_S:.0f} s)")
    else:
        lines.append("n/a  warm site.yml on 1152 (not run)")
    if "controller_cpu_per_server_ms" in big and "controller_cpu_per_server_ms" in small:
        ratio = big["controller_cpu_per_server_ms"] / small["controller_cpu_per_server_ms"]
        verdict = "PASS" if ratio <= TARGET_CPU_RATIO else "FAIL"
        lines.append(
            f"{verdict} controller CPU per server, 1152 / 128: {big['controller_cpu_per_server_ms']} / "
            f"{small['controller_cpu_per_server_ms']} ms = {ratio:.2f}x (<= {TARGET_CPU_RATIO}x)"
        )
    else:
        lines.append("n/a  controller CPU per server 1152 / 128 (both not run)")
    if "plan_s" in big:
        verdict = "PASS" if big["plan_s"] <= TARGET_PLAN_S else "FAIL"
        lines.append(f"{verdict} train.yml's plan on 1152: {big['plan_s']} s (<= {TARGET_PLAN_S:.0f} s)")
    else:
        lines.append("n/a  train.yml's plan on 1152 (not run)")
    return lines


def report(results: dict[str, dict[str, Any]]) -> str:
    columns = [
        ("bringup_s", "bring-up s"),
        ("bringup_cpu_s", "cpu s"),
        ("warm_site_s", "warm s"),
        ("controller_cpu_s", "cpu s"),
        ("controller_cpu_per_server_ms", "cpu ms/server"),
        ("task_slots_per_server", "slots/server"),
        ("hostvars_reads", "hostvars/server"),
        ("ssh_per_server", "ssh/server"),
        ("plan_s", "plan s"),
        ("plan_cpu_s", "cpu s"),
    ]
    rows = [
        (key, *(str(values.get(name, "-")) for name, _ in columns))
        for key, values in sorted(results.items(), key=lambda item: int(item[0]))
    ]
    return table(rows, ("servers", *(title for _, title in columns)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="128,1152", help="virtual server counts, comma-separated")
    parser.add_argument("--json", type=Path, help="write the figures here ({N: {...}})")
    parser.add_argument(
        "--stages",
        default=",".join(STAGES),
        help="of bringup,warm,plan (a bring-up comes first, but for plan alone: seeded servers)",
    )
    parser.add_argument("--forks", type=int, default=64)
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose playbooks run")
    parser.add_argument("--keep", action="store_true", help="keep each N's virtual servers and logs")
    args = parser.parse_args()
    stages = [stage for stage in args.stages.split(",") if stage]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        parser.error(f"unknown stage(s) {unknown}: pick among {', '.join(STAGES)}")
    results: dict[str, dict[str, Any]] = {}
    for count in sorted(int(n) for n in args.servers.split(",") if n):
        try:
            results[str(count)] = bench(count, stages, args.repo.resolve(), args.forks, args.keep)
        except BenchError as error:
            print(f"bench_controller: {error}", file=sys.stderr)
            return 1
        print(f"{count} servers: {json.dumps(results[str(count)])}", flush=True)
        if args.json:  # after each N: a long run keeps what it measured
            args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(report(results))
    print("\n".join(targets(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
