"""site.yml never kills a running job, and runs one at a time (local inventory, 2 nodes).

A detached 2-node job runs; then site.yml is asked for a change that recreates the node containers (a setting
of their specification, node_container_shm_size, given with -e as a user changes a group_vars value): each
node is refused by name before anything changes on it, in check mode too, and the job goes on; once jobs.yml
stopped it site.yml recreates them. With -e wait=true site.yml waits for the job to end; with -e force=true it
recreates the containers at once and says which job that stops. A second site.yml while one holds the
cluster's lock fails before its first task, naming the first. make clean (teardown.yml) refuses the nodes of a
running job the same way, removing nothing; with -e force=true it stops the job and removes them, and the
controller's runs/ is kept.
"""

from __future__ import annotations

import calendar
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator

import pytest

from ddp_cluster.inventory import lock

from conftest import (
    LOCAL_INVENTORY,
    REPO,
    STATE_DIR,
    PlaybookResult,
    docker,
    node_exec,
    recap_json,
    run_playbook,
    running_cluster,
)

NODES = ("node0", "node1")
# Digits, about 20 s per 200 epochs on two nodes (tests/test_train_lifecycle.py's LONG): a job that outlasts
# every site.yml below unless stopped, and one that ends while site.yml waits for it.
ENDLESS = "--dataset digits --epochs 20000 --batch-size 32 --lr 0.05 --log-every 10 --checkpoint-every 500"
MINUTE = "--dataset digits --epochs 700 --batch-size 32 --lr 0.05 --log-every 10 --checkpoint-every 500"
# A setting of the containers' specification: a cpu node's /dev/shm (2g by default).
CHANGED = {"node_container_shm_size": "3g"}
THREE_GIB = 3 * 1024**3


def job_id(name: str) -> str:
    return f"test-sitejob-{name}-{uuid.uuid4().hex[:6]}"


def status_of(job: str) -> dict[str, object]:
    try:
        return dict(
            json.loads((STATE_DIR / "node0" / "workspace" / "jobs" / job / "status.json").read_text())
        )
    except (OSError, ValueError):
        return {}


def processes(node: str, job: str) -> str:
    return node_exec(node, f"pgrep -af '[/]workspace/jobs/{job}/' || true", check=False).stdout.strip()


def container(node: str) -> tuple[str, int]:
    """The node container's id and its /dev/shm size."""
    found = docker("inspect", "-f", "{{.Id}} {{.HostConfig.ShmSize}}", node).stdout.split()
    return found[0], int(found[1])


def detach(job: str, script_args: str) -> None:
    started = run_playbook(
        "train.yml", extravars={"job_id": job, "nodes": 2, "detach": True, "script_args": script_args}
    )
    assert started.rc == 0, started.stdout[-4000:]
    assert all(processes(node, job) for node in NODES), f"job {job} does not run on both nodes"


@pytest.fixture
def default_spec(local_cluster: PlaybookResult) -> Iterator[None]:
    """The containers as site.yml makes them by default, before and after (a test that changed them puts them
    back, so that the next file's site.yml changes nothing)."""
    yield
    if any(container(node)[1] == THREE_GIB for node in NODES):
        restored = run_playbook("site.yml", extravars={"force": True})
        assert restored.rc == 0, restored.stdout[-4000:]


def test_site_refuses_the_nodes_of_a_running_job_then_recreates_them_once_it_is_stopped(
    default_spec: None,
) -> None:
    job = job_id("refused")
    detach(job, ENDLESS)
    before = {node: container(node) for node in NODES}

    checked = run_playbook("site.yml", extravars=CHANGED, cmdline="--check --diff")
    refused = run_playbook("site.yml", extravars=CHANGED)
    for result in (checked, refused):
        assert result.rc != 0, result.stdout[-4000:]
        for node in NODES:
            assert f"{node}: job {job} (nodes node0, node1) runs on {node}" in result.stdout, result.stdout[
                -4000:
            ]
            assert f"{node} was refused, nothing was changed on it" in result.stdout
        assert f"ansible-playbook jobs.yml -e stop={job}" in result.stdout
        assert "-e wait=true" in result.stdout and "-e force=true" in result.stdout
        assert set(result.failed_hosts()) == set(NODES), recap_json(result)
    assert {node: container(node) for node in NODES} == before, "a refused node's container changed"
    assert all(processes(node, job) for node in NODES), "the job's processes are gone after the refusal"
    assert status_of(job).get("state") == "running"

    stopped = run_playbook("jobs.yml", extravars={"stop": job})
    assert stopped.rc == 0, stopped.stdout[-4000:]
    recreated = run_playbook("site.yml", extravars=CHANGED)
    assert recreated.rc == 0, recreated.stdout[-4000:]
    for node in NODES:
        new_id, shm = container(node)
        assert new_id != before[node][0] and shm == THREE_GIB
    assert "force=true" not in recreated.stdout


