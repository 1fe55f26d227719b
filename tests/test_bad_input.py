"""Bad input stops site.yml in preflight with a message naming what is wrong, before anything changes."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import STATE_DIR, PlaybookResult, docker, recap_json, run_playbook


def assert_stopped_before_any_change(result: PlaybookResult, message: str) -> None:
    assert result.rc != 0, result.stdout[-3000:]
    assert message in result.stdout, result.stdout[-3000:]
    assert result.changed_hosts() == {}, recap_json(result)
    # The stop came from preflight: no stage after it ran.
    assert "TASK [training_image" not in result.stdout
    assert "TASK [node_container" not in result.stdout


@pytest.mark.parametrize(
    ("extravars", "message"),
    [
        ({"cluster_accelerator": "tpu"}, "cluster_accelerator=tpu is unknown: use cpu, npu or gpu"),
        ({"cluster_ssh_port": 70000}, "cluster_ssh_port=70000 is not a port"),
        ({"cluster_master_port": "http"}, "cluster_master_port=http is not a port"),
        ({"cluster_nproc_per_node": 0}, "cluster_nproc_per_node=0 is not allowed"),
        ({"cluster_accelerator": "npu", "cluster_nproc_per_node": 3}, "(npu: 1, 2, 4 or 8)"),
        ({"cluster_master_port": 12345}, "cluster_ssh_port and cluster_master_port are both 12345"),
        ({"cluster_network_mode": "host"}, "every node needs a machine of its own"),
    ],
    ids=[
        "accelerator",
        "port-range",
        "port-not-number",
        "nproc-zero",
        "npu-nproc",
        "same-ports",
        "host-net-shared",
    ],
)
def test_bad_setting_is_named(extravars: dict[str, object], message: str) -> None:
    assert_stopped_before_any_change(run_playbook("site.yml", extravars=extravars), message)


def test_zero_nodes_is_refused() -> None:
    result = run_playbook("site.yml", env={"DDP_LOCAL_NODES": "0"})
    assert result.rc != 0
    assert "DDP_LOCAL_NODES=0 is out of range" in result.stdout


def test_missing_docker_engine_is_named() -> None:
    result = run_playbook("site.yml", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert_stopped_before_any_change(result, "no Docker engine answers")


def said(result: PlaybookResult) -> str:
    """The playbook's output on one line, as written (Ansible wraps a long message and doubles a quote)."""
    return " ".join(result.stdout.split()).replace("''", "'")


def nodes_state() -> dict[str, tuple[str, str]]:
    """Each node's container (id and start time) and its node.env, as they are now."""
    return {
        node: (
            docker("inspect", "-f", "{{.Id}} {{.State.StartedAt}}", node).stdout.strip(),
            (STATE_DIR / node / "etc" / "node.env").read_text(),
        )
        for node in ("node0", "node1")
    }


# Before test_taken_port_is_named, which takes node0 away: these two need the cluster that local_cluster made.
def test_an_env_name_that_is_no_shell_name_is_refused_with_the_nodes_untouched(
    local_cluster: PlaybookResult,
) -> None:
    before = nodes_state()
    result = run_playbook("site.yml", extravars={"node_container_env": {"NCCL-DEBUG": "INFO", "OK": "1"}})
    assert result.rc != 0
    assert "node_container_env: 'NCCL-DEBUG' is not a variable name" in said(result), result.stdout[-3000:]
    assert "rename it, e.g. NCCL_DEBUG" in said(result)
    # refused in site.yml's preflight stage: no task of any later stage (hosts, image, containers) ran,
    # node.env is as it was, no container was made again or restarted
    assert "TASK [Check the names of the variables the node containers export]" in result.stdout
    staged = ("TASK [cluster_host", "TASK [training_image", "TASK [node_container", "TASK [ssh_mesh")
    assert not [line for line in result.stdout.splitlines() if line.startswith(staged)]
    assert nodes_state() == before


def test_a_bad_job_request_is_refused_naming_it(local_cluster: PlaybookResult, tmp_path: Path) -> None:
    result = run_playbook("train.yml", extravars={"nodes": 2, "script_args": "--output-dir /tmp/x"})
    assert result.rc != 0
    assert "script_args sets --output-dir, which the entrypoint's launcher owns" in said(result), (
        result.stdout[-3000:]
    )
    assert "TASK [ddp_job : Start the job" not in result.stdout
    outside, project = tmp_path / "outside", tmp_path / "project"
    outside.mkdir()
    (outside / "data.csv").write_text("1,2\n")
    project.mkdir()
    (project / "train.py").write_text("print('never run')\n")
    (project / "data").symlink_to(outside)
    result = run_playbook("train.yml", extravars={"nodes": 2, "workdir": str(project), "script": "train.py"})
    assert result.rc != 0
    assert f"data is a link to {outside}, outside the directory" in said(result), result.stdout[-3000:]
    assert "-e workdir_follow_links=true" in said(result)
    assert "TASK [ddp_job : Start the job" not in result.stdout


def test_a_typo_of_a_setting_is_refused_naming_the_one_meant(local_cluster: PlaybookResult) -> None:
    result = run_playbook("train.yml", extravars={"node": 2, "max_restart": 1})
    assert result.rc != 0
    assert "-e node: train.yml has no setting 'node'; did you mean -e nodes=...?" in said(result), (
        result.stdout[-3000:]
    )
    assert "did you mean -e max_restarts=...?" in said(result)
    assert "TASK [ddp_job : Start the job" not in result.stdout
    listed = run_playbook("jobs.yml", extravars={"stpo": "some-job"})
    assert listed.rc != 0
    assert "-e stpo: jobs.yml has no setting 'stpo'; did you mean -e stop=...?" in said(listed), (
        listed.stdout[-3000:]
    )
    assert "TASK [Read each node's jobs" not in listed.stdout


@pytest.fixture
def taken_port() -> Iterator[int]:
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen(1)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def test_taken_port_is_named(taken_port: int) -> None:
    # One node on the host network (a real server's layout), whose ssh port something else holds.
    docker("rm", "-f", "node0", check=False)
    result = run_playbook(
        "site.yml",
        extravars={"cluster_network_mode": "host", "cluster_ssh_port": taken_port},
        env={"DDP_LOCAL_NODES": "1"},
    )
    assert_stopped_before_any_change(result, "a port the cluster pins is taken")
    assert str(taken_port) in result.stdout
