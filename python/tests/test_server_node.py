"""ddp_cluster.server.node: a node's `docker create` arguments, its directories and settings file, the
container made, replaced or started by its specification label (against a docker double), and the probe's
lines read on the controller. The node_container role's module runs this code on every server
(tests/unit/test_node_container_module.py runs the module through Ansible; molecule's node_container scenario
and the e2e tests run it against an engine)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.job import node_jobs
from ddp_cluster.server import node
from ddp_cluster.server.node import NodeError

SPEC: dict[str, Any] = {
    "name": "node0",
    "hostname": "node0",
    "image": "ddp-cluster/node:abc",
    "restart_policy": "unless-stopped",
    "init": True,
    "ipc_mode": "host",
    "shm_size": "",
    "ulimits": ["memlock:-1:-1", "stack:67108864:67108864"],
    "runtime": "",
    "env": {"DDP_SSH_PORT": "12345", "ASCEND_VISIBLE_DEVICES": "0,1"},
    "network": "host",
    "aliases": [],
    "etc_hosts": {"node1": "10.0.0.2", "node0": "10.0.0.1"},
    "volumes": ["/var/lib/ddp-cluster/node0/workspace:/workspace"],
    "devices": ["/dev/infiniband:/dev/infiniband:rwm"],
    "device_requests": [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}],
    "labels": {"ddp-cluster.node": "node0"},
}

# A docker CLI double, its state in the files of $STATE: `image inspect` prints image_id (absent: no such
# image), `container inspect` the JSON in container (absent: no such container), `exec` prints probe, or for
# the jobs command (`exec NAME /bin/bash -c ...`) the next line of jobs (failing when it is no JSON); each
# call is logged in calls.
DOCKER = """#!/bin/sh
echo "$*" >> "$STATE/calls"
case "$1 $2" in
  "image inspect") [ -f "$STATE/image_id" ] && exec cat "$STATE/image_id"; echo "No such image" >&2; exit 1;;
  "container inspect") [ -f "$STATE/container" ] && exec cat "$STATE/container"; echo "No such" >&2; exit 1;;
esac
case "$1 $3" in
  # The node's jobs command: the first answer of $STATE/jobs, consumed while more follow.
  "exec /bin/bash") line=$(head -n 1 "$STATE/jobs")
    [ "$(wc -l < "$STATE/jobs")" -gt 1 ] && sed -i 1d "$STATE/jobs"
    echo "$line"; case "$line" in "{"*) exit 0;; *) exit 1;; esac;;
esac
case "$1" in
  exec) cat "$STATE/probe"; exit 0;;
