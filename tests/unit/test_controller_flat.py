"""The controller's cost per server stays flat in the cluster's size: site.yml brought up, then run warm, on 2
and on 8 virtual servers (bench/virtual: no container, no network; bench/bench_controller.py measures the
same at 128 to 1152). A warm run changes nothing; its task slots per server are the same at both sizes and its
hostvars reads per server grow by at most 10%; and, with the one-probe warm path, no in-sync server gets a
task slot at all after the compile play (its run_once tasks are the only ones, on the first server).

The seeded servers the benchmark runs warm at sizes it cannot bring up (bench/virtual/seed.py) are held to a
real bring-up: 8 servers seeded from the 2-server bring-up (its template) are the 8-server bring-up's, server
state, controller records, compiled files, state files and probe answers alike, and their warm run is its."""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_cluster.inventory import drift
from ddp_cluster.server import state

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

import bench_controller
import seed
import server

# Small enough for the unit tier (a bring-up costs some 5 CPU-s per virtual server), four times apart.
SIZES = (2, 8)


@pytest.fixture(scope="module")
def bringups(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, dict[str, Any]]]:
    """Each size brought up, then run warm: its folder and the warm run's figures."""
    runs = {}
    for count in SIZES:
        folder = tmp_path_factory.mktemp(f"virtual-{count}")
        (folder / "home").mkdir()
        # The smaller keeps its files' text: the seed's template below. The larger gets its cluster key pair
        # and munge key (made once per controller, at random): the seeded servers, which take the template's,
        # can then be compared with it file for file.
        env = {server.CONTENT_ENV: "1"} if count == SIZES[0] else None
        if count != SIZES[0]:
            keys = seed.cluster_dir(folder)
            keys.mkdir(parents=True)
            for name in ("id_ed25519", "id_ed25519.pub", "munge.key"):
                shutil.copy2(seed.cluster_dir(runs[SIZES[0]][0]) / name, keys / name)
        bench_controller.run_stage("bringup", count, folder, REPO, 64, ["site.yml"], env=env)
        runs[count] = (folder, bench_controller.run_stage("warm", count, folder, REPO, 64, ["site.yml"]))
    return runs


