"""The check before a job made by its first node for every node (ddp_cluster.job.node_check.check_nodes on the
controller's side, ddp_cluster.supervisor.check in the first node): one command to the first node's server
whatever the node count, each node's problems named as the per-node check names them, the busy nodes asked
again with wait_for_nodes, a node that does not answer over the mesh named down. No container."""

from __future__ import annotations

import base64
import json
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ddp_cluster.job import node_check
from ddp_cluster.job.node_check import check_nodes, fanout_answers, fanout_command, node_script
from ddp_cluster.job.transport import Done
from ddp_cluster.supervisor import check, remote

JOB_DIR = "/workspace/jobs/J1"


def report(node: str, busy: str = "") -> str:
    jobs = {busy: {"nodes": [node], "status": None}} if busy else {}
    return json.dumps({"node": node, "jobs": jobs, "busy": [busy] if busy else [], "supervisors": {}})


def plan(nodes: list[str], **changes: Any) -> dict[str, Any]:
    return {
        "id": "J1",
        "first": nodes[0],
        "nodes": nodes,
        "master_port": 29501,
        "job_dir": JOB_DIR,
        "host_dirs": {node: f"/srv/{node}/workspace/jobs/J1" for node in nodes},
        "timeout": 60,
        "world_size": len(nodes),
        **changes,
    }


class FirstNode:
    """The first node's server: each call is the first node's container checking the listed nodes, whose
    answers ``said(node, call)`` gives (None: the node does not answer over the mesh)."""

    def __init__(self, said: Any) -> None:
        self.said = said
        self.commands: list[str] = []

    def run(self, command: str) -> Done:
        self.commands.append(command)
        inner = shlex.split(command)[-1]  # docker exec NODE /bin/bash -c INNER
        words = shlex.split(inner.split("&&", 1)[1])
        nodes = words[words.index("--nodes") + 1].split(",")
        answers = {}
        for node in nodes:
            out = self.said(node, len(self.commands))
            answers[node] = out if out is not None else check.NO_ANSWER.format(me=nodes[0])
        return Done(0, json.dumps({"answers": answers}) + "\n")

    def put(self, local: str) -> str:
        raise AssertionError("a check puts no file")

    def close(self) -> None:
        pass


def idle(node: str, call: int) -> str:
    return f"{report(node)}\nup\n"


def test_forty_nodes_are_checked_with_one_command_on_the_first_nodes_server() -> None:
    nodes = [f"node{index}" for index in range(40)]
    first = FirstNode(idle)
    assert check_nodes(plan(nodes), first, say=print) == {"changed": False, "checked": 40, "waited": False}
    assert len(first.commands) == 1
    assert first.commands[0].startswith("docker exec node0 /bin/bash -c ")


def test_each_nodes_problem_is_named_with_its_fix_in_the_nodes_order() -> None:
    nodes = ["node0", "node1", "node2", "node3"]

    def said(node: str, call: int) -> str | None:
        return {
            "node0": f"listening: LISTEN 0 128 0.0.0.0:29501\n{report(node)}\nup\n",
            "node1": None,
            "node2": f"{node_check.EXISTS}{JOB_DIR}\n{report(node)}\nup\n",
            "node3": f"{report(node, busy='J9')}\nup\n",
        }[node]

    result = check_nodes(plan(nodes), FirstNode(said), say=print)
    message = result["msg"]
    assert result["failed"] is True
    assert "node0: the master port 29501 is taken" in message
    assert (
        "node1: the node container node1 does not run (down: no answer over the mesh's ssh from node0)"
        in (message)
    )
    # named as on the node's server, where the user finds it
    assert "node2: the job's directory /srv/node2/workspace/jobs/J1 is there already" in message
    assert "node3 runs another job: job J9" in message
    assert (
        message.index("node0:") < message.index("node1:") < message.index("node2:") < message.index("node3")
    )


def test_with_wait_for_nodes_only_the_busy_nodes_are_asked_again_until_free() -> None:
    nodes = ["node0", "node1", "node2"]
    said_lines: list[str] = []
    slept: list[float] = []

    def said(node: str, call: int) -> str:
        return f"{report(node, busy='J9' if node == 'node2' and call <= 2 else '')}\nup\n"

    first = FirstNode(said)
    result = check_nodes(plan(nodes, wait_for_nodes=True), first, say=said_lines.append, sleep=slept.append)
    assert result == {"changed": False, "checked": 3, "waited": True}
    assert said_lines == ["node2: runs job J9: waiting for it (wait=true)"]
    assert slept == [node_check.BUSY_POLL] * 2
    asked = [shlex.split(shlex.split(c)[-1].split("&&", 1)[1]) for c in first.commands]
    assert [words[words.index("--nodes") + 1] for words in asked] == ["node0,node1,node2", "node2", "node2"]