esac
exit 0
"""


def pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[index + 1] for index, word in enumerate(argv) if word == flag]


def test_create_arguments_carry_the_whole_specification() -> None:
    argv = node.run_argv(SPEC, '{"the":"label"}')
    assert argv[:5] == ["create", "--name", "node0", "--hostname", "node0"]
    assert argv[-1] == "ddp-cluster/node:abc"
    assert "--init" in argv and "--shm-size" not in argv and "--runtime" not in argv
    assert pairs(argv, "--ulimit") == ["memlock=-1:-1", "stack=67108864:67108864"]
    assert pairs(argv, "--env") == ["ASCEND_VISIBLE_DEVICES=0,1", "DDP_SSH_PORT=12345"]
    assert pairs(argv, "--add-host") == ["node0:10.0.0.1", "node1:10.0.0.2"]
    assert pairs(argv, "--network") == ["host"] and pairs(argv, "--ipc") == ["host"]
    assert pairs(argv, "--device") == ["/dev/infiniband:/dev/infiniband:rwm"]
    assert pairs(argv, "--gpus") == ["count=all,driver=nvidia,capabilities=gpu"]
    assert pairs(argv, "--label") == ["ddp-cluster.node=node0", 'ddp-cluster.spec={"the":"label"}']


@pytest.mark.parametrize(
    ("request_", "option"),
    [
        (
            {"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]},
            "count=all,driver=nvidia,capabilities=gpu",
        ),
        ({"count": 2}, "count=2"),
        (
            {"device_ids": ["0", "3"], "capabilities": [["gpu", "utility"]]},
            '"device=0,3","capabilities=gpu,utility"',
        ),
    ],
)
def test_device_requests_become_the_cli_gpus_option(request_: dict[str, Any], option: str) -> None:
    assert node.gpus_option(request_) == option


def test_two_capability_sets_and_options_are_refused() -> None:
    with pytest.raises(NodeError, match="more than one set of capabilities"):
        node.gpus_option({"capabilities": [["gpu"], ["compute"]]})
    with pytest.raises(NodeError, match="options are not supported"):
        node.gpus_option({"options": {"a": "b"}})


def params(tmp_path: Path, content: str = "x\n") -> dict[str, Any]:
    etc = tmp_path / "node0" / "etc"
    return {
        "directories": [{"path": str(etc), "mode": "0755"}],
        "settings": {"path": str(etc / "node.env"), "content": content, "mode": "0644"},
        "container": SPEC,
        "sshd": {"port": 12345, "timeout": 5, "probe": "true", "files": []},
    }


def test_without_a_docker_cli_nothing_is_touched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NodeError, match="docker CLI is not on this server's PATH"):
        node.bring_up(params(tmp_path), check=False)
    assert not (tmp_path / "node0").exists()


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The docker double first on PATH; its state directory."""
    state = tmp_path / "engine"
    state.mkdir()
    double = tmp_path / "bin" / "docker"
    double.parent.mkdir()
    double.write_text(DOCKER)
    double.chmod(0o755)
    monkeypatch.setenv("PATH", f"{double.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STATE", str(state))
    (state / "probe").write_text("port 12345\nddp-node interface: eth0\n")
    return state


def calls(state: Path) -> list[str]:
    path = state / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_check_mode_without_the_image_says_what_it_would_do_and_changes_nothing(
    tmp_path: Path, engine: Path
) -> None:
    result = node.bring_up(params(tmp_path), check=True)
    assert result["changed"] and result["sshd"] == [] and result["container_changed"]
    assert (
        result["actions"][-1]
        == "would create container node0 from ddp-cluster/node:abc (not on this engine yet)"
    )
    assert not (tmp_path / "node0").exists()
    assert [call.split()[0] for call in calls(engine)] == ["image", "container"]


def test_a_missing_image_is_refused_outside_check_mode(tmp_path: Path, engine: Path) -> None:
    with pytest.raises(NodeError, match="run the image stage first"):
        node.bring_up(params(tmp_path), check=False)


def test_the_node_is_made_once_then_left_running_then_replaced_when_its_specification_changes(
    tmp_path: Path, engine: Path
) -> None:
    (engine / "image_id").write_text("sha256:1\n")
    first = node.bring_up(params(tmp_path), check=False)
    etc = tmp_path / "node0" / "etc"
    assert stat.S_IMODE(etc.stat().st_mode) == 0o755
    assert (etc / "node.env").read_text() == "x\n" and stat.S_IMODE(
        (etc / "node.env").stat().st_mode
    ) == 0o644
    assert first["actions"] == [
        f"created directory {etc}",
        f"created {etc / 'node.env'}",
        "created and started container node0 from ddp-cluster/node:abc",
    ]
    assert first["container_changed"] and first["sshd"] == ["port 12345", "ddp-node interface: eth0"]
    created = next(call for call in calls(engine) if call.startswith("create "))
    label = created.split("ddp-cluster.spec=", 1)[1].rsplit(" ", 1)[0]
    assert json.loads(label)["image_id"] == "sha256:1"
    # The container runs under that label: nothing to do.
    (engine / "container").write_text(
        json.dumps([{"Config": {"Labels": {node.SPEC_LABEL: label}}, "State": {"Running": True}}])
    )
    (engine / "calls").unlink()
    again = node.bring_up(params(tmp_path), check=False)
    assert not again["changed"] and again["actions"] == [] and not again["container_changed"]
    assert not any(call.startswith(("create", "rm", "start")) for call in calls(engine))
    # A new image: removed and created again; in check mode only said, with the diff of the specification.
    (engine / "image_id").write_text("sha256:2\n")
    checked = node.bring_up(params(tmp_path), check=True)
    assert checked["actions"] == [
        "removed container node0 (its specification differs)",
        "created and started container node0 from ddp-cluster/node:abc",
    ]
    assert checked["sshd"] == []
    assert checked["diff"]["before"]["container"]["image_id"] == "sha256:1"
    assert checked["diff"]["after"]["container"]["image_id"] == "sha256:2"
    assert not any(call.startswith(("create", "rm")) for call in calls(engine))
    node.bring_up(params(tmp_path), check=False)
    assert [call.split()[0] for call in calls(engine) if call.startswith(("rm", "create", "start"))] == [
        "rm",
        "create",
        "start",
    ]


