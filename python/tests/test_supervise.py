"""The supervisor's parts: the liveness probe tells a dead node from a slow one (ssh's own messages, OpenSSH
9), what failed from real mpirun 4.1 and torchrun output, the status file, and the supervisor around stand- in
launchers."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.job.spec import JobSpec
from ddp_cluster.supervisor.failures import launcher_failure
from ddp_cluster.supervisor.liveness import probe_verdict
from ddp_cluster.supervisor.loop import STATUS_FILE, StatusFile, Supervisor, parse_args


@pytest.mark.parametrize(
    "stderr",
    [
        "ssh: connect to host node1 port 12345: Connection refused\r\n",
        "ssh: connect to host node1 port 12345: No route to host\r\n",
        "ssh: connect to host 172.30.99.11 port 12345: Connection timed out\r\n",
        "ssh: Could not resolve hostname node1: Name or service not known\r\n",
        "ssh: connect to host node1 port 12345: Network is unreachable\r\n",
    ],
)
def test_a_node_that_does_not_answer_at_all_is_down(stderr: str) -> None:
    assert probe_verdict(255, stderr) == "down"


@pytest.mark.parametrize(
    "stderr",
    [
        "Connection timed out during banner exchange\r\nConnection to 172.18.0.3 port 12345 timed out\r\n",
        "kex_exchange_identification: read: Connection reset by peer\r\n",
        "kex_exchange_identification: Connection closed by remote host\r\n",
        "Connection closed by 172.18.0.3 port 12345\r\n",
    ],
)
def test_a_node_whose_sshd_is_too_busy_to_finish_is_slow_not_dead(stderr: str) -> None:
    assert probe_verdict(255, stderr) == "slow"


def test_a_login_that_runs_past_the_bound_after_connecting_is_slow_and_success_is_up() -> None:
    assert probe_verdict(None, "") == "slow"
    assert probe_verdict(0, "") == "up"


# --- what failed, from the launcher's real output (python/tests/data/supervise/) ---

DATA = Path(__file__).parent / "data" / "supervise"


def spec(**changes: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "id": "j1",
        "job_dir": "/workspace/jobs/j1",
        "nodes": ["node0", "node1"],
        "nproc_per_node": 1,
        "launcher": "mpirun",
        "device": "cpu",
        "networks": ["172.23.0.0/16"],
        "timeout": 60,
        "poll": 0.1,
    }
    return JobSpec.from_dict(fields | changes)


def test_mpiruns_first_non_zero_exit_names_the_rank_and_its_node() -> None:
    failure = launcher_failure((DATA / "mpirun-exit.log").read_text(), spec(), 1)
    assert (failure.reason, failure.node, failure.rank, failure.exit_code) == (
        "a rank exited with an error",
        "node1",
        1,
        3,
    )
    two_per_node = launcher_failure((DATA / "mpirun-exit.log").read_text(), spec(nproc_per_node=2), 1)
    assert (two_per_node.node, two_per_node.rank) == ("node0", 1)


def test_with_torchrun_mpiruns_process_is_a_nodes_agent_not_a_rank() -> None:
    failure = launcher_failure(
        (DATA / "mpirun-exit.log").read_text(), spec(launcher="torchrun", nproc_per_node=4), 1
    )
    assert (failure.node, failure.rank, failure.exit_code) == ("node1", None, 3)


def test_a_rank_killed_by_a_signal() -> None:
    failure = launcher_failure((DATA / "mpirun-signal.log").read_text(), spec(), 1)
    assert (failure.reason, failure.node, failure.rank, failure.signal) == (
        "a rank was killed by a signal",
        "node1",
        1,
        9,
    )


def test_torchruns_root_cause_names_the_worker() -> None:
    failure = launcher_failure((DATA / "torchrun-root-cause.log").read_text(), spec(launcher="torchrun"), 1)
    assert (failure.node, failure.rank, failure.signal, failure.exit_code) == ("node1", 1, 9, None)


def test_output_that_names_nothing_leaves_the_launchers_status() -> None:
    failure = launcher_failure("mpirun: command line parse error\n", spec(), 213)
    assert (failure.reason, failure.node, failure.exit_code) == (
        "the launcher exited with status 213",
        None,
        213,
    )


# --- the status file ---


def test_status_file_is_rewritten_whole_with_the_elapsed_time(tmp_path: Path) -> None:
    status = StatusFile(tmp_path / "status.json", started=time.time() - 5)
    status.write(state="running", progress=None)
    status.write(progress={"epoch": 1})
    written = json.loads((tmp_path / "status.json").read_text())
    assert written["state"] == "running" and written["progress"] == {"epoch": 1} and written["elapsed"] >= 5
    assert [path.name for path in tmp_path.iterdir()] == ["status.json"]


# --- the supervisor, with stand-ins for the launcher on this host (a job of one node: no ssh) ---


def supervise(tmp_path: Path, launcher: list[str], **changes: Any) -> dict[str, Any]:
    job_dir = tmp_path / "jobs" / "j1"
    job = spec(nodes=[socket.gethostname()], job_dir=str(job_dir), **changes)
    code = Supervisor(spec=job, job_dir=job_dir, launcher=launcher).run()
    status: dict[str, Any] = json.loads((job_dir / STATUS_FILE).read_text())
    assert code == (0 if status["state"] == "succeeded" else 1)
    return status


def test_a_launcher_that_succeeds(tmp_path: Path) -> None:
    status = supervise(tmp_path, ["sh", "-c", "echo done"])
    assert status["state"] == "succeeded" and status["rc"] == 0


def test_a_failing_rank_is_named_from_the_launchers_output(tmp_path: Path) -> None:
    fixture = DATA / "mpirun-exit.log"
    status = supervise(tmp_path, ["sh", "-c", f"cat {fixture}; exit 1"])
    assert status["state"] == "failed"
    assert (status["reason"], status["failed_rank"], status["exit_code"]) == (
        "a rank exited with an error",
        1,
        3,
    )
    assert "Exit code:    3" in "\n".join(status["launcher_tail"])


def test_the_time_bound_stops_the_launcher(tmp_path: Path) -> None:
    started = time.monotonic()
    status = supervise(tmp_path, ["sleep", "30"], timeout=1)
    assert status["state"] == "failed" and status["reason"] == "the job did not finish within job_timeout=1 s"
    assert time.monotonic() - started < 20
    assert status["leftover"] == {}


def test_a_stop_asked_from_the_controller_ends_the_job_with_its_reason(tmp_path: Path) -> None:
    import threading

    job_dir = tmp_path / "jobs" / "j1"
    job = spec(nodes=[socket.gethostname()], job_dir=str(job_dir))
    supervisor = Supervisor(spec=job, job_dir=job_dir, launcher=["sleep", "30"])
    threading.Timer(1.0, supervisor.stop, ["interrupted on the controller (Ctrl-C)"]).start()
    started = time.monotonic()
    assert supervisor.run() == 1
    status = json.loads((job_dir / STATUS_FILE).read_text())
    assert status["state"] == "failed" and status["reason"] == "interrupted on the controller (Ctrl-C)"
    assert status["interrupted"] == "interrupted on the controller (Ctrl-C)"
    assert time.monotonic() - started < 20


def test_a_job_file_that_cannot_be_used_is_refused_naming_the_field(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "job.json").write_text(json.dumps(spec().to_dict() | {"nproc_per_node": 0}))
    with pytest.raises(SystemExit):
        parse_args(["--job-dir", str(tmp_path)])
    assert "nproc_per_node=0 must be at least 1" in capsys.readouterr().err


# --- the nodes as the supervisor reaches them: this one, by a shell ---


def test_this_node_counts_lists_and_sweeps_the_jobs_processes(tmp_path: Path) -> None:
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from ddp_cluster.supervisor.remote import Mesh

    tag = f"{tmp_path}/jobs/j1/"
    mesh = Mesh(socket.gethostname())
    rank = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "--output-dir", f"{tag}output"]
    )
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            deadline = time.monotonic() + 10
            while mesh.counts([mesh.me], tag, pool)[mesh.me] < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert mesh.counts([mesh.me], tag, pool) == {mesh.me: 1}  # not the pgrep itself
            assert f"{tag}output" in mesh.leftover([mesh.me], tag, pool)[mesh.me]
            assert mesh.probe(mesh.me) == "up"
            mesh.sweep([mesh.me], tag, pool, grace=0.1)
            assert rank.wait(timeout=10) == -15
            assert mesh.leftover([mesh.me], tag, pool) == {}
    finally:
        rank.kill()
        rank.wait()


def test_a_probe_opens_its_own_connection_a_command_shares_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # The mesh's ssh config shares one connection per node (ControlMaster): a command may ride it, but a probe
    # judges whether the node answers now, which only a login of its own says.
    import subprocess

    from ddp_cluster.supervisor.remote import Mesh

    seen: list[list[str]] = []

    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, "3\n", "")

    monkeypatch.setattr(subprocess, "run", run)
    mesh = Mesh("node0")
    assert mesh.probe("node1") == "up"
    assert mesh.run("node2", "pgrep -c x") == "3\n"
    probe, command = seen
    assert "ControlPath=none" in probe and probe.index("ControlPath=none") < probe.index("node1")
    assert not any("ControlPath" in word for word in command)


def test_a_node_found_down_loses_its_shared_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    # A command over the shared connection to a node that went down would wait for the master's keepalives;
    # once a fresh login is refused, the master is ended, and the next command fails at once.
    import subprocess

    from ddp_cluster.supervisor.remote import Mesh

    seen: list[list[str]] = []

    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        refused = "ssh: connect to host node1 port 12345: Connection refused\r\n"
        return subprocess.CompletedProcess(argv, 255, "", refused if "true" in argv else "")

    monkeypatch.setattr(subprocess, "run", run)
    assert Mesh("node0").probe("node1") == "down"
    probe, drop = seen
    assert probe[-1] == "true" and drop[-3:] == ["node1", "-O", "exit"] and "ControlPath=none" not in drop
    Mesh("node0").drop("node0")  # this node: no ssh at all
    assert len(seen) == 2


def test_with_torchrun_the_failing_agents_own_log_names_the_rank(tmp_path: Path) -> None:
    # mpirun writes a rank's output on its own node only (--output-filename DIR:nocopy): launcher.log holds
    # mpirun's lines, which name the failing node's agent; torchrun's Root Cause block is in that agent's log.
    job_dir = tmp_path / "jobs" / "j1"
    job_dir.mkdir(parents=True)
    (job_dir / "launcher.log").write_text((DATA / "mpirun-exit.log").read_text())
    job = spec(launcher="torchrun", job_dir=str(job_dir))
    supervisor = Supervisor(spec=job, job_dir=job_dir, launcher=[])
    asked: list[tuple[int, str]] = []

    def agent_log(process: int, node: str) -> list[str]:
        asked.append((process, node))
        return (DATA / "torchrun-root-cause.log").read_text().splitlines()[-20:]

    supervisor.rank_log_tail = agent_log  # type: ignore[method-assign]
    failure = supervisor.launcher_failure(1)
    assert asked == [(1, "node1")]
    assert (failure.node, failure.rank, failure.signal) == ("node1", 1, 9)
    # An agent's log without the block: mpirun's own verdict stands (the node, no rank).
    supervisor.rank_log_tail = lambda process, node: ["no root cause here"]  # type: ignore[method-assign]
    assert (supervisor.launcher_failure(1).node, supervisor.launcher_failure(1).rank) == ("node1", None)


def test_mpirun_keeps_each_ranks_output_on_its_own_node() -> None:
    argv = spec().launch_argv()
    assert argv[argv.index("--output-filename") + 1] == "/workspace/jobs/j1/logs:nocopy"


def test_a_log_tail_ends_lines_at_newlines_only(tmp_path: Path) -> None:
    """A rank's "\\r" stays inside its line (shown written out): it cannot start a forged line of its own."""
    from ddp_cluster.supervisor.failures import tail

    log = tmp_path / "stdout"
    log.write_bytes(b"one\r\nprogress 50%\r[node1 rank 1] forged\nthree\x0bfour\n")
    assert tail(log) == ["one", "progress 50%\r[node1 rank 1] forged", "three\x0bfour"]
