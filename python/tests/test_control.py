"""The job's lifecycle on the controller (ddp_cluster.job.control): start, wait, detach, attach, stop, the
first node gone, the bound, Ctrl-C, driven through a fake transport and a fake clock (no Ansible, no
container); and the start's own shell commands, run here through the local transport with a docker
stand-in."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.job import control, node_jobs
from ddp_cluster.job.control import SILENT, AttachError, JobControl, attach_plan, interrupt_file
from ddp_cluster.job.status import Status
from ddp_cluster.job.transport import Done, Local, Unreachable, in_container


class FakeNode:
    """The first node's server: ``statuses`` are what status.json holds at each read (the last one stays);
    ``running``: whether its container runs; ``down``: its server does not answer at all. Every command is
    kept; ``on_command`` may act on one (a Ctrl-C pressed while the job runs)."""

    def __init__(self, statuses: list[Status | None], running: bool = True) -> None:
        self.statuses = list(statuses)
        self.running = running
        self.down = False
        self.start_rc = 0
        self.commands: list[str] = []
        self.put_files: list[str] = []
        self.closed = 0
        self.on_command: Callable[[str], None] = lambda command: None
        self.claims: list[dict[str, Any]] = [{"claimed": True}]  # the answers to the claim of the nodes

    def run(self, command: str) -> Done:
        self.commands.append(command)
        self.on_command(command)
        if self.down:
            raise Unreachable("ssh: connect to host server0 port 22: No route to host")
        if " --claim " in command:
            return Done(0, json.dumps(self.claims.pop(0) if len(self.claims) > 1 else self.claims[0]) + "\n")
        if command.startswith("python3 -c "):
            found = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
            return Done(0, found.dumps()) if found else Done(1)
        if command.startswith("docker inspect"):
            return Done(0, "true\n" if self.running else "false\n")
        if "ddp_cluster.supervise " in command:
            return Done(self.start_rc, "", "tar: job.tar.gz: Cannot open" if self.start_rc else "")
        return Done(0, "{}\n")

    def put(self, local: str) -> str:
        self.put_files.append(local)
        return f"/tmp/ansible-tmp/{Path(local).name}"

    def close(self) -> None:
        self.closed += 1

    def stops(self) -> list[str]:
        return [command for command in self.commands if "--stop" in command]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def interrupt(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "interrupt"
    yield path
    path.unlink(missing_ok=True)


def plan(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    return {
        "id": "J1",
        "label": "job",
        "kind": "train",
        "host_dirs": {"node0": "/srv/ddp/node0/jobs/J1"},
        "job_dir": "/workspace/jobs/J1",
        "run_dir": str(tmp_path / "runs" / "J1"),
        "bundle": str(tmp_path / "runs" / "J1" / "job.tar.gz"),
        "timeout": 600,
        "poll": 2,
        **changes,
    }


def follow(
    tmp_path: Path, node: FakeNode, interrupt: Path, **changes: Any
) -> tuple[dict[str, Any], list[str]]:
    said: list[str] = []
    clock = Clock()
    job = JobControl(plan(tmp_path, **changes), "node0", node, said.append, interrupt, clock, clock.sleep)
    return job.run(), said


RUNNING = Status(state="running", updated=1.0, elapsed=3.0, progress={"epoch": 1, "step": 10, "loss": 0.5})
DONE = Status(state="succeeded", updated=2.0, elapsed=9.0, rc=0, progress={"epoch": 2, "step": 20})


def test_a_job_is_started_followed_and_its_last_status_written(tmp_path: Path, interrupt: Path) -> None:
    node = FakeNode([None, RUNNING, RUNNING, DONE])
    result, said = follow(
        tmp_path, node, interrupt, resume_checkpoint="/runs/J0/output/checkpoints/epoch-00001.ckpt"
    )
    assert result["changed"] is True and result["state"] == "succeeded"
    assert node.put_files == [plan(tmp_path)["bundle"], "/runs/J0/output/checkpoints/epoch-00001.ckpt"]
    start = next(command for command in node.commands if "ddp_cluster.supervise " in command)
    # the files fed into the node container, written there: nothing by the server's root in the workspace
    assert "/srv/ddp" not in start
    assert "tar -xzf /workspace/jobs/J1/job.tar.gz -C /workspace/jobs/J1" in start
    assert "< /tmp/ansible-tmp/epoch-00001.ckpt" in start and "/epoch-00001.ckpt && docker exec -d" in start
    assert "docker exec -d node0 /bin/bash -c" in start and "--job-dir /workspace/jobs/J1 >" in start
    assert node.closed == 1  # the files put there are removed
    assert said == [
        "job J1: starting after 0 s: starting",
        "job J1: running after 3 s: epoch 1, step 10, loss 0.5",
        "job J1: succeeded after 9 s: epoch 2, step 20",
    ]
    written = json.loads(Path(tmp_path, "runs", "J1", "status.json").read_text())
    assert written["state"] == "succeeded" and written == result["status"]
    assert node.stops() == []


def test_a_start_that_fails_names_the_node_and_what_went_wrong(tmp_path: Path, interrupt: Path) -> None:
    node = FakeNode([None])
    node.start_rc = 2
    result, _ = follow(tmp_path, node, interrupt)
    assert result == {"failed": True, "msg": "job J1: could not start on node0: tar: job.tar.gz: Cannot open"}
    node.down = True
    result, _ = follow(tmp_path, node, interrupt)
    assert result["failed"] and "No route to host" in result["msg"]


def test_detach_returns_once_every_rank_runs_with_the_commands_that_follow_it(
    tmp_path: Path, interrupt: Path
) -> None:
    node = FakeNode([RUNNING, RUNNING.update(ranks_running=True)])
    result, said = follow(tmp_path, node, interrupt, detach=True)
    assert result["detached"] is True and result["state"] == "running"
    assert said[-4] == "job J1: detached: every rank runs; the job goes on without this controller"
    assert said[-3:] == control.follow_commands("J1")
    assert "-e attach=J1" in said[-3] and "-e stop=J1" in said[-1]
    assert not Path(tmp_path, "runs", "J1", "status.json").exists()  # nothing to collect yet


def test_detach_follows_a_job_that_ended_before_its_ranks_all_ran(tmp_path: Path, interrupt: Path) -> None:
    failed = Status(state="failed", updated=2.0, reason="a rank exited with an error")
    result, _ = follow(tmp_path, FakeNode([RUNNING, failed]), interrupt, detach=True)
    assert "detached" not in result and result["state"] == "failed"


def test_attach_starts_nothing_and_follows_the_job(tmp_path: Path, interrupt: Path) -> None:
    node = FakeNode([RUNNING.update(nodes=["node0", "node1"]), DONE])
    result, said = follow(tmp_path, node, interrupt, attach=True)
    assert result["state"] == "succeeded" and node.put_files == []
    assert not any("ddp_cluster.supervise " in command for command in node.commands)
    assert said[0] == "job J1: attached (running, nodes node0, node1)"


def test_attach_without_a_status_on_the_first_node_fails_saying_where_it_looked(
    tmp_path: Path, interrupt: Path
) -> None:
    result, _ = follow(tmp_path, FakeNode([None]), interrupt, attach=True)
    assert result["failed"] is True
    assert result["msg"].startswith("job J1: no status on node0 (/srv/ddp/node0/jobs/J1/status.json)")


def test_ctrl_c_stops_the_job_on_every_node_with_the_reason_and_returns_its_last_word(
    tmp_path: Path, interrupt: Path
) -> None:
    stopped = Status(state="failed", updated=5.0, reason="x", interrupted="interrupted on the controller")
    node = FakeNode([RUNNING, RUNNING, stopped])
    reads = 0

    def press(command: str) -> None:
        nonlocal reads
        reads += command.startswith("python3 -c ")
        if reads == 2:
            interrupt.touch()

    node.on_command = press
    result, said = follow(tmp_path, node, interrupt)
    assert "job J1: interrupted (Ctrl-C): stopping it on every node" in said
    (stop,) = node.stops()
    assert shlex.split(stop)[:5] == ["docker", "exec", "node0", "/bin/bash", "-c"]
    reason = "interrupted on the controller (Ctrl-C): stopped on every node"
    assert shlex.split(stop)[-1] == node_jobs.command("/workspace/jobs", "J1", reason)
    assert result["state"] == "failed" and result["status"]["interrupted"]


def test_the_interrupt_file_is_cleared_when_the_wait_starts(tmp_path: Path, interrupt: Path) -> None:
    interrupt.touch()  # left by an earlier playbook of the same pid
    result, _ = follow(tmp_path, FakeNode([DONE]), interrupt)
    assert result["state"] == "succeeded" and not interrupt.exists()


def test_a_job_past_the_controllers_bound_is_stopped_without_a_reason(
    tmp_path: Path, interrupt: Path
) -> None:
    running = [RUNNING.update(updated=float(n)) for n in range(400)]  # the supervisor keeps writing
    node = FakeNode(running)
    result, said = follow(tmp_path, node, interrupt, timeout=60, poll=1)
    assert "job J1: still running after the 150 s bound: stopping it" in said
    (stop,) = node.stops()
    assert shlex.split(stop)[-1] == node_jobs.command("/workspace/jobs", "J1", "")
    assert shlex.split(stop)[-1].endswith("--stop J1 --reason ''")
    assert result["state"] == "failed" and result["status"]["reason"] == "the supervisor did not end the job"


def test_a_silent_first_node_whose_container_is_gone_fails_the_job_naming_it(
    tmp_path: Path, interrupt: Path
) -> None:
    node = FakeNode([RUNNING], running=False)  # the same status, never rewritten
    result, said = follow(tmp_path, node, interrupt)
    assert "job J1: the first node node0 is gone, and the supervisor with it" in said
    status = result["status"]
    assert (
        status["state"] == "failed" and status["failed_node"] == "node0" and status["lost_nodes"] == ["node0"]
    )
    assert "train.yml -e resume=true -e resume_from=J1" in status["reason"]
    assert node.stops() == []


def test_a_silent_first_node_whose_container_runs_is_waited_for(tmp_path: Path, interrupt: Path) -> None:
    node = FakeNode([RUNNING] * 30 + [DONE])  # a slow supervisor, its node alive
    result, _ = follow(tmp_path, node, interrupt)
    assert result["state"] == "succeeded"
    assert any(command.startswith("docker inspect") for command in node.commands)


def test_a_first_node_whose_server_does_not_answer_is_gone(tmp_path: Path, interrupt: Path) -> None:
    node = FakeNode([RUNNING])
    reads = 0

    def die(command: str) -> None:
        nonlocal reads
        reads += command.startswith("python3 -c ")
        node.down = reads > 2

    node.on_command = die
    clock = Clock()
    said: list[str] = []
    job = JobControl(plan(tmp_path), "node0", node, said.append, interrupt, clock, clock.sleep)
    result = job.run()
    assert result["status"]["failed_node"] == "node0" and result["state"] == "failed"
    # no answer is asked again, said once, and taken for the node's loss only after the takeover bound
    asking = [line for line in said if "does not answer" in line]
    assert len(asking) == 1 and "taken for gone after 115 s without an answer" in asking[0]
    assert clock.now - 1000.0 >= SILENT + 115


def test_a_blip_of_the_controllers_network_is_no_lost_node(tmp_path: Path, interrupt: Path) -> None:
    """The server answers nothing for a minute (every call: the status read, docker inspect), then again:
    the job is followed to its end, nothing stopped, the return said."""
    node = FakeNode([RUNNING] * 40 + [DONE])
    clock = Clock()

    def blip(command: str) -> None:
        node.down = 1030.0 <= clock.now < 1090.0

    node.on_command = blip
    said: list[str] = []
    result = JobControl(plan(tmp_path), "node0", node, said.append, interrupt, clock, clock.sleep).run()
    assert result["state"] == "succeeded", said
    assert any("does not answer" in line for line in said) and any("answers again" in line for line in said)
    assert node.stops() == []


def test_a_container_docker_does_not_know_is_gone_at_once_and_a_busy_docker_is_asked_again(
    tmp_path: Path, interrupt: Path
) -> None:
    node = FakeNode([RUNNING])
    answers = [
        Done(1, "", "Error response from daemon: i/o timeout"),
        Done(1, "", "Error: No such object: node0"),
    ]
    real = node.run

    def run(command: str) -> Done:
        return answers.pop(0) if command.startswith("docker inspect") else real(command)

    node.run = run  # type: ignore[method-assign]
    clock = Clock()
    job = JobControl(plan(tmp_path), "node0", node, lambda line: None, interrupt, clock, clock.sleep)
    result = job.run()
    assert result["state"] == "failed" and answers == []
    assert SILENT + SILENT / 2 <= clock.now - 1000.0 < SILENT + 115


def test_restarts_are_said_once_as_they_come(tmp_path: Path, interrupt: Path) -> None:
    record = {
        "restart": 1,
        "cause": "node node1 stopped answering",
        "lost": ["node1"],
        "nodes_after": ["node0"],
    }
    restarted = RUNNING.update(restarts=[record], updated=3.0)
    node = FakeNode([RUNNING, restarted, restarted.update(updated=4.0), DONE.update(restarts=[record])])
    _, said = follow(tmp_path, node, interrupt)
    assert [line for line in said if "restart 1" in line] == [
        "job J1: restart 1: node node1 stopped answering; lost node1; on node0"
    ]


def test_the_interrupt_file_is_named_after_the_playbooks_pid_in_the_users_private_folder(
    tmp_path: Path,
) -> None:
    """Not the shared /tmp, where another local user could plant or remove it by its predictable name."""
    home = tmp_path / "home"
    home.mkdir()
    marker = interrupt_file(1234, home)
    assert marker == home / ".ddp-cluster" / "interrupt.1234" and marker != interrupt_file(1235, home)
    assert not str(marker).startswith(tempfile.gettempdir() + "/ddp-cluster-interrupt")
    made = os.lstat(marker.parent)
    assert stat.S_ISDIR(made.st_mode) and stat.S_IMODE(made.st_mode) == 0o700 and made.st_uid == os.getuid()


def test_a_private_folder_open_to_others_is_closed_and_a_link_in_its_place_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ddp-cluster").mkdir(parents=True, mode=0o777)
    os.chmod(home / ".ddp-cluster", 0o777)
    interrupt_file(1, home)
    assert stat.S_IMODE(os.lstat(home / ".ddp-cluster").st_mode) == 0o700
    other = tmp_path / "other"
    (other / "elsewhere").mkdir(parents=True)
    (other / ".ddp-cluster").symlink_to(other / "elsewhere")
    with pytest.raises(control.PrivateDirError, match=r"\.ddp-cluster is not a folder \(a link or a file\)"):
        interrupt_file(1, other)


def test_a_private_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("making a folder of another user needs root")
    home = tmp_path / "home"
    (home / ".ddp-cluster").mkdir(parents=True, mode=0o700)
    os.chown(home / ".ddp-cluster", 4321, 4321)
    with pytest.raises(control.PrivateDirError, match="belongs to uid 4321, not to this user"):
        interrupt_file(1, home)


# --- attach's plan ---


def test_attach_reads_the_plan_of_an_earlier_run(tmp_path: Path) -> None:
    (tmp_path / "J1").mkdir()
    planned = {"kind": "train", "id": "J1", "detach": True, "run_dir": str(tmp_path / "J1")}
    (tmp_path / "J1" / "plan.json").write_text(json.dumps(planned))
    assert attach_plan(tmp_path, "J1") == {**planned, "detach": False, "attach": True}
    (tmp_path / "G1").mkdir()
    (tmp_path / "G1" / "plan.json").write_text(json.dumps({"kind": "preflight", "label": "health gate"}))
    with pytest.raises(AttachError, match="attach=G1 is a health gate, not a job"):
        attach_plan(tmp_path, "G1")
    with pytest.raises(AttachError, match=r"attach=J9: this controller has no plan of that job .*jobs.yml"):
        attach_plan(tmp_path, "J9")


def test_attach_and_stop_take_only_a_run_directory_under_the_runs_directory(tmp_path: Path) -> None:
    """A plan.json naming another run_dir (a job's output laid over it, once) is refused, naming it: the
    collect and the report would write there."""
    runs = tmp_path / "runs"
    (runs / "J1").mkdir(parents=True)
    for elsewhere in ("/etc", str(runs / "J2"), str(runs / "J1" / ".." / "..")):
        planned = {"kind": "train", "id": "J1", "run_dir": elsewhere}
        (runs / "J1" / "plan.json").write_text(json.dumps(planned))
        with pytest.raises(AttachError, match=rf"names another run directory \({re.escape(elsewhere)}\)"):
            attach_plan(runs, "J1")
    for bad in ("../J1", "..", "J1/../J1", ""):
        with pytest.raises(AttachError, match="is not a job id"):
            attach_plan(runs, bad)


# --- the start's commands, run here ---


class Recording(Local):
    """The local transport, keeping every command run."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[str] = []

    def run(self, command: str) -> Done:
        self.commands.append(command)
        return super().run(command)


def start_here(tmp_path: Path, **changes: Any) -> tuple[str, Path, Recording]:
    """JobControl.start through the local transport, with a ``docker`` stand-in on PATH: the claim of the
    nodes answered, a command fed to the container (``docker exec -i``) run here as the container's root
    would, the supervisor's start recorded. The job's directory (the container's /workspace/jobs/J1) is under
    tmp_path/container."""
    bundle = tmp_path / "job.tar.gz"
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(script, arcname="train.py")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(
        "#!/bin/sh\n"
        'case "$*" in *" --claim "*) echo \'{"claimed": true}\'; exit 0;; esac\n'
        'if [ "$1 $2" = "exec -i" ]; then shift 3; exec "$@"; fi\n'
        f'printf "%s\\n" "$@" > {tmp_path}/docker-args\n'
    )
    docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
    job_dir = tmp_path / "container" / "workspace" / "jobs" / "J1"
    job = plan(tmp_path, job_dir=str(job_dir), bundle=str(bundle), **changes)
    transport = Recording()
    secrets = changes.pop("secrets", {})
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_dir}:{path}"
    try:
        control_ = JobControl(job, "node0", transport, print, tmp_path / "interrupt", secrets=secrets)
        error = control_.start()
    finally:
        os.environ["PATH"] = path
    return error, job_dir, transport


