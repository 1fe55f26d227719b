"""The check before a job starts on a node (ddp_cluster.job.node_check): what the check's output makes of the
node (another job runs there, the master port is taken, the container is down, a device NIC does not answer),
the wait for a busy node, and the node's own answer of which jobs run there (``python -m
ddp_cluster.supervisor.jobs``, run here over this machine's processes). No container."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ddp_cluster.job import node_check, node_jobs
from ddp_cluster.job.node_check import busy_jobs, check_node, problems
from ddp_cluster.job.transport import Done
from ddp_cluster.server import image_reset


def report(*busy: tuple[str, list[str]]) -> str:
    jobs = {job: {"nodes": nodes, "status": None} for job, nodes in busy}
    return json.dumps({"node": "node0", "jobs": jobs, "busy": [job for job, _ in busy], "supervisors": {}})


# --- what the output says ---


def test_the_nodes_report_names_the_other_jobs_and_their_nodes() -> None:
    output = "\n".join(
        [
            "listening: LISTEN 0 128 0.0.0.0:29501 0.0.0.0:*",
            report(("J1", ["node0", "node1"]), ("J2", ["node2", "node3"]), ("OWN", ["node0"])),
            "up",
        ]
    )
    assert busy_jobs(output, "OWN") == {"J1": ["node0", "node1"], "J2": ["node2", "node3"]}
    assert busy_jobs(output, "J1") == {"J2": ["node2", "node3"], "OWN": ["node0"]}
    assert busy_jobs("up\nTraceback (most recent call last):\n", "J1") == {}  # no report: nothing known
    unlisted = json.dumps({"busy": ["J3"], "jobs": {}})
    assert busy_jobs(f"{unlisted}\nup", "J9") == {"J3": []}


def test_a_node_busy_with_another_job_names_it_and_not_the_master_port() -> None:
    output = f"listening: LISTEN 0 128 *:29501 *:*\n{report(('J1', ['node0', 'node1']))}\nup"
    found = problems("node0", "node0", output, 29501, [], own="J2")
    assert len(found) == 1
    assert found[0].startswith("node0 runs another job: job J1 (nodes node0, node1).")
    assert "jobs.yml -e stop=J1" in found[0] and "-e wait=true" in found[0]
    assert "master port" not in found[0]


def test_two_other_jobs_are_both_named_and_the_first_one_is_offered_to_stop() -> None:
    output = f"{report(('J1', ['node0']), ('J3', []))}\nup"
    (problem,) = problems("node0", "node0", output, None, [], own="J2")
    assert "job J1 (nodes node0); job J3 (nodes ?)" in problem and "-e stop=J1" in problem


def test_the_master_port_is_named_when_no_other_job_runs() -> None:
    output = f"listening: LISTEN 0 128 *:29501 *:*\n{report(('J2', ['node0']))}\nup"
    (problem,) = problems("node0", "node0", output, 29501, [], own="J2")  # its own job is no other job
    assert problem.startswith("node0: the master port 29501 is taken (LISTEN 0 128 *:29501 *:*)")
    assert problems("node0", "node0", "up", 29501, [], own="J2") == []


def test_a_node_container_that_does_not_answer_is_down_not_busy() -> None:
    output = f"{report(('J1', ['node1']))}\ndown: 1"
    (problem,) = problems("node1", "node1", output, None, [], own="J2")
    assert "the node container node1 does not run" in problem and "runs another job" not in problem


def test_a_device_nic_that_does_not_answer_is_named_with_its_peer() -> None:
    targets = [{"device": 0, "address": "10.0.0.2", "peer": "node1"}]
    output = "up\nping 0 10.0.0.2 1 3 packets transmitted, 0 received, 100% packet loss"
    (problem,) = problems("node0", "node0", output, None, targets, own="J1")
    assert problem.startswith(
        "node0: hccn_tool -ping failed for device 0 -> node1 at 10.0.0.2 (rc 1: 3 packets"
    )


def test_the_script_asks_the_node_in_its_container_and_pings_from_the_server() -> None:
    targets = [{"device": 3, "address": "10.0.0.5", "peer": "node1"}]
    script = node_check.check_script("node0", 29501, node_check.HCCN_TOOL, targets, "/workspace/jobs")
    first, ping = script.splitlines()
    assert first.startswith("docker exec node0 /bin/sh -c ") and first.endswith(" 2>&1 || echo down: $?")
    inner = shlex.split(first)[5]
    assert node_jobs.command("/workspace/jobs") in inner and "'sport = :29501'" in inner
    assert inner.endswith("; echo up")
    # The first node (it gets the master port) says its listen backlog, from the node's network namespace.
    assert "echo somaxconn: $(cat /proc/sys/net/core/somaxconn)" in inner
    other = node_check.check_script("node1", None, node_check.HCCN_TOOL, [], "/workspace/jobs")
    assert "somaxconn" not in other
    assert ping.startswith(f"out=$(timeout 60 {node_check.HCCN_TOOL} -i 3 -ping -g address 10.0.0.5 2>&1)")


# --- the check, through a fake transport ---


class Busy:
    """A node that runs job J9 for ``reads`` checks, then is free."""

    def __init__(self, reads: int) -> None:
        self.reads = reads
        self.commands: list[str] = []

    def run(self, command: str) -> Done:
        self.commands.append(command)
        busy = len(self.commands) <= self.reads
        return Done(0, f"{report(('J9', ['node0'])) if busy else report()}\nup\n")

    def put(self, local: str) -> str:
        raise AssertionError("a check puts no file")

    def close(self) -> None:
        pass


def plan(**changes: Any) -> dict[str, Any]:
    return {
        "id": "J1",
        "first": "node0",
        "master_port": 29501,
        "job_dir": "/workspace/jobs/J1",
        "timeout": 60,
    }


def test_a_busy_node_fails_the_check_naming_the_other_job() -> None:
    result = check_node(plan(), "node0", Busy(reads=99), say=print)
    assert result["failed"] is True and result["msg"].startswith(
        "node0 runs another job: job J9 (nodes node0)."
    )


def test_with_wait_for_nodes_a_busy_node_is_waited_for_until_it_is_free() -> None:
    said: list[str] = []
    slept: list[float] = []
    node = Busy(reads=3)
    result = check_node(
        {**plan(), "wait_for_nodes": True}, "node0", node, say=said.append, sleep=slept.append
    )
    assert result == {"changed": False, "pinged": 0, "waited": True}
    assert said == ["node0: runs job J9: waiting for it (wait=true)"] and slept == [node_check.BUSY_POLL] * 3


def test_with_wait_for_nodes_the_wait_ends_at_the_jobs_time_bound() -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    result = check_node(
        {**plan(), "wait_for_nodes": True},
        "node0",
        Busy(reads=999),
        say=print,
        clock=lambda: now[0],
        sleep=sleep,
    )
    assert result["failed"] is True and 60 <= now[0] <= 60 + node_check.BUSY_POLL


# --- the node's own answer, run here ---


def start_rank(argv_path: str) -> subprocess.Popen[bytes]:
    """A stand-in rank: a sleeping process whose command line names a job's directory."""
    rank = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(20)", "--output-dir", argv_path],
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until its command line is the interpreter's, not the fork's
        try:
            if argv_path in Path(f"/proc/{rank.pid}/cmdline").read_bytes().decode(errors="replace"):
                break
        except OSError:
            pass
        time.sleep(0.02)
    return rank


