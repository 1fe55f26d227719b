"""ddp_cluster.supervisor.jobs: what each node reports of the jobs (its jobs' directories and processes, faked
here) and a stop on a node; ddp_cluster.job.node_jobs.table: the table jobs.yml prints from those reports. No
containers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.job import node_jobs
from ddp_cluster.job import status as job_status
from ddp_cluster.job.status import Status
from ddp_cluster.supervisor import jobs


def supervisor_line(jobs_dir: str, job: str) -> str:
    return f"python -m ddp_cluster.supervise --job-dir {jobs_dir}/{job}"


def rank_line(jobs_dir: str, job: str) -> str:
    return f"python -m ddp_cluster.train --output-dir {jobs_dir}/{job}/output --epochs 2"


def fake_processes(monkeypatch: pytest.MonkeyPatch, found: dict[int, str]) -> list[str]:
    """jobs.processes answers ``found``; the jobs' directories it was asked about."""
    asked: list[str] = []

    def processes(jobs_dir: str) -> dict[int, str]:
        asked.append(jobs_dir)
        return dict(found)

    monkeypatch.setattr(jobs, "processes", processes)
    return asked


# --- running(): which jobs run here, and whose supervisor ---


def test_running_finds_each_jobs_processes_and_its_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    root = "/x/jobs"
    asked = fake_processes(
        monkeypatch,
        {
            10: supervisor_line(root, "J1"),
            11: rank_line(root, "J1"),
            12: f"mpirun --hostfile {root}/J1/hostfile --output-filename {root}/J1/logs python -m x",
            13: rank_line(root, "J2"),
            14: rank_line(root, "J10"),  # J10 is not J1
        },
    )
    busy, supervisors = jobs.running(root)
    assert asked == [root]
    assert {job: sorted(pids) for job, pids in busy.items()} == {"J1": [10, 11, 12], "J2": [13], "J10": [14]}
    assert supervisors == {"J1": 10}


def test_only_the_supervisors_own_command_line_makes_it_the_supervisor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = "/x/jobs"
    fake_processes(
        monkeypatch,
        {
            20: supervisor_line(root, "J1") + "  ",
            21: f"tail -f {root}/J2/supervisor.log",  # names a job's directory, but it is no supervisor
            22: f"python -m ddp_cluster.supervise --job-dir {root}/J3/output",  # not a job's directory
        },
    )
    busy, supervisors = jobs.running(root)
    assert supervisors == {"J1": 20}
    assert set(busy) == {"J1", "J2", "J3"}


def test_processes_reads_the_command_lines_of_this_machine(tmp_path: Path) -> None:
    root = str(tmp_path / "jobs")
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "--output-dir", f"{root}/J9/output"]
    )
    try:
        deadline = time.monotonic() + 10
        found: dict[int, str] = {}
        while sleeper.pid not in found and time.monotonic() < deadline:
            found = jobs.processes(root)
            time.sleep(0.05)
        assert f"{root}/J9/output" in found[sleeper.pid]
        assert os.getpid() not in found
        assert jobs.running(root)[0] == {"J9": [sleeper.pid]}
        assert sleeper.pid not in jobs.processes(str(tmp_path / "other"))
    finally:
        sleeper.kill()
        sleeper.wait()


# --- node_report(): the node's jobs, from their directories and its processes ---


def write_job(
    root: Path, job: str, found: Status | None, mtime: float, nodes: list[str], **spec: Any
) -> Path:
    folder = root / job
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps({"id": job, "nodes": nodes, **spec}, indent=2))
    if found is not None:
        (folder / job_status.FILE).write_text(found.dumps())
    os.utime(folder, (mtime, mtime))
    return folder


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Path:
    """J0 succeeded long ago; J1 runs here with its supervisor; J2 runs a rank here (its status is on its
    first node); J3 has only a job.json (a node of a job that ended) and runs nothing."""
    root = tmp_path / "jobs"
    write_job(root, "J0", Status(state="succeeded", updated=1000.0, elapsed=10.0), 1000, ["n0"])
    write_job(
        root,
        "J1",
        Status(state="running", nodes=("n0", "n1"), progress={"epoch": 1, "step": 40}, updated=3000.0),
        3000,
        ["n0", "n1"],
        spares=["n2"],
        max_restarts=1,
        kind="train",
    )
    write_job(root, "J2", None, 2000, ["n5", "n0"], max_restarts=2)
    write_job(root, "J3", None, 2500, ["n0", "n7"])
    (root / "notes.txt").write_text("not a job")
    return root