def test_the_start_puts_the_files_in_place_and_starts_the_supervisor_in_the_container(tmp_path: Path) -> None:
    """The job's files are fed into the node container and written there (never by the server's root in the
    container-writable workspace); the job's directory is 0700, its secrets 0600 and never on a command
    line; the copies put on the server are gone."""
    checkpoint = tmp_path / "epoch-00002.ckpt"
    checkpoint.write_bytes(b"DDPCKPT1")
    token = "hf_secret_value_42"
    error, job_dir, transport = start_here(
        tmp_path, resume_checkpoint=str(checkpoint), secrets={"HF_TOKEN": token}
    )
    assert error == ""
    assert (job_dir / "train.py").read_text() == "print('hi')\n"
    assert (job_dir / "output" / "checkpoints" / "epoch-00002.ckpt").read_bytes() == b"DDPCKPT1"
    assert sorted(path.name for path in (job_dir / "output" / "checkpoints").iterdir()) == [
        "epoch-00002.ckpt"
    ]
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
    assert json.loads((job_dir / "secrets.json").read_text()) == {"HF_TOKEN": token}
    assert stat.S_IMODE((job_dir / "secrets.json").stat().st_mode) == 0o600
    assert not any(token in command for command in transport.commands)
    start = transport.commands[-1]
    assert start.startswith("docker exec -i node0 ") and "/srv/ddp" not in start  # all in the container
    args = (tmp_path / "docker-args").read_text().splitlines()
    assert args[:4] == ["exec", "-d", "node0", "/bin/bash"]
    assert f"exec python -m ddp_cluster.supervise --job-dir {job_dir} >" in args[-1]
    assert transport._folder is None  # its temporary copies are gone
    assert not list(Path(tempfile.gettempdir()).glob("ddp-secrets-*"))  # the controller's copy too