def test_a_stopped_node_is_started_and_a_changed_settings_file_rewritten(
    tmp_path: Path, engine: Path
) -> None:
    (engine / "image_id").write_text("sha256:1\n")
    node.bring_up(params(tmp_path), check=False)
    created = next(call for call in calls(engine) if call.startswith("create "))
    label = created.split("ddp-cluster.spec=", 1)[1].rsplit(" ", 1)[0]
    (engine / "container").write_text(
        json.dumps([{"Config": {"Labels": {node.SPEC_LABEL: label}}, "State": {"Running": False}}])
    )
    result = node.bring_up(params(tmp_path, content="y\n"), check=False)
    settings = tmp_path / "node0" / "etc" / "node.env"
    assert result["actions"] == [f"wrote {settings}", "started container node0"]
    assert settings.read_text() == "y\n"
    assert result["diff"]["before"]["settings"] == "x\n" and result["diff"]["after"]["settings"] == "y\n"


def test_a_file_where_a_directory_belongs_is_refused(tmp_path: Path) -> None:
    (tmp_path / "node0").mkdir()
    (tmp_path / "node0" / "etc").write_text("")
    with pytest.raises(NodeError, match="exists and is not a directory"):
        node.directories(params(tmp_path)["directories"], check=False)


SSHD = {"port": 12345, "timeout": 30}
GOOD = [
    "port 12345",
    "passwordauthentication no",
    "kbdinteractiveauthentication no",
    "permitrootlogin without-password",
    "authorizedkeysfile /etc/ddp-cluster/authorized_keys",
    "permituserrc no",
]


def test_sshd_that_did_not_answer_or_is_misconfigured_is_named() -> None:
    assert node.sshd_failure("n0", "node0", SSHD, [*GOOD, "usepam no"], "") == ""
    silent = node.sshd_failure("n0", "node0", SSHD, [], "")
    assert silent == (
        "n0: sshd in container node0 did not answer on port 12345 within 30 s (no output): read "
        "`docker logs node0` on the server"
    )
    assert "(connection refused)" in node.sshd_failure("n0", "node0", SSHD, [], "connection refused")
    loose = node.sshd_failure("n0", "node0", SSHD, [*GOOD[:1], "passwordauthentication yes", *GOOD[2:]], "")
    assert loose.startswith("n0: sshd in container node0 is not configured as the cluster needs")
    assert "it lacks ['passwordauthentication no']" in loose and "'passwordauthentication yes'" in loose
    # a key a job left in root's ~/.ssh must not let anyone in: the mesh's file alone
    homes = [line for line in GOOD if not line.startswith("authorizedkeysfile")]
    homes.append("authorizedkeysfile .ssh/authorized_keys .ssh/authorized_keys2")
    opened = node.sshd_failure("n0", "node0", SSHD, homes, "")
    assert "it lacks ['authorizedkeysfile /etc/ddp-cluster/authorized_keys']" in opened
    assert "'authorizedkeysfile .ssh/authorized_keys .ssh/authorized_keys2'" in opened