@pytest.fixture(scope="module")
def warm_runs(bringups: dict[int, tuple[Path, dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    return {count: run for count, (_, run) in bringups.items()}


def test_a_warm_run_changes_nothing(warm_runs: dict[int, dict[str, Any]]) -> None:
    for count, run in warm_runs.items():
        assert run["changed"] == {}, (count, bench_controller.changed_tasks(run["output"]))


def test_task_slots_per_server_do_not_grow(warm_runs: dict[int, dict[str, Any]]) -> None:
    # The first server also carries the run_once tasks: the others say what one server costs.
    per_server = {
        count: statistics.median(list(run["slots_by_host"].values())[1:]) for count, run in warm_runs.items()
    }
    assert per_server[SIZES[1]] == per_server[SIZES[0]], per_server


def test_hostvars_reads_per_server_grow_by_at_most_a_tenth(warm_runs: dict[int, dict[str, Any]]) -> None:
    small, large = (warm_runs[count]["hostvars_reads"] for count in SIZES)
    assert large <= 1.1 * max(small, 1.0), {count: run["hostvars_reads"] for count, run in warm_runs.items()}


# --- the one-probe warm path: an in-sync server costs the controller no task slot --------------------------


def test_no_slot_on_an_in_sync_server_after_the_compile_play(warm_runs: dict[int, dict[str, Any]]) -> None:
    for count, run in warm_runs.items():
        later = {
            play: {host: slots for host, slots in hosts.items() if host not in ("vs0", "localhost") and slots}
            for play, hosts in run["plays"][1:]
        }
        assert not any(later.values()), (count, {play: hosts for play, hosts in later.items() if hosts})
        # The compile play's own tasks run once, on the first server, whatever the size.
        first_play = run["plays"][0][1]
        assert set(first_play) <= {"vs0", "localhost"}, (count, first_play)


# --- seeded servers: what the benchmark runs warm at 1152 -------------------------------------------------


@pytest.fixture(scope="module")
def seeded(
    bringups: dict[int, tuple[Path, dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """The larger size seeded from the smaller's bring-up, then run warm: its folder and the warm run."""
    count = SIZES[1]
    folder = tmp_path_factory.mktemp(f"seeded-{count}")
    (folder / "home").mkdir()
    bench_controller.seed_servers(count, folder, bringups[SIZES[0]][0], REPO, 64)
    return folder, bench_controller.run_stage("warm", count, folder, REPO, 64, ["site.yml"])


def probe_answer(folder: Path, node: str) -> str:
    """What NODE answers the warm path's probe (the script the probe action sends it)."""
    variables = yaml.safe_load((REPO / "bench" / "virtual" / "group_vars" / "all.yml").read_text())
    variables |= {"ansible_connection": "ddp_virtual"}
    script = state.script(drift.probe_spec(node, variables, {}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DDP_VIRTUAL_DIR", str(folder))
        return server.probe(node, script)


def test_seeded_servers_are_what_a_bring_up_leaves(
    bringups: dict[int, tuple[Path, dict[str, Any]]], seeded: tuple[Path, dict[str, Any]]
) -> None:
    count = SIZES[1]
    real, made = bringups[count][0], seeded[0]
    real_dir, made_dir = seed.cluster_dir(real), seed.cluster_dir(made)
    for node in seed.names(count):
        assert server.load(node, made) == server.load(node, real), node
        assert probe_answer(made, node) == probe_answer(real, node), node
        for name in (f"nodes/{node}.json", f"compiled/nodes/{node}.json"):
            assert (made_dir / name).read_text() == (real_dir / name).read_text(), name
        states = [
            json.loads((where / f"nodes/{node}.state.json").read_text()) for where in (made_dir, real_dir)
        ]
        assert [{**found, "at": ""} for found in states] == [{**states[1], "at": ""}] * 2, node
    names = ("compiled/hosts", "compiled/known_hosts", "compiled/slurm.conf", "id_ed25519", "id_ed25519.pub")
    for name in (*names, "munge.key"):
        assert (made_dir / name).read_text() == (real_dir / name).read_text(), name


def test_a_seeded_warm_run_is_a_brought_up_ones(
    warm_runs: dict[int, dict[str, Any]], seeded: tuple[Path, dict[str, Any]]
) -> None:
    real, made = warm_runs[SIZES[1]], seeded[1]
    assert made["changed"] == {}, bench_controller.changed_tasks(made["output"])
    assert made["slots_by_host"] == real["slots_by_host"]
    assert made["plays"] == real["plays"]
    for name in ("hostvars_reads", "ssh_per_server", "task_slots_per_server"):
        assert made[name] == real[name], name


def test_a_template_server_unlike_its_model_fails_the_seed(
    bringups: dict[int, tuple[Path, dict[str, Any]]], tmp_path: Path
) -> None:
    # A text naming another server outside the cluster's lists cannot be made another server's.
    template = bringups[SIZES[0]][0]
    cluster = seed.Cluster.read(template, SIZES[0])
    rewrite = seed.Rewrite(cluster, cluster, "vs1", "vs1", 1)
    assert rewrite("/var/lib/ddp-cluster/vs1/etc", "a path") == "/var/lib/ddp-cluster/vs1/etc"
    with pytest.raises(seed.SeedError, match="names vs0 outside the cluster's lists"):
        rewrite("peer vs0 only", "a file")


# --- train.yml before a rank starts: one call to the first node, whatever the size ----------------------


def test_the_jobs_checks_cost_the_controller_one_slot_and_two_commands_at_any_size(
    bringups: dict[int, tuple[Path, dict[str, Any]]],
) -> None:
    # The plan (its drained nodes' read through the first node) and the checks of every node (one command on
    # the first node's server): the same task slots on servers and the same ssh commands at 2 and 8 servers.
    totals = {}
    for count, (folder, _) in bringups.items():
        args = ["train.yml", "--check", "-e", f"nodes={count}", "-e", "job_id=flat-plan",
                "--skip-tags", bench_controller.PLAN_SKIP]  # fmt: skip
        run = bench_controller.run_stage("plan", count, folder, REPO, 64, args)
        assert "TASK [ddp_job : Check that the job can start on every node" in run["output"], run["output"][
            -3000:
        ]
        slots = run["slots_by_host"]
        assert {host for host, n in slots.items() if n} == {"vs0"}, slots  # the first server only
        totals[count] = (sum(slots.values()), round(run["ssh_per_server"] * count))
    assert totals[SIZES[0]] == totals[SIZES[1]], totals
    assert totals[SIZES[1]][1] == 2, totals


def test_auto_brings_the_servers_up_up_to_128_and_seeds_them_above() -> None:
    every = list(bench_controller.STAGES)
    assert bench_controller.stages_for(128, every, auto=True) == every
    assert bench_controller.stages_for(1152, every, auto=True) == ["warm", "plan"]
    assert bench_controller.stages_for(1152, every, auto=False) == every