def test_a_start_without_secrets_writes_no_secrets_file(tmp_path: Path) -> None:
    error, job_dir, _ = start_here(tmp_path)
    assert error == "" and (job_dir / "train.py").exists() and not (job_dir / "secrets.json").exists()


@pytest.mark.parametrize("planted", ["jobs", "jobs/J1"])
def test_a_link_planted_in_place_of_the_job_directory_is_refused_naming_it(
    tmp_path: Path, planted: str
) -> None:
    """/workspace/jobs/ID -> /var/tmp (or jobs -> ...) planted in the node container: the start refuses it,
    named, and writes nothing through it."""
    elsewhere = tmp_path / "var-tmp"
    (elsewhere / "J1").mkdir(parents=True)
    workspace = tmp_path / "container" / "workspace"
    (workspace / "jobs").mkdir(parents=True)
    if planted == "jobs":
        (workspace / "jobs").rmdir()
    (workspace / planted).symlink_to(elsewhere / "J1" if planted.endswith("J1") else elsewhere)
    error, _, _ = start_here(tmp_path, secrets={"T": "a-secret"})
    assert f"{workspace / planted} in node node0 is a symbolic link (to {elsewhere}" in error, error
    assert "docker exec node0 rm" in error
    assert list(elsewhere.rglob("*")) == [elsewhere / "J1"]
    asked = tmp_path / "docker-args"  # the release of the claims after the failed start, not the supervisor
    assert "ddp_cluster.supervise" not in (asked.read_text() if asked.exists() else "")