def test_force_recreates_the_nodes_and_names_the_job_it_stops(default_spec: None) -> None:
    job = job_id("forced")
    detach(job, ENDLESS)
    before = {node: container(node)[0] for node in NODES}
    forced = run_playbook("site.yml", extravars={**CHANGED, "force": True})
    assert forced.rc == 0, forced.stdout[-4000:]
    for node in NODES:
        assert f"force=true: recreating {node} stops job {job} (nodes node0, node1)" in forced.stdout, (
            forced.stdout[-4000:]
        )
        assert container(node)[0] != before[node] and container(node)[1] == THREE_GIB
        assert processes(node, job) == ""
    # Stopped as jobs.yml stops a job (its status says why), not killed with its container.
    status = status_of(job)
    assert status.get("state") == "failed", status
    assert "site.yml -e force=true" in str(status.get("reason")), status


def test_wait_lets_the_job_finish_then_recreates_the_nodes(default_spec: None) -> None:
    job = job_id("waited")
    detach(job, MINUTE)
    launched = time.time()
    waited = run_playbook("site.yml", extravars={**CHANGED, "wait": True})
    assert waited.rc == 0, waited.stdout[-4000:]
    status = status_of(job)
    assert status.get("state") == "succeeded", status
    ended = float(status.get("updated") or 0)
    assert ended > launched + 5, "the job ended before site.yml could wait for it: make MINUTE longer"
    for node in NODES:
        started = docker("inspect", "-f", "{{.State.StartedAt}}", node).stdout.strip()
        started_at = calendar.timegm(time.strptime(started[:19], "%Y-%m-%dT%H:%M:%S"))  # UTC
        assert started_at >= ended - 1, f"{node} was recreated ({started}) before the job ended"
        assert container(node)[1] == THREE_GIB


def test_a_second_site_run_is_refused_naming_the_first(local_cluster: PlaybookResult) -> None:
    # The test holds the local cluster's lock as a running site.yml would.
    held = lock.acquire([str(LOCAL_INVENTORY)], "site.yml", "ansible-playbook site.yml (the first run)")
    try:
        second = run_playbook("site.yml")
    finally:
        held.release()
    assert second.rc != 0
    assert "another run of the cluster's playbooks holds its lock" in second.stdout, second.stdout[-3000:]
    assert f"pid {os.getpid()}, started " in second.stdout
    assert "ansible-playbook site.yml (the first run)" in second.stdout
    assert "TASK [" not in second.stdout, "a task ran under another run's lock"
    again = run_playbook("site.yml")
    assert again.rc == 0 and again.changed_hosts() == {}, recap_json(again)


@pytest.fixture
def cluster_made_again(local_cluster_made: list[PlaybookResult]) -> Iterator[None]:
    """The session's cluster before the test, and again after it (a test that tears it down)."""
    running_cluster(local_cluster_made)
    yield
    running_cluster(local_cluster_made)


def test_make_clean_refuses_the_nodes_of_a_detached_job_and_force_stops_it_keeping_the_results(
    cluster_made_again: None,
) -> None:
    job = job_id("clean")
    detach(job, ENDLESS)
    before = {node: container(node)[0] for node in NODES}
    # A job's results on the controller, as train.yml and jobs.yml -e sync=ID leave them.
    results = REPO / "runs" / f"{job}-results"
    results.mkdir(parents=True)
    (results / "summary.json").write_text("{}")
    try:
        refused = run_playbook("playbooks/teardown.yml")
        said = " ".join(refused.stdout.split())
        assert refused.rc != 0, refused.stdout[-4000:]
        assert (
            f"job {job} (nodes node0, node1) runs on node0; job {job} (nodes node0, node1) runs on node1. "
            "teardown.yml removes each node's container and its directory, the jobs' checkpoints included, "
            "so nothing was removed on any node." in said
        ), refused.stdout[-4000:]
        assert f"`ansible-playbook jobs.yml -e stop={job}`" in said and "-e force=true" in said
        assert "TASK [Remove" not in refused.stdout
        assert {node: container(node)[0] for node in NODES} == before, "a refused node's container changed"
        assert all(processes(node, job) for node in NODES), "the job's processes are gone after the refusal"
        assert status_of(job).get("state") == "running"

        forced = run_playbook("playbooks/teardown.yml", extravars={"force": True})
        assert forced.rc == 0, forced.stdout[-4000:]
        for node in NODES:
            assert f"force=true: removing {node} stops job {job} (nodes node0, node1)" in forced.stdout
            assert docker("inspect", node, check=False).returncode != 0, f"{node} is still there"
            assert not (STATE_DIR / node).exists()
        assert (results / "summary.json").is_file(), "teardown removed the controller's runs/"
    finally:
        shutil.rmtree(results, ignore_errors=True)