def test_the_first_nodes_container_down_is_named_and_nothing_else_is_asked() -> None:
    class Down(FirstNode):
        def run(self, command: str) -> Done:
            self.commands.append(command)
            return Done(1, "", "Error response from daemon: container node0 is not running\n")

    down = Down(idle)
    result = check_nodes(plan(["node0", "node1"]), down, say=print)
    assert result["failed"] is True and len(down.commands) == 1
    assert result["msg"].startswith(
        "node0: the node container node0 does not run (Error response from daemon"
    )


def test_the_first_node_going_down_while_a_busy_node_is_waited_for_fails_the_check() -> None:
    class GoesDown(FirstNode):
        def run(self, command: str) -> Done:
            if len(self.commands) >= 1:
                self.commands.append(command)
                return Done(1, "", "Error response from daemon: container node0 is not running\n")
            return super().run(command)

    def said(node: str, call: int) -> str:
        return f"{report(node, busy='J9' if node == 'node1' else '')}\nup\n"

    result = check_nodes(
        plan(["node0", "node1"], wait_for_nodes=True), GoesDown(said), say=print, sleep=print
    )
    assert result["failed"] is True
    assert result["msg"].startswith("node0: the node container node0 does not run"), result


def test_the_answers_line_is_read_past_other_output() -> None:
    line = json.dumps({"answers": {"a": "x\nup\n"}})
    assert fanout_answers(f"a warning\n{line}\n", ["a", "b"]) == {"a": "x\nup\n", "b": ""}
    assert fanout_answers("no json", ["a", "b"]) is None


def test_only_the_first_node_looks_at_the_master_port_and_the_backlog() -> None:
    command = fanout_command("node0", ["node0", "node1"], 29501, "/workspace/jobs", JOB_DIR)
    words = shlex.split(shlex.split(command)[-1].split("&&", 1)[1])
    first = base64.b64decode(words[words.index("--first") + 1]).decode()
    others = base64.b64decode(words[words.index("--command") + 1]).decode()
    assert "sport = :29501" in first and node_check.BACKLOG in first
    assert "sport" not in others and node_check.BACKLOG not in others
    assert others == node_script(None, "/workspace/jobs", JOB_DIR) and "docker" not in others


class Mesh(remote.Mesh):
    """The first node's mesh: this node runs in a shell; the others answer from ``answers``; a fresh login
    to a node not in ``answers`` fails as ssh says ``refusal`` (the real ``send`` runs it)."""

    def __init__(
        self, me: str, answers: Mapping[str, str], refusal: str = "Host key verification failed."
    ) -> None:
        super().__init__(me)
        self.answers = answers
        self.refusal = refusal
        self.asked: list[tuple[tuple[str, ...], str]] = []

    def run(self, node: str, command: str) -> str:
        assert node == self.me
        return subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=False).stdout

    def run_on(self, nodes: Any, command: str, pool: Any) -> dict[str, str]:
        self.asked.append((tuple(nodes), command))
        return {node: self.answers.get(node, "") for node in nodes}

    def ssh(self, node: str, *options: str) -> list[str]:
        assert "ControlPath=none" in options  # the reason is asked on a login of its own
        if node in self.answers:
            return ["/bin/sh", "-c", "exit 0", "--"]
        return ["/bin/sh", "-c", f"echo {shlex.quote(self.refusal)} >&2; exit 255", "--"]


def test_the_first_node_runs_its_own_command_itself_and_the_others_at_once() -> None:
    mesh = Mesh("node0", {"node1": "one\nup\n"})
    with ThreadPoolExecutor(max_workers=4) as pool:
        nodes = ["node0", "node1", "node2"]
        answers = check.check_all(mesh, nodes, "echo first; echo up", "echo other", pool)
    assert answers == {
        "node0": "first\nup\n",
        "node1": "one\nup\n",
        "node2": check.NO_ANSWER.format(me="node0") + ": Host key verification failed.",
    }
    assert mesh.asked == [(("node1", "node2"), "echo other")]


def test_a_node_that_does_not_answer_is_named_with_ssh_s_reason() -> None:
    mesh = Mesh("node0", {}, refusal="ssh: connect to host node1 port 2222: Connection refused")
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = check.check_all(mesh, ["node0", "node1"], "echo up", "echo up", pool)
    said = answers["node1"]
    message = node_check.problems("node1", "node1", said, None, [])
    assert message == [
        "node1: the node container node1 does not run (down: no answer over the mesh's ssh from node0: ssh:"
        " connect to host node1 port 2222: Connection refused): bring the cluster up with `ansible-playbook"
        " site.yml`, then run train.yml again."
    ]


def test_the_first_node_is_named_by_the_plan_not_by_its_hostname() -> None:
    command = fanout_command("n0", ["n0", "n1"], 29501, "/workspace/jobs", JOB_DIR)
    words = shlex.split(shlex.split(command)[-1].split("&&", 1)[1])
    assert words[words.index("--me") + 1] == "n0"