def test_sshd_must_listen_on_the_nodes_cluster_address_only() -> None:
    listen = {**SSHD, "listen": "10.0.0.5"}
    assert node.sshd_failure("n0", "node0", listen, [*GOOD, "listenaddress 10.0.0.5:12345"], "") == ""
    everywhere = node.sshd_failure("n0", "node0", listen, [*GOOD, "listenaddress 0.0.0.0:12345"], "")
    assert "(port 12345 on 10.0.0.5 only," in everywhere
    assert (
        "it lacks ['listenaddress 10.0.0.5:12345']" in everywhere
        and "'listenaddress 0.0.0.0:12345'" in everywhere
    )
    assert node.expected_sshd(22, "fd00::5")[1] == "listenaddress [fd00::5]:22"


def test_the_probe_lines_give_the_record_the_host_keys_and_the_files() -> None:
    lines = [
        *GOOD,
        "ddp-node interface: eth1",
        "ddp-node address: 10.0.0.5/24",
        "ddp-node cpu-binding: 0=0-23;1=24-47",
        "ddp-node file: abc123 600 /root/.ssh/id_ddp_cluster",
        "ddp-node file: malformed",
        "ddp-node host-key-ed25519: ssh-ed25519 AAAA",
        "ddp-node host-key-rsa: ",
    ]
    probe = node.probe_lines(lines)
    assert probe[0] == ("interface", "eth1")
    assert node.host_keys(probe) == {"ed25519": "ssh-ed25519 AAAA"}
    assert node.files_of(probe) == {"/root/.ssh/id_ddp_cluster": {"sha256": "abc123", "mode": 0o600}}
    record = json.loads(node.record_of(probe, "/var/lib/ddp-cluster/n0/workspace", "/workspace"))
    assert record == {
        "interface": "eth1",
        "address": "10.0.0.5/24",
        "network": "10.0.0.0/24",
        "cpu_binding": "0=0-23;1=24-47",
        "workspace": "/var/lib/ddp-cluster/n0/workspace",
        "container_workspace": "/workspace",
        "host_keys": {"ed25519": "ssh-ed25519 AAAA"},
    }
    assert node.record_of(probe, "w", "c").endswith("}\n")


# --- a running job stops nothing: the node is refused, waited for or forced --------------------------------

JOB_REPORT = {
    "busy": ["train-7"],
    "jobs": {
        "train-7": {"nodes": ["node0", "node1"], "status": {"state": "running"}},
        "old": {"nodes": ["node0"]},
    },
}
FREE_REPORT = {"busy": [], "jobs": {"old": {"nodes": ["node0"]}}}
JOBS_COMMAND = ". /etc/ddp-cluster/env.sh && python -m ddp_cluster.supervisor.jobs --jobs-dir /workspace/jobs"


def label_of(image_id: str) -> str:
    return json.dumps({**SPEC, "image_id": image_id}, sort_keys=True, separators=(",", ":"))


@pytest.fixture
def job_engine(engine: Path) -> Path:
    """A container made from an earlier image (sha256:1) that runs, the engine's image now sha256:2 (so the
    container would be recreated), and a node whose jobs command answers JOB_REPORT."""
    (engine / "image_id").write_text("sha256:2\n")
    (engine / "container").write_text(
        json.dumps(
            [{"Config": {"Labels": {node.SPEC_LABEL: label_of("sha256:1")}}, "State": {"Running": True}}]
        )
    )
    answers(engine, JOB_REPORT)
    return engine


def answers(engine: Path, *reports: dict[str, Any] | str) -> None:
    """The node's answers to the jobs command, one per call, the last one repeated (a str: printed as is)."""
    lines = [report if isinstance(report, str) else json.dumps(report) for report in reports]
    (engine / "jobs").write_text("\n".join(lines) + "\n")