def test_the_node_names_the_job_whose_ranks_run_there_with_its_nodes(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    (jobs / "J9").mkdir(parents=True)
    (jobs / "J9" / "job.json").write_text(json.dumps({"id": "J9", "nodes": ["node0", "node1"]}, indent=2))
    ranks = [start_rank(f"{jobs}/J9/output"), start_rank(f"{jobs}/J9/logs")]  # two, one job
    try:
        command = [sys.executable, "-m", node_jobs.MODULE, "--jobs-dir", str(jobs)]
        output = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    assert busy_jobs(f"{output}up\n", "J1") == {"J9": ["node0", "node1"]}
    assert busy_jobs(f"{output}up\n", "J9") == {}
    (problem,) = problems("node1", "node1", f"{output}up\n", None, [], own="J1")
    assert problem.startswith("node1 runs another job: job J9 (nodes node0, node1).")


# --- a job id names one job: its directory already on the node ---


def test_the_jobs_directory_already_on_the_node_is_named_with_the_fix(tmp_path: Path) -> None:
    output = f"exists: /srv/ddp/node1/jobs/J1\n{report()}\nup"
    (problem,) = problems("node1", "node1", output, None, [], own="J1")
    assert problem.startswith(
        "node1: the job's directory /srv/ddp/node1/jobs/J1 is there already: job id J1 was used before on"
        " this node, and a job id names one job. Pick another job_id, or leave job_id out"
    )
    job_dir = tmp_path / "a b" / "J1"
    script = node_check.check_script("node1", None, node_check.HCCN_TOOL, [], "/workspace/jobs", str(job_dir))
    first = script.splitlines()[0]  # the server's own line, before the container is asked
    assert subprocess.run(["/bin/sh", "-c", first], capture_output=True, text=True).stdout == ""
    job_dir.mkdir(parents=True)
    said = subprocess.run(["/bin/sh", "-c", first], capture_output=True, text=True).stdout
    assert said == f"exists: {job_dir}\n"  # the line problems() reads


class Used(Busy):
    """A node busy with J9 whose directory for the job is there already (the server answers first)."""

    def run(self, command: str) -> Done:
        done = super().run(command)
        return Done(0, "exists: /srv/ddp/node0/jobs/J1\n" + done.stdout)


def test_a_used_job_id_is_refused_at_once_even_with_wait_for_nodes() -> None:
    node = Used(reads=99)
    result = check_node(
        {**plan(), "wait_for_nodes": True, "host_dirs": {"node0": "/srv/ddp/node0/jobs/J1"}},
        "node0",
        node,
        say=print,
        sleep=lambda seconds: None,
    )
    assert result["failed"] is True and len(node.commands) == 1  # not waited for: waiting does not help
    assert "node0: the job's directory /srv/ddp/node0/jobs/J1 is there already" in result["msg"]
    assert node.commands[0].startswith("if [ -e /srv/ddp/node0/jobs/J1 ]; then")


# --- a drained node ---


class Drained(Busy):
    """A node drained (and, for ``reads`` checks, busy with job J9)."""

    def run(self, command: str) -> Done:
        self.commands.append(command)
        busy = len(self.commands) <= self.reads
        data = json.loads(report(("J9", ["node0"])) if busy else report())
        data["drained"] = {"node": "node0", "reason": "ECC errors", "since": "T0", "by": "ops"}
        return Done(0, f"{json.dumps(data)}\nup\n")


def test_a_drained_node_is_refused_naming_its_record_and_the_undrain() -> None:
    result = check_node(plan(), "node0", Drained(reads=0), say=print)
    assert result["failed"] is True
    assert result["msg"].startswith("node0 is drained since T0 by ops: ECC errors.")
    assert "jobs.yml -e undrain=node0" in result["msg"]
    assert "failed" not in check_node(plan(), "node0", Busy(reads=0), say=print)  # not drained: ok


def test_a_drained_node_is_never_waited_for() -> None:
    slept: list[float] = []
    node = Drained(reads=3)
    result = check_node({**plan(), "wait_for_nodes": True}, "node0", node, say=print, sleep=slept.append)
    assert result["failed"] is True and "drained" in result["msg"] and slept == []


def test_the_first_nodes_listen_backlog_must_hold_every_ranks_connection() -> None:
    # 9216 ranks all connect to the store on the first node at the start; a kernel that keeps 4096 pending
    # connections drops the rest, which the ranks see as store timeouts much later.
    (problem,) = problems("node0", "node0", "somaxconn: 4096\nup", 29501, [], own="J1", ranks=9216)
    assert problem == (
        "node0: net.core.somaxconn is 4096, fewer than the job's 9216 ranks, which all connect to the store"
        " on this node at the start: the kernel would drop connections and ranks time out. Raise it on the"
        " node's server: `ansible-playbook site.yml --tags cluster_host` sizes it to the cluster"
        " (or -e cluster_host_somaxconn=18432), or run fewer ranks."
    )
    assert problems("node0", "node0", "somaxconn: 18432\nup", 29501, [], own="J1", ranks=9216) == []
    assert problems("node0", "node0", "somaxconn: 4096\nup", 29501, [], own="J1", ranks=4096) == []
    # Past what cluster_host sets (65535), the kernel's most is all there is: not refused.
    assert problems("node0", "node0", "somaxconn: 65535\nup", 29501, [], own="J1", ranks=80000) == []
    # A node that did not say (an older node's answer): nothing to judge.
    assert problems("node0", "node0", "up", 29501, [], own="J1", ranks=9216) == []


def test_the_check_reads_the_jobs_world_size_from_the_plan() -> None:
    class Small(Busy):
        def run(self, command: str) -> Done:
            self.commands.append(command)
            return Done(0, f"{report()}\nsomaxconn: 128\nup\n")

    result = check_node({**plan(), "world_size": 256}, "node0", Small(0), say=print)
    assert (
        result["failed"] is True
        and "net.core.somaxconn is 128, fewer than the job's 256 ranks" in result["msg"]
    )
    assert "failed" not in check_node({**plan(), "world_size": 64}, "node0", Small(0), say=print)


# --- the reset of the image's start files, first in every node's check ---


class Reset(Busy):
    """A free node whose reset says ``lines``."""

    def __init__(self, *lines: str) -> None:
        super().__init__(reads=0)
        self.lines = lines

    def run(self, command: str) -> Done:
        self.commands.append(command)
        return Done(0, "".join(f"{line}\n" for line in self.lines) + f"{report()}\nup\n")


def test_each_nodes_check_resets_its_start_files_first_unless_a_job_runs_there() -> None:
    script = node_check.in_node(None, "/workspace/jobs")
    assert script.startswith("{ env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin /opt/venv/bin/python3 -I -S ")
    assert "reset --unless-running /workspace/jobs 2>&1 ||" in script
    assert script.index("image_reset.py reset") < script.index(node_jobs.NODE_ENV)  # before env.sh is read


def test_what_the_reset_undid_is_said_and_the_check_passes() -> None:
    said: list[str] = []
    transport = Reset(
        "reset: removed /opt/venv/lib/python3.11/site-packages/sitecustomize.py (the image has none)"
    )
    result = check_node(plan(), "node0", transport, say=said.append)
    line = (
        "node0: undone what an earlier job left: removed /opt/venv/lib/python3.11/site-packages/"
        "sitecustomize.py (the image has none)"
    )
    assert said == [line]
    assert result == {"changed": True, "pinged": 0, "waited": False, "reset": [line]}


def test_what_the_reset_could_not_put_back_refuses_the_node_naming_the_fix() -> None:
    transport = Reset("reset refused: /opt/venv/lib/python3.11/site-packages/torch is no longer the image's")
    result = check_node(plan(), "node0", transport, say=print)
    assert result["failed"] is True
    assert result["msg"] == "node0: /opt/venv/lib/python3.11/site-packages/torch is no longer the image's"


def test_a_node_whose_reset_does_not_run_is_refused(monkeypatch: Any) -> None:
    monkeypatch.setattr(image_reset, "PYTHON", "/nonexistent/python3")  # an image without the reset
    done = subprocess.run(
        ["/bin/sh", "-c", image_reset.command("/nonexistent/jobs")],
        capture_output=True,
        text=True,
        check=False,
    )
    (problem,) = problems("node0", "node0", f"{done.stdout}up\n", None, [])
    assert problem.startswith("node0: the reset of the image's start files did not run:")
    assert "site.yml --limit NODE" in problem