def test_every_busy_node_is_announced_once() -> None:
    said_lines: list[str] = []

    def said(node: str, call: int) -> str:
        busy = {"node1": "J8", "node2": "J9"}.get(node, "") if call <= 2 else ""
        return f"{report(node, busy=busy)}\nup\n"

    result = check_nodes(
        plan(["node0", "node1", "node2"], wait_for_nodes=True),
        FirstNode(said),
        say=said_lines.append,
        sleep=print,
    )
    assert result["waited"] is True
    assert said_lines == [
        "node1: runs job J8: waiting for it (wait=true)",
        "node2: runs job J9: waiting for it (wait=true)",
    ]


def test_a_thousand_nodes_down_are_counted_past_the_first_twenty() -> None:
    nodes = [f"n{index}" for index in range(1000)]
    result = check_nodes(
        plan(nodes), FirstNode(lambda node, call: None if node != "n0" else idle(node, call))
    )
    message = result["msg"]
    assert message.count("does not run") == node_check.NAMED_PROBLEMS
    assert message.endswith("And 979 more node(s) with problems: n21, n22, n23, n24, ..., n999.")


def test_the_module_answers_one_json_line() -> None:
    # This machine as the only node: its own command runs in its shell, no ssh.
    me = socket.gethostname()
    encoded = [base64.b64encode(text.encode()).decode() for text in ("echo mine; echo up", "echo other")]
    done = subprocess.run(
        [sys.executable, "-m", check.MODULE, "--nodes", me, "--first", encoded[0], "--command", encoded[1]],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(done.stdout.splitlines()[-1]) == {"answers": {me: "mine\nup\n"}}
    assert node_check.CHECK_MODULE == check.MODULE


def test_the_nodes_check_is_no_job_process_for_another_jobs_check(tmp_path: Any) -> None:
    # Two jobs checked at once on the same nodes: each one's shell must not be taken for a process of its job.
    jobs = str(tmp_path / "jobs")
    script = node_script(None, jobs, f"{jobs}/J1")
    assert f"{jobs}/" not in script
    (tmp_path / "jobs" / "J1").mkdir(parents=True)
    shell = subprocess.Popen(
        ["/bin/sh", "-c", f"{script.split(' (', 1)[0]} sleep 30"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert shell.stdout is not None
        said = shell.stdout.readline()  # the test ran; its shell now sleeps, still the same command line
        from ddp_cluster.supervisor import jobs as node_jobs_here

        assert node_jobs_here.running(jobs)[0] == {}  # no job runs there, the check's shell included
    finally:
        shell.kill()
        shell.wait()
    assert said == f"{node_check.EXISTS}{jobs}/J1\n"


def test_the_first_nodes_reset_runs_before_its_check_module_and_what_it_undid_is_said() -> None:
    removed = (
        "reset: removed /opt/venv/lib/python3.11/site-packages/sitecustomize.py (the image has none there)"
    )

    class Planted(FirstNode):
        def run(self, command: str) -> Done:
            done = super().run(command)
            return Done(0, f"{removed}\n{done.stdout}")  # the reset's line, before the check module's JSON

    first = Planted(idle)
    said: list[str] = []
    result = check_nodes(plan(["node0", "node1"]), first, say=said.append)
    inner = shlex.split(first.commands[0])[-1]
    assert inner.index("image_reset.py reset") < inner.index("python -m ddp_cluster.supervisor.check")
    line = f"node0: undone what an earlier job left: {removed.removeprefix('reset: ')}"
    assert said == [line]
    assert result == {"changed": True, "checked": 2, "waited": False, "reset": [line]}


def test_a_slurm_job_asks_every_node_it_may_be_given_about_the_master_port() -> None:
    """Any node may be a Slurm job's first: a port held by something that is no job refuses the job before
    the submit, named; a port held by another job is that job's, and Slurm waits for it."""
    holder = "listening: LISTEN 0 5 0.0.0.0:29501 0.0.0.0:*"

    def said(node: str, call: int) -> str:
        if node == "node1":
            return f"{holder}\n{report(node)}\nup\n"
        if node == "node2":
            return f"{holder}\n{report(node, busy='other')}\nup\n"
        return idle(node, call)

    first = FirstNode(said)
    result = check_nodes(
        plan(["node0"], slurm={"nodes": 1}, host_dirs={"node0": "", "node1": "", "node2": ""}), first
    )
    assert result["failed"] is True
    assert "node1: the master port 29501 is taken" in result["msg"]
    assert "node2" not in result["msg"] and "node0" not in result["msg"]
    words = shlex.split(shlex.split(first.commands[0])[-1].split("&&", 1)[1])
    assert "sport = :29501" in base64.b64decode(words[words.index("--command") + 1]).decode()