def with_jobs(tmp_path: Path, **jobs: Any) -> dict[str, Any]:
    stop = f"{JOBS_COMMAND} --stop '{{job}}' --reason 'stopped by site.yml -e force=true'"
    return {
        **params(tmp_path),
        "jobs": {"command": JOBS_COMMAND, "stop_command": stop, "wait_timeout": 3600, **jobs},
    }


def changes(state: Path) -> list[str]:
    return [call.split()[0] for call in calls(state) if call.startswith(("rm", "create", "start"))]


def test_the_nodes_answer_is_read_as_the_controller_reads_it() -> None:
    output = "a warning first\n" + json.dumps(JOB_REPORT) + "\n"
    assert node.busy_jobs(output) == {"train-7": ["node0", "node1"]}
    assert node.busy_jobs(output) == node_jobs.busy(node_jobs.parse(output) or {})
    assert node.busy_jobs(json.dumps({"busy": ["x"]})) == {"x": []}
    assert node.busy_jobs("no JSON here") is None and node.busy_jobs("{not json") is None


def test_a_container_running_a_job_is_refused_by_name_and_nothing_changes(
    tmp_path: Path, job_engine: Path
) -> None:
    for check in (False, True):
        with pytest.raises(NodeError) as refused:
            node.bring_up(with_jobs(tmp_path), check=check)
        message = str(refused.value)
        assert message.startswith(
            "job train-7 (nodes node0, node1) runs on node0, and its container would be recreated (its "
            "specification changed)"
        ), message
        assert "node0 was refused, nothing was changed on it" in message
        assert "`ansible-playbook jobs.yml -e stop=train-7`" in message
        assert "-e wait=true" in message and "node_container_wait_timeout=3600 s" in message
        assert "-e force=true" in message
    assert not (tmp_path / "node0").exists(), "a refused node's directories were made"
    assert changes(job_engine) == []
    asked = [call for call in calls(job_engine) if call.startswith("exec ")]
    assert asked == [f"exec node0 /bin/bash -c {JOBS_COMMAND}"] * 2


def test_check_mode_before_a_new_image_is_built_reports_the_refusal_too(
    tmp_path: Path, job_engine: Path
) -> None:
    (job_engine / "image_id").unlink()  # the image stage, in check mode, only said it would build it
    with pytest.raises(NodeError, match=r"^job train-7 \(nodes node0, node1\) runs on node0"):
        node.bring_up(with_jobs(tmp_path), check=True)
    answers(job_engine, FREE_REPORT)
    result = node.bring_up(with_jobs(tmp_path), check=True)
    assert result["actions"][-2:] == [
        "removed container node0 (its specification differs)",
        "would create container node0 from ddp-cluster/node:abc (not on this engine yet)",
    ]
    assert result["diff"]["before"]["container"]["image_id"] == "sha256:1" and changes(job_engine) == []


def test_force_stops_the_job_then_recreates_it_and_says_which_job_it_stops(
    tmp_path: Path, job_engine: Path
) -> None:
    checked = node.bring_up(with_jobs(tmp_path, force=True), check=True)
    assert checked["warnings"] == ["force=true: recreating node0 would stop job train-7 (nodes node0, node1)"]
    assert changes(job_engine) == [] and not any("--stop" in call for call in calls(job_engine))
    result = node.bring_up(with_jobs(tmp_path, force=True), check=False)
    assert result["warnings"] == ["force=true: recreating node0 stops job train-7 (nodes node0, node1)"]
    assert result["actions"][0] == "stopped job train-7 (force=true)"
    stops = [call for call in calls(job_engine) if "--stop" in call]
    assert stops == [
        f"exec node0 /bin/bash -c {JOBS_COMMAND} --stop 'train-7' "
        "--reason 'stopped by site.yml -e force=true'"
    ]
    assert result["container_changed"] and changes(job_engine) == ["rm", "create", "start"]
    # The job is stopped before its container goes.
    order = [call.split()[0] for call in calls(job_engine) if "--stop" in call or call.startswith("rm")]
    assert order == ["exec", "rm"]


