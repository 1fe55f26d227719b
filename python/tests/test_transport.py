"""How the controller reaches a node (ddp_cluster.job.transport): the transport on an Ansible action's
connection (a stand-in action here: no Ansible), the local one, and the node's jobs asked through either
(ddp_cluster.job.node_jobs: the command, its answer, a node that does not answer). No container."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.job import node_jobs
from ddp_cluster.job.transport import ActionTransport, Done, Local, Unreachable


class ConnectionFailed(Exception):
    """Stands in for Ansible's AnsibleError."""


class FakeAction:
    """The four methods of Ansible's ActionBase that the transport uses."""

    def __init__(self, stdout: str = "", rc: int = 0, fail: bool = False) -> None:
        self.stdout, self.rc, self.fail = stdout, rc, fail
        self.commands: list[str] = []
        self.transferred: list[tuple[str, str]] = []
        self.removed: list[str] = []

    def _low_level_execute_command(self, command: str) -> dict[str, Any]:
        self.commands.append(command)
        if self.fail:
            raise ConnectionFailed("Failed to connect to the host via ssh: No route to host")
        return {"rc": self.rc, "stdout": self.stdout, "stderr": "oops\n" if self.rc else ""}

    def _make_tmp_path(self) -> str:
        return "/home/u/.ansible/tmp/ansible-tmp-1/"

    def _transfer_file(self, local: str, remote: str) -> str:
        self.transferred.append((local, remote))
        return remote

    def _remove_tmp_path(self, tmp: str) -> None:
        self.removed.append(tmp)


def test_the_action_transport_runs_puts_and_cleans_up_once() -> None:
    action = FakeAction(stdout="hi\n")
    transport = ActionTransport(action, (ConnectionFailed,))
    assert transport.run("echo hi") == Done(0, "hi\n", "")
    assert transport.put("/runs/J1/job.tar.gz") == "/home/u/.ansible/tmp/ansible-tmp-1/job.tar.gz"
    assert transport.put("/runs/J0/epoch-00001.ckpt") == "/home/u/.ansible/tmp/ansible-tmp-1/epoch-00001.ckpt"
    transport.close()
    transport.close()
    assert action.removed == ["/home/u/.ansible/tmp/ansible-tmp-1/"]


def test_a_connection_that_fails_is_unreachable_only_where_the_action_says_so() -> None:
    with pytest.raises(Unreachable, match="No route to host"):
        ActionTransport(FakeAction(fail=True), (ConnectionFailed,)).run("true")
    with pytest.raises(ConnectionFailed):  # the task fails, as Ansible makes it
        ActionTransport(FakeAction(fail=True), ()).run("true")


def test_what_went_wrong_is_the_end_of_stderr_else_stdout_else_the_status() -> None:
    assert Done(1, "out", "err\n").said() == "err"
    assert Done(1, "out\n", "").said() == "out"
    assert Done(3).said() == "rc 3"
    assert Done(1, "", "x" * 600).said() == "x" * 500


def test_the_local_transport_runs_here_and_removes_what_it_put(tmp_path: Path) -> None:
    source = tmp_path / "job.tar.gz"
    source.write_bytes(b"bundle")
    transport = Local()
    copy = Path(transport.put(str(source)))
    assert copy.read_bytes() == b"bundle" and copy != source
    assert transport.run(f"cat {shlex.quote(str(copy))}; exit 3") == Done(3, "bundle", "")
    transport.close()
    assert not copy.exists() and source.exists()


# --- the node's jobs ---


def test_the_command_asks_the_nodes_own_module_and_stops_with_or_without_a_reason() -> None:
    assert node_jobs.command("/workspace/jobs") == (
        ". /etc/ddp-cluster/env.sh && python -m ddp_cluster.supervisor.jobs --jobs-dir /workspace/jobs"
    )
    stop = node_jobs.command("/w s/jobs", "J1", "Ctrl-C on the controller")
    assert shlex.split(stop)[-6:] == [
        "--jobs-dir",
        "/w s/jobs",
        "--stop",
        "J1",
        "--reason",
        "Ctrl-C on the controller",
    ]
    assert shlex.split(node_jobs.command("/w/jobs", "J1", ""))[-2:] == ["--reason", ""]
    assert node_jobs.jobs_dir("/workspace/jobs/J1/") == "/workspace/jobs"


def test_the_answer_is_the_last_json_line() -> None:
    assert node_jobs.parse('warning: x\n{"busy": ["J1"]}\n') == {"busy": ["J1"]}
    assert node_jobs.parse("Traceback (most recent call last):\n  ...\n") is None
    assert node_jobs.parse("{not json\n") is None
    assert node_jobs.parse("[1, 2]\n") is None


def test_a_node_is_asked_in_its_container_and_one_that_does_not_answer_is_down() -> None:
    answer = {"node": "node0", "busy": [], "jobs": {}, "supervisors": {}}
    action = FakeAction(stdout=json.dumps(answer) + "\n")
    assert node_jobs.ask(ActionTransport(action, ()), "node0", "/workspace/jobs") == {
        "changed": False,
        "report": answer,
    }
    assert action.commands[0].startswith("docker exec node0 /bin/bash -c ")
    stopped = node_jobs.ask(ActionTransport(action, ()), "node0", "/workspace/jobs", "J1", "why")
    assert stopped["changed"] is True
    down = node_jobs.ask(ActionTransport(FakeAction(rc=1), ()), "node3", "/workspace/jobs")
    assert down == {"changed": False, "down": "its container does not answer: oops"}


def test_a_server_lost_after_the_put_keeps_its_temporary_folder_and_fails_nothing() -> None:
    class Lost(FakeAction):
        def __init__(self) -> None:
            super().__init__()
            self._connection = type("C", (), {"_shell": type("S", (), {"tmpdir": "/t/"})()})()

        def _remove_tmp_path(self, tmp: str) -> None:
            raise ConnectionFailed("Failed to connect to the host via ssh: No route to host")

    action = Lost()
    transport = ActionTransport(action, (ConnectionFailed,))
    transport.put("/runs/J1/job.tar.gz")
    transport.close()  # the action's own cleanup is not left to try it again on the lost server
    assert action._connection._shell.tmpdir is None


class ShellAction(FakeAction):
    """Runs the command in a shell here, as Ansible's local connection does."""

    def _low_level_execute_command(self, command: str) -> dict[str, Any]:
        self.commands.append(command)
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=60)
        return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def test_a_bounded_command_that_hangs_on_the_server_is_unreachable_and_ended_with_what_it_started() -> None:
    action = ShellAction()
    transport = ActionTransport(action, (ConnectionFailed,), bound=1)
    started = time.monotonic()
    # a child that holds the output open: the whole group ends, or the read would wait for it
    with pytest.raises(Unreachable, match="no answer within 1 s from: sleep 30 & sleep 31; echo late"):
        transport.run("sleep 30 & sleep 31; echo late")
    assert time.monotonic() - started < 15
    assert transport.run("echo 'it''s' quick; exit 3") == Done(3, "its quick\n", "")
    # a command's own status 124 is its own, not the bound's
    assert transport.run("exit 124").rc == 124
    assert action.commands[0].startswith("LC_ALL=C timeout --verbose -k 10 1 /bin/sh -c ")


def test_without_a_bound_the_command_is_sent_as_it_is() -> None:
    action = FakeAction(stdout="x", rc=124)
    assert ActionTransport(action, ()).run("sleep 1") == Done(124, "x", "oops\n")
    assert action.commands == ["sleep 1"]
