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
- warm: site.yml again; it must report changed=0 on every server and start no task on any server but the first
  (the controller plays' run_once tasks), else the benchmark stops and names them;
- plan: train.yml --check -e nodes=N, up to the job's start (--skip-tags ddp_job_run,ddp_job_collect): the
  plan play (the drained nodes read, the plan made, the nodes grouped) and the job's checks of its nodes: what
  the controller does for a job before a rank starts. Check mode, so no run directory is written and no bundle
  packed (the pack is one tar of the project, the same at any N).
Without bringup in --stages the servers are seeded as a bring-up leaves them (bench/virtual/seed.py: derived
from a real bring-up of 4 servers, made once per benchmark, and generalised by name, address and host key and
by the cluster's compiled lists; the state files written by record.yml's action), since a bring-up of 1152
virtual servers costs the controller over an hour; the figures then say "warm_seeded": true.

Per stage: wall seconds; controller CPU seconds (getrusage(RUSAGE_CHILDREN) around the ansible-playbook run:
its workers and every process it started are reaped by then); task slots (host x task pairs started, skipped
included) per server; hostvars reads (HostVars.raw_get calls) per server; ssh per server (the commands a real
controller would start over ssh for that server: one per module run with pipelining, per command Ansible runs
by itself, per file put or fetched, per bin/ssh start).

Targets (printed, checked where the N was run): warm site.yml on 1152 servers <= 120 s; controller CPU per
server at 1152 <= 1.3x that at 128; train.yml's plan on 1152 <= 30 s.

    .venv/bin/python bench/bench_controller.py --servers 128,1152 --json FILE   # auto: 128 up, 1152 seeded
    .venv/bin/python bench/bench_controller.py --servers 128,1152 --stages warm,plan   # seeded servers
    .venv/bin/python bench/bench_controller.py --servers 1152 --stages bringup,warm,plan   # hours at 1152
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common import table

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VIRTUAL = HERE / "virtual"
sys.path.insert(0, str(VIRTUAL))

import seed  # noqa: E402  (bench/virtual: the seed and the virtual servers)
import server  # noqa: E402

STAGES = ("bringup", "warm", "plan")
# The tags of train.yml's tasks from the job's start on: the plan stage runs everything before them.
PLAN_SKIP = "ddp_job_run,ddp_job_collect"
TARGET_WARM_S, TARGET_CPU_RATIO, TARGET_PLAN_S = 120.0, 1.3, 30.0
# --stages auto (the default): a real bring-up up to this many servers, seeded servers above (a bring-up costs
# the controller about 4 CPU-s per server: minutes at 128, over an hour at 1152).
BRINGUP_UP_TO = 128


class BenchError(Exception):
    """A stage failed or did not behave as a warm run must."""


def environment(
    count: int, folder: Path, counts: Path, forks: int, repo: Path, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    callbacks = os.environ.get("ANSIBLE_CALLBACKS_ENABLED", "ddp_job_interrupt,ddp_cluster_lock")
    return (
        os.environ
        | dict(extra or {})
        | {
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
    )


def log_lines(folder: Path) -> collections.Counter[str]:
    """Lines of each virtual server's log: the ssh commands made to it so far."""
    found: collections.Counter[str] = collections.Counter()
    for log in folder.glob("vs*/log.jsonl"):
        with log.open("rb") as handle:
            found[log.parent.name] = sum(1 for _ in handle)
    return found


def run_stage(
    stage: str,
    count: int,
    folder: Path,
    repo: Path,
    forks: int,
    args: list[str],
    *,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    counts = folder / f"counts-{stage}.jsonl"
    before_logs = log_lines(folder)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        ["nice", str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(VIRTUAL / "hosts.py"), *args],
        cwd=repo,
        env=environment(count, folder, counts, forks, repo, env),
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


def template(repo: Path, forks: int) -> Path:
    """A real bring-up of seed.TEMPLATE_SERVERS virtual servers, each keeping its files' text: what the seed
    generalises (bench/virtual/seed.py). Checked at once: its servers past vs1 must be vs1 with their name,
    address and host key put in."""
    folder = Path(tempfile.mkdtemp(prefix="ddp-virtual-template-"))
    (folder / "home").mkdir()
    run_stage(
        "bringup", seed.TEMPLATE_SERVERS, folder, repo, forks, ["site.yml"], env={server.CONTENT_ENV: "1"}
    )
    try:
        seed.check_template(folder, seed.TEMPLATE_SERVERS)
    except seed.SeedError as error:
        raise BenchError(f"the seed's template ({folder}): {error}") from None
    return folder


def seed_servers(count: int, folder: Path, source: Path, repo: Path, forks: int) -> dict[str, Any]:
    """COUNT servers as a bring-up leaves them, from the template bring-up in SOURCE (bench/virtual/seed.py):
    the controller's records, the cluster compiled by its action, each server's state, then every state file
    written by record.yml's action. Its wall and CPU seconds (not the warm run's)."""
    playbook = str(seed.PLAYBOOK)
    try:
        seed.controller_files(source, folder, count)
        compiled = run_stage("seed-compile", count, folder, repo, forks, [playbook, "--tags", "compile"])
        seed.servers(source, folder, count)
    except seed.SeedError as error:
        raise BenchError(f"seeding {count} virtual servers: {error}") from None
    recorded = run_stage("seed-record", count, folder, repo, forks, [playbook])
    missing = seed.not_recorded(folder, count)
    if missing:
        raise BenchError(f"seed.yml recorded {len(missing)} server(s) as not converged: {missing[:8]}")
    return {
        "seed_s": round(compiled["wall_s"] + recorded["wall_s"], 2),
        "seed_cpu_s": round(compiled["cpu_s"] + recorded["cpu_s"], 2),
    }


def bench(
    count: int, stages: list[str], repo: Path, forks: int, keep: bool, source: Path | None = None
) -> dict[str, Any]:
    """One N's figures; without bringup in STAGES the servers are seeded from the template SOURCE."""
    folder = Path(tempfile.mkdtemp(prefix=f"ddp-virtual-{count}-"))
    (folder / "home").mkdir()
    result: dict[str, Any] = {"servers": count}
    try:
        if "bringup" not in stages:
            if source is None:
                raise BenchError("seeded servers need the template bring-up (bench_controller.template)")
            result |= seed_servers(count, folder, source, repo, forks)
            result["warm_seeded" if "warm" in stages else "seeded"] = True
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
            # Every server is in sync: none but the first (the controller plays' run_once tasks) gets a slot.
            slotted = [host for host, slots in list(warm["slots_by_host"].items())[1:] if slots]
            if slotted:
                raise BenchError(
                    f"the warm site.yml on {count} virtual servers started tasks on {len(slotted)} in-sync "
                    f"server(s) ({slotted[:8]}): the probe sent them through the stages (its lines in "
                    f"{folder / 'warm.log'} with -v say why)"
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


def stages_for(count: int, stages: list[str], auto: bool) -> list[str]:
    """The stages run at ``count`` servers: as asked, or with --stages auto a real bring-up up to
    BRINGUP_UP_TO servers and seeded servers above."""
    if auto and count > BRINGUP_UP_TO:
        return [stage for stage in stages if stage != "bringup"]
    return stages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="128,1152", help="virtual server counts, comma-separated")
    parser.add_argument("--json", type=Path, help="write the figures here ({N: {...}})")
    parser.add_argument(
        "--stages",
        default="auto",
        help="of bringup,warm,plan (without bringup: servers seeded from a real bring-up of 4); auto"
        f" (default): all three up to {BRINGUP_UP_TO} servers, warm,plan on seeded servers above",
    )
    parser.add_argument("--forks", type=int, default=64)
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose playbooks run")
    parser.add_argument("--keep", action="store_true", help="keep each N's virtual servers and logs")
    args = parser.parse_args()
    auto = args.stages == "auto"
    stages = list(STAGES) if auto else [stage for stage in args.stages.split(",") if stage]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        parser.error(f"unknown stage(s) {unknown}: pick among {', '.join(STAGES)}")
    results: dict[str, dict[str, Any]] = {}
    repo, source = args.repo.resolve(), None
    counts = sorted(int(n) for n in args.servers.split(",") if n)
    plans = {count: stages_for(count, stages, auto) for count in counts}
    try:
        if any("bringup" not in plan for plan in plans.values()):  # one template for every seeded N
            source = template(repo, args.forks)
            print(f"template: {seed.TEMPLATE_SERVERS} servers brought up in {source}", flush=True)
        for count in counts:
            results[str(count)] = bench(count, plans[count], repo, args.forks, args.keep, source)
            print(f"{count} servers: {json.dumps(results[str(count)])}", flush=True)
            if args.json:  # after each N: a long run keeps what it measured
                args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    except BenchError as error:
        print(f"bench_controller: {error}", file=sys.stderr)
        return 1
    finally:
        if source is not None and not args.keep:
            shutil.rmtree(source, ignore_errors=True)
    print(report(results))
    print("\n".join(targets(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