def test_a_stop_that_fails_is_said_and_the_node_recreated_anyway(tmp_path: Path, job_engine: Path) -> None:
    answers(job_engine, JOB_REPORT, "python: No module named ddp_cluster.supervisor.jobs")
    result = node.bring_up(with_jobs(tmp_path, force=True), check=False)
    assert result["warnings"][1:] == [
        "node0: job train-7 did not stop cleanly (python: No module named ddp_cluster.supervisor.jobs): "
        "removing it"
    ]
    assert changes(job_engine) == ["rm", "create", "start"]


def test_wait_looks_again_until_the_job_ended_then_recreates(tmp_path: Path, job_engine: Path) -> None:
    answers(job_engine, JOB_REPORT, JOB_REPORT, FREE_REPORT)
    checked = node.bring_up(with_jobs(tmp_path, wait=True, poll=0.01), check=True)
    assert checked["actions"][0] == (
        "would wait for job train-7 (nodes node0, node1) to end (at most 3600 s), then recreate"
    )
    assert changes(job_engine) == [] and len(calls(job_engine)) == 3  # image, container, one look: no wait
    result = node.bring_up(with_jobs(tmp_path, wait=True, poll=0.01), check=False)
    assert result["actions"][0].startswith("waited ") and result["actions"][0].endswith(
        "s for job train-7 (nodes node0, node1) to end"
    )
    looks = [call for call in calls(job_engine) if call.startswith("exec node0 /bin/bash")]
    assert len(looks) == 3  # check mode's (busy), then busy and free
    assert changes(job_engine) == ["rm", "create", "start"] and result["warnings"] == []


def test_wait_gives_up_after_its_bound_and_changes_nothing(tmp_path: Path, job_engine: Path) -> None:
    with pytest.raises(NodeError, match=r"job train-7 \(nodes node0, node1\) still runs on node0 after 0 s"):
        node.bring_up(with_jobs(tmp_path, wait=True, wait_timeout=0.05, poll=0.01), check=False)
    assert changes(job_engine) == [] and not (tmp_path / "node0").exists()


def test_a_node_without_a_job_is_recreated_without_a_word(tmp_path: Path, job_engine: Path) -> None:
    answers(job_engine, FREE_REPORT)
    result = node.bring_up(with_jobs(tmp_path), check=False)
    assert result["warnings"] == [] and changes(job_engine) == ["rm", "create", "start"]


def test_a_node_that_does_not_answer_runs_no_job_and_a_warning_says_so(
    tmp_path: Path, job_engine: Path
) -> None:
    answers(job_engine, "OCI runtime exec failed: no such file")
    result = node.bring_up(with_jobs(tmp_path), check=False)
    assert result["warnings"] == [
        "node0: could not ask the node which jobs run there (OCI runtime exec failed: no such file): "
        "recreating it"
    ]
    assert changes(job_engine) == ["rm", "create", "start"]


def test_jobs_are_asked_only_of_a_running_container_that_would_be_recreated(
    tmp_path: Path, job_engine: Path
) -> None:
    # Stopped: nothing runs in it.
    (job_engine / "container").write_text(
        json.dumps(
            [{"Config": {"Labels": {node.SPEC_LABEL: label_of("sha256:1")}}, "State": {"Running": False}}]
        )
    )
    node.bring_up(with_jobs(tmp_path), check=False)
    assert changes(job_engine) == ["rm", "create", "start"]
    # Unchanged and running: left alone, and the node is not asked (a second site.yml stays at one exec).
    (job_engine / "container").write_text(
        json.dumps(
            [{"Config": {"Labels": {node.SPEC_LABEL: label_of("sha256:2")}}, "State": {"Running": True}}]
        )
    )
    (job_engine / "calls").unlink()
    again = node.bring_up(with_jobs(tmp_path), check=False)
    assert not again["changed"] and again["warnings"] == []
    assert [call.split()[0] for call in calls(job_engine)] == ["image", "container", "exec"]
    assert not any("/bin/bash" in call for call in calls(job_engine))
