"""The controller's cost per server stays flat in the cluster's size: site.yml brought up, then run warm, on 2
and on 8 virtual servers (bench/virtual: no container, no network; bench/bench_controller.py measures the
same at 128 to 1152). A warm run changes nothing; its task slots per server are the same at both sizes and its
hostvars reads per server grow by at most 10%; and, with the one-probe warm path, no in-sync server gets a
task slot at all after the compile play (its run_once tasks are the only ones, on the first server)."""

from __future__ import annotations

import shutil
import statistics
import sys
from typing import Any

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

import bench_controller

# Small enough for the unit tier (a bring-up costs some 5 CPU-s per virtual server), four times apart.
SIZES = (2, 8)


@pytest.fixture(scope="module")
def warm_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    runs = {}
    for count in SIZES:
        folder = tmp_path_factory.mktemp(f"virtual-{count}")
        (folder / "home").mkdir()
        bench_controller.run_stage("bringup", count, folder, REPO, 64, ["site.yml"])
        runs[count] = bench_controller.run_stage("warm", count, folder, REPO, 64, ["site.yml"])
        shutil.rmtree(folder / "home", ignore_errors=True)
    return runs


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
