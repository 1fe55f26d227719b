"""The standby supervisor (ddp_cluster.supervisor.standby): its reporter on the first node, and its verdicts
(the job ended, the supervisor died, the first node lost, a blip, a restart that moved the job) with the ssh
session and the clock faked; the takeover's owner mark; the command that starts it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ddp_cluster.job.status import Status
from ddp_cluster.supervisor import standby
from ddp_cluster.supervisor.standby import Standby


class Session:
    """A finished ssh session to the first node: what its reporter printed."""

    def __init__(self, lines: list[str]) -> None:
        self.stdout = io.StringIO("".join(line + "\n" for line in lines))
        self.stdin = io.StringIO()
        self.returncode = 0

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def kill(self) -> None:
        pass

    def poll(self) -> int:
        return 0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def follower(
    tmp_path: Path, sessions: list[list[str]], probe: str = "down", timeout: float = 25.0
) -> tuple[Standby, Clock, list[list[str]]]:
    clock = Clock()
    spawned: list[list[str]] = []
    queue = list(sessions)

    def spawn(argv: list[str]) -> Any:
        spawned.append(argv)
        return Session(queue.pop(0) if queue else [])

    follow = Standby(tmp_path, "node0", timeout, spawn=spawn, probe=lambda node: probe, clock=clock)
    return follow, clock, spawned


def status_line(**fields: Any) -> str:
    return "status " + json.dumps(Status(**fields).to_dict())


def settle(follow: Standby, steps: int = 3) -> str:
    verdict = ""
    for _ in range(steps):
        verdict = follow.step(wait=0.05)
        if verdict:
            break
    return verdict


def test_the_first_nodes_status_is_mirrored_and_its_end_ends_the_standby(tmp_path: Path) -> None:
    me = os.uname().nodename
    running = status_line(state="running", nodes=("node0", me), standby=me, pid=7)
    follow, _, spawned = follower(tmp_path, [[running, "alive", "done"]])
    assert settle(follow) == "done"
    mirrored = json.loads((tmp_path / standby.FOLDER / "status.json").read_text())
    assert mirrored["state"] == "running" and mirrored["standby"] == me
    assert spawned[0][-2:] == [
        "node0",
        f"python -m ddp_cluster.supervisor.standby --job-dir {tmp_path} --report",
    ]


def test_a_supervisor_gone_on_a_node_that_answers_is_not_a_takeover(tmp_path: Path) -> None:
    follow, _, _ = follower(tmp_path, [["alive", "gone"]])
    assert settle(follow) == "gone"


def test_a_first_node_unheard_for_the_timeout_is_lost(tmp_path: Path) -> None:
    follow, clock, spawned = follower(tmp_path, [["alive"]], probe="down")
    assert settle(follow) == ""
    clock.now += 10  # sessions end at once (refused): still within the timeout
    assert settle(follow) == ""
    clock.now += 16
    assert settle(follow) == "lost"
    assert len(spawned) >= 2, "the session was not tried again"


def test_a_blip_shorter_than_the_timeout_is_not_a_loss(tmp_path: Path) -> None:
    follow, clock, _ = follower(tmp_path, [["alive"], [], [], ["alive"]], probe="down")
    for _ in range(3):
        clock.now += 7
        assert settle(follow, 1) == ""
    clock.now += 20  # heard again at the last session: 20 s is within the 25 s timeout
    assert settle(follow, 1) == ""


def test_a_silent_reporter_on_a_node_that_still_logs_in_is_no_loss(tmp_path: Path) -> None:
    follow, clock, _ = follower(tmp_path, [[]], probe="up")
    clock.now += 30
    assert settle(follow, 1) == ""
    assert follow.heard == clock.now


def test_a_frozen_first_node_that_times_out_logins_is_lost(tmp_path: Path) -> None:
    follow, clock, _ = follower(tmp_path, [["alive"]], probe="slow")
    assert settle(follow) == ""
    clock.now += 26
    assert settle(follow) == "lost"


def test_a_standby_the_job_moved_away_from_ends(tmp_path: Path) -> None:
    moved = status_line(state="running", nodes=("node0", "node5"), standby="node5")
    follow, _, _ = follower(tmp_path, [[moved, "alive"]])
    assert settle(follow) == "superseded"


def test_the_reporter_says_the_status_once_then_alive_until_the_end(tmp_path: Path) -> None:
    status = Status(state="running", pid=os.getpid(), nodes=("a", "b"))
    (tmp_path / "status.json").write_text(status.dumps())
    out = io.StringIO()
    started = time.time()
    pings = iter([started, started, started, 0.0])
    standby.report(tmp_path, out, lambda: next(pings), every=0.01, timeout=5)
    lines = out.getvalue().splitlines()
    # this process is no supervisor of the job: "gone"
    assert lines[0].startswith("status ") and json.loads(lines[0][7:])["nodes"] == ["a", "b"]
    assert lines[1:] == ["gone"] * (len(lines) - 1)


def test_the_reporter_of_a_job_that_ended_says_done(tmp_path: Path) -> None:
    (tmp_path / "status.json").write_text(Status(state="succeeded", pid=1).dumps())
    out = io.StringIO()
    standby.report(tmp_path, out, time.time, every=0.01, timeout=5)
    assert out.getvalue().splitlines()[-1] == "done"


def test_the_supervisor_is_alive_while_a_process_of_the_job_runs_as_it(tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "j1"
    job.mkdir(parents=True)
    code = "import time; time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code, "ddp_cluster.supervise", "--job-dir", str(job)])
    try:
        time.sleep(0.2)
        assert standby.supervisor_alive(job, child.pid)
        assert standby.supervisor_alive(job), "found without its pid (the status may be unreadable)"
        assert not standby.supervisor_alive(tmp_path / "jobs" / "j2", child.pid)
        assert not standby.supervisor_alive(tmp_path / "jobs" / "j2")
    finally:
        child.kill()
        child.wait()
    assert not standby.supervisor_alive(job, child.pid)
    assert not standby.supervisor_alive(job)


def test_the_start_command_starts_one_standby_outside_the_jobs_tag() -> None:
    command = standby.start_command("/workspace/jobs/j1", "node0", 25, "/etc/ddp-cluster/env.sh")
    assert command.startswith("pgrep -f 'supervisor[.]standby --job-dir /workspace/jobs/j1 ' >/dev/null ||")
    assert "--primary node0 --timeout 25" in command and "setsid nohup" in command
    # the shell that runs the command does not match its own pgrep (only the standby's command line does)
    found = subprocess.run(
        ["/bin/sh", "-c", command.split(" || ", 1)[0].replace(">/dev/null", "") + f" # {command}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.returncode == 1, found.stdout
    # the standby's command line must not hold JOB/ (which marks the ranks that sweeps stop)
    started = command.split("exec ", 1)[1].split(">>", 1)[0]
    assert "/workspace/jobs/j1/" not in started