def test_a_node_reports_its_jobs_the_busy_ones_and_the_supervisors_here(
    jobs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(jobs_dir)
    fake_processes(
        monkeypatch,
        {10: supervisor_line(root, "J1"), 11: rank_line(root, "J1"), 12: rank_line(root, "J2")},
    )
    report = jobs.node_report(root)
    assert report["node"] == socket.gethostname() and abs(report["now"] - time.time()) < 60
    assert report["busy"] == ["J1", "J2"]
    assert report["supervisors"] == {"J1": 10}
    assert set(report["jobs"]) == {"J0", "J1", "J2"}
    j1 = report["jobs"]["J1"]
    assert j1["status"]["state"] == "running" and j1["status"]["progress"] == {"epoch": 1, "step": 40}
    assert (j1["nodes"], j1["spares"], j1["kind"], j1["max_restarts"], j1["supervisor"]) == (
        ["n0", "n1"],
        ["n2"],
        "train",
        1,
        10,
    )
    j2 = report["jobs"]["J2"]  # a rank here, its status on its first node (n5)
    assert (j2["status"], j2["nodes"], j2["max_restarts"], j2["supervisor"]) == (None, ["n5", "n0"], 2, None)
    j0 = report["jobs"]["J0"]
    assert j0["status"]["state"] == "succeeded" and j0["supervisor"] is None
    assert (j0["spares"], j0["kind"], j0["max_restarts"]) == ([], "train", 0)  # job.json's defaults
    assert json.loads(json.dumps(report)) == report  # what the node prints


def test_only_the_newest_jobs_are_listed_besides_those_that_run(
    jobs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(jobs_dir)
    fake_processes(monkeypatch, {12: rank_line(root, "J2")})
    assert set(jobs.node_report(root, newest=1)["jobs"]) == {"J1", "J2"}
    fake_processes(monkeypatch, {})
    assert set(jobs.node_report(root, newest=1)["jobs"]) == {"J1"}
    assert set(jobs.node_report(root)["jobs"]) == {"J0", "J1"}


def test_a_node_without_a_jobs_directory_has_no_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_processes(monkeypatch, {})
    report = jobs.node_report(str(tmp_path / "none"))
    assert (report["jobs"], report["busy"], report["supervisors"]) == ({}, [], {})


def test_the_command_prints_the_nodes_report(
    jobs_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = fake_processes(monkeypatch, {10: supervisor_line(str(jobs_dir), "J1")})
    assert jobs.main(["--jobs-dir", f"{jobs_dir}/"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert asked == [str(jobs_dir)]  # the trailing slash is dropped
    assert printed["supervisors"] == {"J1": 10} and "stopped" not in printed
    with pytest.raises(SystemExit):
        jobs.main(["--jobs-dir", str(jobs_dir), "--stop", "../J1"])
    assert "is not a job id" in capsys.readouterr().err


# --- stop_here(): a stop on one node ---


def test_a_running_status_whose_supervisor_is_gone_is_closed_as_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "jobs"
    write_job(
        root, "J1", Status(state="running", pid=999999, nodes=("n0", "n1"), updated=5.0), 5, ["n0", "n1"]
    )
    fake_processes(monkeypatch, {})
    done = jobs.stop_here(str(root), "J1", "stopped with jobs.yml -e stop=J1")
    assert done == {"job": "J1", "supervisor": False, "left": False, "closed": True, "released": False}
    closed = job_status.read(root / "J1" / job_status.FILE)
    assert closed is not None and closed.state == "failed" and closed.done
    assert closed.reason == "stopped with jobs.yml -e stop=J1 (its supervisor was no longer running)"
    assert closed.interrupted == "stopped with jobs.yml -e stop=J1"
    assert closed.nodes == ("n0", "n1") and closed.updated > 5.0
    assert not (root / "J1" / "stop-reason").exists()  # no supervisor here to tell


def test_a_finished_or_missing_status_is_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "jobs"
    finished = Status(state="succeeded", rc=0, updated=5.0)
    write_job(root, "J1", finished, 5, ["n0"])
    write_job(root, "J2", None, 5, ["n0"])
    fake_processes(monkeypatch, {})
    assert jobs.stop_here(str(root), "J1", "R")["closed"] is False
    assert job_status.read(root / "J1" / job_status.FILE) == finished
    assert jobs.stop_here(str(root), "J2", "R") == {
        "job": "J2",
        "supervisor": False,
        "left": False,
        "closed": False,
        "released": False,
    }
    assert not (root / "J2" / job_status.FILE).exists()


def test_a_supervisor_here_is_asked_to_stop_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in supervisor (a child that exits 7 on SIGUSR1) gets the signal after the reason is written."""
    root = tmp_path / "jobs"
    write_job(root, "J1", Status(state="running", updated=5.0), 5, ["n0"])
    reason = root / "J1" / "stop-reason"
    program = (
        "import pathlib, signal, sys, time\n"
        f"path = pathlib.Path({str(reason)!r})\n"
        "def stop(*_):\n"
        "    sys.exit(7 if path.read_text() == 'Ctrl-C in train.yml\\n' else 8)\n"
        "signal.signal(signal.SIGUSR1, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    reaper = threading.Thread(target=child.wait)  # so that os.kill(pid, 0) fails once it exited
    reaper.start()
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        line = supervisor_line(str(root), "J1")
        alive = Path(f"/proc/{child.pid}")
        monkeypatch.setattr(jobs, "processes", lambda _: {child.pid: line} if alive.exists() else {})
        monkeypatch.setattr(jobs, "STOP_WAIT", 20.0)
        done = jobs.stop_here(str(root), "J1", "Ctrl-C in train.yml")
        reaper.join(10)
        assert child.returncode == 7  # it got SIGUSR1, after the reason was written
        assert done["supervisor"] is True and done["left"] is False
        # the stand-in wrote no status: the one left running is closed
        assert done["closed"] is True
    finally:
        if child.returncode is None:
            child.kill()
        reaper.join(10)
        if child.stdout is not None:
            child.stdout.close()


# --- table(): the lines jobs.yml prints, from the nodes' reports ---


RESTART = {
    "restart": 1,
    "cause": "node n2 stopped answering",
    "lost": ["n2"],
    "nodes_before": ["n0", "n2"],
    "nodes_after": ["n0", "n1"],
    "spares_taken": ["n1"],
    "checkpoint": "epoch-00002.ckpt",
    "resume_step": 80,
    "steps_redone": 5,
}


def status_dict(**fields: Any) -> dict[str, Any]:
    return Status().update(**fields).to_dict()


def job_item(
    found: dict[str, Any] | None, nodes: list[str], supervisor: int | None = None, **more: Any
) -> Any:
    return {"status": found, "nodes": nodes, "spares": [], "kind": "train", "supervisor": supervisor, **more}


def row(lines: list[str], job: str) -> list[str]:
    """The cells of job's row (the table pads with two or more spaces; a cell holds single spaces)."""
    found = [line for line in lines if line.startswith(job + " ")]
    assert len(found) == 1, lines
    return [cell.strip() for cell in found[0].split("  ") if cell.strip()]


def test_the_table_of_a_running_job_busy_free_and_down_nodes() -> None:
    running = status_dict(
        state="running",
        nodes=["n0", "n1"],
        progress={"epoch": 2, "step": 85, "loss": 0.5},
        updated=1_700_000_100.0,
        elapsed=100.0,
        restarts=[RESTART],
    )
    reports = {
        "n0": {"jobs": {"J1": job_item(running, ["n0", "n2"], 4242, max_restarts=2)}, "busy": ["J1"]},
        "n1": {"jobs": {"J1": job_item(None, ["n0", "n1"], max_restarts=2)}, "busy": ["J1"]},
        "n3": {"jobs": {}, "busy": []},
    }
    lines = node_jobs.table(reports, {"n2": "ssh: connect to host n2 port 22: No route to host"})
    assert lines[0].split() == ["job", "state", "nodes", "progress", "started", "restarts"]
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1_700_000_000.0))
    assert row(lines, "J1") == ["J1", "running", "n0,n1", "epoch 2, step 85, loss 0.5", started, "1/2"]
    assert "(no job on these nodes)" not in lines
    assert lines[lines.index("") + 1 :] == [
        "n0: busy: J1",
        "n1: busy: J1",
        "n2: down (ssh: connect to host n2 port 22: No route to host)",
        "n3: free",
        f"J1: {job_status.describe_restart(RESTART)}",
    ]
    assert lines[-1].startswith(
        "J1: restart 1: node n2 stopped answering; lost n2; on n0, n1 (spare n1 taken)"
    )


def test_a_running_job_whose_supervisor_is_gone_is_named_with_its_first_node() -> None:
    reports = {
        "n1": {"jobs": {"J7": job_item(status_dict(state="running", updated=5.0), ["n1"])}, "busy": []},
    }
    lines = node_jobs.table(reports)
    assert row(lines, "J7")[1] == "running, no supervisor on n1"
    assert "n1: free" in lines
    starting = {"n4": {"jobs": {"J8": job_item(status_dict(state="starting"), ["n4"])}, "busy": ["J8"]}}
    assert row(node_jobs.table(starting), "J8")[1:3] == ["starting, no supervisor on n4", "n4"]


def test_a_finished_job_keeps_its_state_without_a_supervisor() -> None:
    failed = status_dict(state="failed", nodes=["n0"], updated=10.0, elapsed=2.0)
    lines = node_jobs.table({"n0": {"jobs": {"J5": job_item(failed, ["n0"], max_restarts=1)}, "busy": []}})
    assert row(lines, "J5")[:3] == ["J5", "failed", "n0"]
    assert row(lines, "J5")[-1] == "0/1"


def test_a_job_known_only_from_a_node_without_its_status_is_shown_with_question_marks() -> None:
    """Its first node (with status.json and the supervisor) is down; a rank runs on n1."""
    lines = node_jobs.table(
        {"n1": {"jobs": {"J3": job_item(None, ["n0", "n1"])}, "busy": ["J3"]}}, {"n0": "no answer"}
    )
    cells = row(lines, "J3")
    assert cells[0] == "J3" and cells[2:] == ["n0,n1", "?", "?", "0/0"]
    assert "n0: down (no answer)" in lines and "n1: busy: J3" in lines


def test_jobs_are_listed_oldest_update_first() -> None:
    reports = {
        "n0": {
            "jobs": {
                "new": job_item(status_dict(state="succeeded", updated=300.0), ["n0"]),
                "old": job_item(status_dict(state="failed", updated=100.0), ["n0"]),
            },
            "busy": [],
        }
    }
    assert [line.split()[0] for line in node_jobs.table(reports)[1:3]] == ["old", "new"]


def test_no_job_on_the_nodes() -> None:
    lines = node_jobs.table({"n0": {"jobs": {}, "busy": []}, "n1": {"node": "n1"}}, {"n2": "x" * 300})
    assert lines[1] == "(no job on these nodes)"
    assert lines[2:] == ["", "n0: free", "n1: free", f"n2: down ({'x' * 120})"]
    assert node_jobs.table({}) == [lines[0], "(no job on these nodes)", ""]


def test_the_jobs_processes_left_here_are_stopped_by_the_supervisors_own_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank of J1 still runs here and no supervisor answers for it: after RANKS_WAIT it is stopped (one
    TERM sweep, a grace, a KILL sweep: ddp_cluster.supervisor.remote.Mesh.sweep); J2's rank is left alone."""
    root = tmp_path / "jobs"
    write_job(root, "J1", Status(state="running", updated=5.0), 5, ["n0"])
    ranks = {
        job: subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)", "--output-dir", f"{root}/{job}/output"]
        )
        for job in ("J1", "J2")
    }
    try:
        deadline = time.monotonic() + 10
        while set(jobs.running(str(root))[0]) != {"J1", "J2"} and time.monotonic() < deadline:
            time.sleep(0.05)
        monkeypatch.setattr(jobs, "RANKS_WAIT", 0.5)
        done = jobs.stop_here(str(root), "J1", "stopped with jobs.yml -e stop=J1")
        assert done == {"job": "J1", "supervisor": False, "left": True, "closed": True, "released": False}
        assert ranks["J1"].wait(timeout=10) == -15  # SIGTERM, from the sweep
        assert ranks["J2"].poll() is None
    finally:
        for rank in ranks.values():
            rank.kill()
            rank.wait()
