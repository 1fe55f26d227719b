"""What site.yml costs per node: the container stage is one module run per node.

A 4-node bring-up from nothing, with a callback (tests/callbacks/ddp_module_runs.py) writing one line per
module run; then a warm re-run (no module at all: the probe finds every node in sync); then the cluster goes
back to the 2 nodes the other tests use. Runs after test_site.py (name order): a 4-node site.yml pins 4 nodes'
host keys on node0 and node1, which the 2-node run after it takes back.
"""

from __future__ import annotations

import collections
import json
import tempfile
from pathlib import Path

from conftest import KEY_DIR, REPO, PlaybookResult, docker, run_playbook, teardown_cluster

NODES = [f"node{index}" for index in range(4)]


def counted_site(nodes: int, log: Path) -> PlaybookResult:
    return run_playbook(
        "site.yml",
        env={
            "DDP_LOCAL_NODES": str(nodes),
            "DDP_MODULE_RUNS": str(log),
            "ANSIBLE_CALLBACK_PLUGINS": f"{REPO / 'plugins' / 'callback'}:{REPO / 'tests' / 'callbacks'}",
            "ANSIBLE_CALLBACKS_ENABLED": "ddp_job_interrupt,ddp_module_runs",
        },
    )


def module_runs(log: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def per_node(runs: list[dict[str, str]], role: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = collections.defaultdict(list)
    for run in runs:
        if run["role"] == role:
            found[run["host"]].append(run["module"])
    return found


def test_container_stage_is_one_module_run_per_node() -> None:
    teardown_cluster()
    try:
        with tempfile.TemporaryDirectory(prefix="ddp-runs-") as scratch:
            cold_log, warm_log = Path(scratch) / "cold.jsonl", Path(scratch) / "warm.jsonl"
            cold = counted_site(4, cold_log)
            assert cold.rc == 0, cold.stdout[-6000:]
            runs = module_runs(cold_log)
            containers = per_node(runs, "node_container")
            # The cluster network is made once, on the first node; every node then costs one run.
            assert containers.pop("node0").count("community.docker.docker_network") == 1
            assert {host: modules for host, modules in containers.items() if host != "node0"} == {
                node: ["ddp_node_container"] for node in NODES[1:]
            }
            assert all("community.docker.docker_network" not in modules for modules in containers.values())
            # The whole bring-up of a node that is not the first: its container, the mesh's files (its host
            # key came back with the container stage's probe; the ring login is a raw command, not a module),
            # then Slurm's files (its daemons' start and the wait are raw commands).
            for node in NODES[1:]:
                assert [run["module"] for run in runs if run["host"] == node] == [
                    "ddp_node_container",
                    "ddp_mesh_files",
                    "ddp_mesh_files",
                ]
            for node in NODES:
                assert docker("inspect", "-f", "{{.State.Running}}", node).stdout.strip() == "true"
                assert (KEY_DIR / "nodes" / f"{node}.json").is_file()

            warm = counted_site(4, warm_log)
            assert warm.rc == 0, warm.stdout[-6000:]
            assert warm.changed_hosts() == {}, warm.stdout[-6000:]
            # Warm: the probe (one command per node from the controller, no module) finds every node in sync,
            # so no stage runs a module anywhere.
            assert module_runs(warm_log) == [], warm.stdout[-6000:]
    finally:
        docker("rm", "-f", "node2", "node3", check=False)
        for node in ("node2", "node3"):
            (KEY_DIR / "nodes" / f"{node}.json").unlink(missing_ok=True)
            (KEY_DIR / "nodes" / f"{node}.state.json").unlink(missing_ok=True)
        back = run_playbook("site.yml")
        assert back.rc == 0, back.stdout[-6000:]
