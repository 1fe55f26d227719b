"""The node_container role's one-run-per-node module (roles/node_container/library/ddp_node_container.py), run
as Ansible runs it, with ddp_cluster.server.node shipped as module_utils: check mode against a docker double
says what it would do and touches nothing; a node whose container would be recreated while a job runs in it
is refused by name (in check mode too), or under force its job stopped and the node recreated with a
warning. What the module does is unit-tested in python/tests/test_server_node.py; the container itself runs
in molecule's node_container scenario and the e2e tests (tests/test_site_scale.py counts the runs,
tests/test_site_running_job.py runs site.yml over a running job)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rolemodule import run_role_module

# No image and no container on the engine: in check mode the module only says it would create the container.
DOCKER = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/calls"
case "$1" in image|container) exit 1;; esac
exit 0
"""


def run(tmp_path: Path, **args: Any) -> dict[str, Any]:
    double = tmp_path / "bin" / "docker"
    double.parent.mkdir(exist_ok=True)
    double.write_text(DOCKER)
    double.chmod(0o755)
    path = {"PATH": f"{double.parent}{os.pathsep}{os.environ['PATH']}"}
    # Outside the checkout, whose ansible.cfg would run the role's action (it needs a record) for the module.
    return run_role_module(
        "node_container", "ddp_node_container", args, cwd=tmp_path, check=True, diff=True, env=path
    )


def test_check_mode_says_what_it_would_do_and_touches_nothing(tmp_path: Path) -> None:
    node = tmp_path / "node0"
    result = run(
        tmp_path,
        directories=[{"path": str(node / "etc"), "mode": "0755"}],
        settings={"path": str(node / "etc" / "node.env"), "content": "x\n", "mode": "0644"},
        container={"name": "node0", "image": "ddp-cluster/node:abc"},
        sshd={"port": 12345, "timeout": 5, "probe": "true"},
    )
    assert result["changed"] and not result.get("failed"), result
    assert result["actions"] == [
        f"created directory {node / 'etc'}",
        f"created {node / 'etc' / 'node.env'}",
        "would create container node0 from ddp-cluster/node:abc (not on this engine yet)",
    ]
    assert result["sshd"] == [] and result["diff"]["after"]["settings"] == "x\n"
    assert not node.exists()
    assert (tmp_path / "bin" / "calls").read_text() == (
        "image inspect --format {{.Id}} ddp-cluster/node:abc\ncontainer inspect node0\n"
    )


# An engine whose image changed since node0 was made, node0 running, and the node's jobs command answering
# $STATE/jobs: the container would be recreated over that job.
ENGINE = """#!/bin/sh
echo "$*" >> "$STATE/calls"
case "$1 $2" in
  "image inspect") echo sha256:2; exit 0;;
  "container inspect") exec cat "$STATE/container";;
esac
case "$1 $3" in
  "exec /bin/bash") exec cat "$STATE/jobs";;
esac
exit 0
"""
SPEC = {
    "name": "node0",
    "hostname": "node0",
    "image": "ddp-cluster/node:abc",
    "restart_policy": "unless-stopped",
    "ipc_mode": "private",
    "network": "ddp",
}
REPORT = {"busy": ["train-7"], "jobs": {"train-7": {"nodes": ["node0", "node1"]}}}


def run_over_a_job(tmp_path: Path, check: bool, **jobs: Any) -> tuple[dict[str, Any], list[str]]:
    """The module on node0 while job train-7 runs there: its result and the engine's calls."""
    state = tmp_path / "engine"
    state.mkdir(parents=True)
    double = tmp_path / "bin" / "docker"
    double.parent.mkdir()
    double.write_text(ENGINE)
    double.chmod(0o755)
    old = json.dumps({**SPEC, "image_id": "sha256:1"}, sort_keys=True, separators=(",", ":"))
    found = [{"Config": {"Labels": {"ddp-cluster.spec": old}}, "State": {"Running": True}}]
    (state / "container").write_text(json.dumps(found))
    (state / "jobs").write_text(json.dumps(REPORT) + "\n")
    node = tmp_path / "node0"
    args = {
        "directories": [{"path": str(node / "etc"), "mode": "0755"}],
        "settings": {"path": str(node / "etc" / "node.env"), "content": "x\n", "mode": "0644"},
        "container": SPEC,
        "sshd": {"port": 12345, "timeout": 1, "probe": "true"},
        "jobs": {
            "command": "python -m ddp_cluster.supervisor.jobs",
            "stop_command": "python -m ddp_cluster.supervisor.jobs --stop {job}",
            "wait_timeout": 60,
            **jobs,
        },
    }
    env = {"PATH": f"{double.parent}{os.pathsep}{os.environ['PATH']}", "STATE": str(state)}
    result = run_role_module(
        "node_container", "ddp_node_container", args, cwd=tmp_path, check=check, diff=check, env=env
    )
    return result, (state / "calls").read_text().splitlines()


def test_a_node_running_a_job_is_refused_by_name_in_check_mode_too(tmp_path: Path) -> None:
    for check in (True, False):
        result, calls = run_over_a_job(tmp_path / str(check), check)
        assert result.get("failed"), result
        assert result["msg"].startswith(
            "node0: job train-7 (nodes node0, node1) runs on node0, and its container would be recreated"
        ), result["msg"]
        assert "ansible-playbook jobs.yml -e stop=train-7" in result["msg"]
        assert not any(call.startswith(("rm", "create", "start")) for call in calls), calls
        assert not (tmp_path / str(check) / "node0").exists()


def test_force_recreates_the_node_with_a_warning_naming_the_job(tmp_path: Path) -> None:
    result, calls = run_over_a_job(tmp_path, False, force=True)
    assert not result.get("failed"), result
    assert result["warnings"] == ["force=true: recreating node0 stops job train-7 (nodes node0, node1)"]
    assert "exec node0 /bin/bash -c python -m ddp_cluster.supervisor.jobs --stop train-7" in calls
    assert [call.split()[0] for call in calls if call.startswith(("rm", "create", "start"))] == [
        "rm",
        "create",
        "start",
    ]