def test_in_container_quotes_the_command_for_docker_exec() -> None:
    assert in_container("node 0", "echo 'a b'") == "docker exec 'node 0' /bin/sh -c 'echo '\"'\"'a b'\"'\"''"
    done = subprocess.run(
        ["sh", "-c", in_container("n", "echo hi").replace("docker exec n ", "")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == "hi\n"


# --- the supervisor dead, the first node lost (the standby takes over), this start's own status ---


def test_a_dead_supervisor_fails_the_job_within_seconds_naming_it_and_its_last_words(
    tmp_path: Path, interrupt: Path
) -> None:
    node = FakeNode([RUNNING.update(pid=4242)])  # never rewritten: the supervisor is gone
    words = (
        "the supervisor on node0 ended the job: status.json could not be written (No space left on device)"
    )
    started = Clock()

    def answer(command: str) -> None:
        if "[d]dp_cluster[.]supervise" in command:
            node.statuses = [RUNNING.update(pid=4242)]

    node.on_command = answer
    original = node.run

    def run(command: str) -> Done:
        if "[d]dp_cluster[.]supervise" in command:
            node.commands.append(command)
            return Done(0, f"dead\n{words}\n\nTraceback (most recent call last):\n")
        return original(command)

    node.run = run  # type: ignore[method-assign]
    said: list[str] = []
    job = JobControl(plan(tmp_path, poll=0.5), "node0", node, said.append, interrupt, started, started.sleep)
    result = job.run()
    assert result["state"] == "failed"
    reason = result["status"]["reason"]
    assert reason.startswith("the job's supervisor (pid 4242 on node0) died: ") and words in reason
    assert started.now - 1000.0 < 20, f"found after {started.now - 1000:.0f} s"
    assert node.stops(), "what the dead supervisor left was not stopped"


def test_a_lost_first_node_of_a_job_with_a_standby_moves_the_wait_there(
    tmp_path: Path, interrupt: Path
) -> None:
    node = FakeNode([RUNNING.update(standby="node1")], running=False)
    result, said = follow(tmp_path, node, interrupt, nodes=["node0", "node1"], first="node0")
    assert result["moved"] == "node1" and not result.get("failed")
    assert "job J1: the first node node0 is gone; following the job to its standby node1" in said[-1]
    assert not Path(tmp_path, "runs", "J1", "status.json").exists()


def test_the_standby_is_followed_once_it_took_the_job_over(tmp_path: Path, interrupt: Path) -> None:
    mine = RUNNING.update(supervisor_node="node1", updated=5.0)
    node = FakeNode([None, RUNNING, mine, DONE.update(supervisor_node="node1")])
    clock = Clock()
    said: list[str] = []
    changes = {"attach": True, "follow": True, "host_dirs": {"node1": "/srv/ddp/node1/jobs/J1"}}
    job = JobControl(plan(tmp_path, **changes), "node1", node, said.append, interrupt, clock, clock.sleep)
    result = job.run()
    assert result["state"] == "succeeded"
    assert "job J1: followed to node1, which took the job over (running)" in said
    assert all("ddp_cluster.supervise " not in command for command in node.commands), "it started a job"


def test_a_standby_that_never_took_over_ends_the_wait_with_a_failed_status(
    tmp_path: Path, interrupt: Path
) -> None:
    node = FakeNode([None])
    clock = Clock()
    said: list[str] = []
    changes = {
        "attach": True,
        "follow": True,
        "first": "node0",
        "host_dirs": {"node1": "/srv/ddp/node1/jobs/J1"},
    }
    job = JobControl(plan(tmp_path, **changes), "node1", node, said.append, interrupt, clock, clock.sleep)
    result = job.run()
    assert (
        result["state"] == "failed" and "did not take the job over within 115 s" in result["status"]["reason"]
    )
    assert clock.now - 1000.0 <= 116


def test_a_standby_that_does_not_answer_for_a_while_is_waited_for_within_the_bound(
    tmp_path: Path, interrupt: Path
) -> None:
    """The standby's server does not answer its first calls (the controller's network blinked): that is not
    "nothing of the job runs there"; once it answers, its takeover is followed."""
    mine = RUNNING.update(supervisor_node="node1", updated=5.0)
    node = FakeNode([None, None, None, mine, DONE.update(supervisor_node="node1")])
    clock = Clock()
    node.on_command = lambda command: setattr(node, "down", clock.now < 1010.0)
    changes = {"attach": True, "follow": True, "host_dirs": {"node1": "/srv/ddp/node1/jobs/J1"}}
    said: list[str] = []
    job = JobControl(plan(tmp_path, **changes), "node1", node, said.append, interrupt, clock, clock.sleep)
    assert job.run()["state"] == "succeeded", said


def test_a_status_of_an_earlier_start_under_the_same_id_is_not_this_starts(
    tmp_path: Path, interrupt: Path
) -> None:
    old = DONE.update(start_id="earlier")
    new = DONE.update(start_id="mine", elapsed=4.0)
    node = FakeNode([old, old, new])
    result, _ = follow(tmp_path, node, interrupt, spec={"start_id": "mine"})
    assert result["state"] == "succeeded" and result["status"]["start_id"] == "mine"


def test_the_supervisor_check_says_alive_or_dead_with_its_last_words(tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "J1"
    job.mkdir(parents=True)
    (job / "last-words").write_text("status.json could not be written" + " " * 100)
    (job / "supervisor.log").write_text("line 1\nTraceback: boom\n")
    out = subprocess.run(
        ["/bin/sh", "-c", control.supervisor_check(str(job))], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("dead\n")
    assert control.last_words_of(out) == "status.json could not be written / line 1 / Traceback: boom"
    assert control.last_words_of("dead\n") == "it said nothing (killed, or it crashed at start)"
    hidden = subprocess.run(  # its folder unreadable (a full disk, a mount over it): still an answer
        ["/bin/sh", "-c", control.supervisor_check(str(tmp_path / "gone"))], capture_output=True, text=True
    )
    assert hidden.returncode == 0 and hidden.stdout.startswith("dead")


REFUSED = {"claimed": False, "node": "node1", "job": "J0", "nodes": ["node0", "node1"]}


def test_a_node_another_job_claimed_refuses_the_start_naming_it(tmp_path: Path, interrupt: Path) -> None:
    node = FakeNode([None])
    node.claims = [REFUSED]
    result, _ = follow(tmp_path, node, interrupt, nodes=["node0", "node1"])
    assert result["failed"] and "node1 runs another job: job J0 (nodes node0, node1)" in result["msg"]
    assert not any("ddp_cluster.supervise " in command for command in node.commands), "it started"
    assert node.put_files == []


def test_with_wait_for_nodes_the_claim_is_taken_again_until_the_nodes_are_free(
    tmp_path: Path, interrupt: Path
) -> None:
    node = FakeNode([None, DONE])
    node.claims = [REFUSED, REFUSED, {"claimed": True}]
    result, said = follow(tmp_path, node, interrupt, nodes=["node0", "node1"], wait_for_nodes=True)
    assert result["state"] == "succeeded"
    assert said[0] == "job J1: waiting: node1 runs another job: job J0 (nodes node0, node1)"
    assert sum(" --claim " in command for command in node.commands) == 3


def test_attach_to_a_job_whose_first_node_is_gone_follows_it_to_its_standby(
    tmp_path: Path, interrupt: Path
) -> None:
    node = FakeNode([RUNNING.update(standby="node1")])
    node.down = True
    result, said = follow(tmp_path, node, interrupt, attach=True, nodes=["node0", "node1"], first="node0")
    assert result["moved"] == "node1"
    assert said == ["job J1: no supervisor of the job on node0; following it to its standby node1"]


def test_a_standby_where_nothing_of_the_job_runs_ends_the_follow_at_once(
    tmp_path: Path, interrupt: Path
) -> None:
    node = FakeNode([None])
    original = node.run

    def run(command: str) -> Done:
        if "pgrep -f" in command and "supervis(e|or" in command:
            node.commands.append(command)
            return Done(0, "no\n")
        return original(command)

    node.run = run  # type: ignore[method-assign]
    clock = Clock()
    changes = {
        "attach": True,
        "follow": True,
        "first": "node0",
        "host_dirs": {"node1": "/srv/ddp/node1/jobs/J1"},
    }
    job = JobControl(plan(tmp_path, **changes), "node1", node, [].append, interrupt, clock, clock.sleep)
    result = job.run()
    assert result["state"] == "failed" and "no node took it over" in result["status"]["reason"]
    assert clock.now - 1000.0 <= 3


# --- the status read, as the server's root in a directory a job's code can write ---


def test_the_status_is_read_without_following_a_link(tmp_path: Path) -> None:
    """A status.json (or the job's directory) planted as a link to a host file is not read from the host;
    nor a fifo (an open would hang); a regular status.json is."""
    job_dir = tmp_path / "workspace" / "jobs" / "J1"
    job_dir.mkdir(parents=True)
    host = tmp_path / "host-shadow"
    host.write_text("root:HOST SECRET")
    command = control.read_command(f"{job_dir}/", "status.json")

    def read() -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30)

    (job_dir / "status.json").write_text(RUNNING.dumps())
    done = read()
    assert done.returncode == 0 and done.stdout == RUNNING.dumps(), done
    (job_dir / "status.json").unlink()
    (job_dir / "status.json").symlink_to(host)
    done = read()
    assert done.returncode == 1 and done.stdout == "", done
    (job_dir / "status.json").unlink()
    os.mkfifo(job_dir / "status.json")
    done = read()
    assert done.returncode == 1 and done.stdout == "", done
    (job_dir / "status.json").unlink()
    moved = tmp_path / "elsewhere"
    job_dir.rename(moved)
    (moved / "status.json").write_text("root:HOST SECRET")
    job_dir.symlink_to(moved)  # the job's directory itself a link to a host directory
    done = read()
    assert done.returncode == 1 and "HOST SECRET" not in done.stdout, done


def test_the_wait_reads_the_status_through_the_no_link_read(tmp_path: Path, interrupt: Path) -> None:
    node = FakeNode([RUNNING, DONE])
    result, _ = follow(tmp_path, node, interrupt)
    assert result["state"] == "succeeded", result
    expected = control.read_command("/srv/ddp/node0/jobs/J1", "status.json")
    assert f"{expected} 2>/dev/null" in node.commands
    assert not [command for command in node.commands if command.startswith("cat ")]
    assert expected.endswith(" /srv/ddp/node0 jobs/J1/status.json")


def test_a_first_node_whose_supervisor_stepped_down_moves_the_wait_to_the_node_that_holds_the_job(
    tmp_path: Path, interrupt: Path
) -> None:
    """The first node was cut from its standby, which won the job's fence: the first node's supervisor
    stepped down, its status naming the standby's; the wait follows the job there, stopping nothing."""
    stepped = RUNNING.update(
        supervisor_node="node1", reason="the supervisor on node0 stepped down: generation 1: 1 of 3 voters"
    )
    node = FakeNode([RUNNING, RUNNING, stepped])
    result, said = follow(tmp_path, node, interrupt, nodes=["node0", "node1", "node2"], first="node0")
    assert result["moved"] == "node1" and not result.get("failed")
    assert "job J1: the job's supervisor on node0 stepped down; following the job to node1" in said[-1]
    assert node.stops() == [] and not Path(tmp_path, "runs", "J1", "status.json").exists()
