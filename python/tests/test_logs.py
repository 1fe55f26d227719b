"""jobs.yml -e logs=ID: which rank's log is where (mpirun, torchrun, after a restart), the reads by offset and
tail, the prefixes and the masking (ddp_cluster.supervisor.logs), the request's checks and the controller's
follow (ddp_cluster.job.logs, with a fake transport). The supervisor's node and "another node" are this
machine: the other node's read runs the real single-node command through a stand-in for ssh (a shell). No
containers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.job import logs as job_logs
from ddp_cluster.job import node_jobs
from ddp_cluster.job.logs import LogsError, LogsRequest
from ddp_cluster.job.spec import JobSpec
from ddp_cluster.job.status import Status
from ddp_cluster.job.transport import Done, Unreachable
from ddp_cluster.supervisor import logs
from ddp_cluster.supervisor.logs import Request, Source
from ddp_cluster.supervisor.remote import Mesh
from ddp_cluster.supervisor.standby import supervisor_alive

BASE: dict[str, Any] = {
    "id": "j1",
    "job_dir": "/workspace/jobs/j1",
    "nodes": ["n0", "n1"],
    "nproc_per_node": 2,
    "launcher": "mpirun",
    "device": "cpu",
    "networks": ["10.0.0.0/24"],
    "timeout": 600,
}


def make_spec(**changes: Any) -> JobSpec:
    return JobSpec.from_dict(BASE | changes)


# --- which log is where ---------------------------------------------------------------------------------
def test_mpirun_ranks_are_on_the_nodes_of_their_slots() -> None:
    found = logs.sources(make_spec())
    assert [(s.rank, s.node, s.launcher, s.process, s.stream) for s in found] == [
        (0, "n0", "mpirun", 0, "stdout"),
        (1, "n0", "mpirun", 1, "stdout"),
        (2, "n1", "mpirun", 2, "stdout"),
        (3, "n1", "mpirun", 3, "stdout"),
    ]
    assert found[2].prefix == "[n1 rank 2]"


def test_torchrun_workers_are_node_index_times_processes_plus_local_rank_with_both_streams() -> None:
    found = logs.sources(make_spec(launcher="torchrun", nodes=["n0", "n1", "n2"]))
    assert [(s.rank, s.node, s.process, s.stream) for s in found if s.stream == "stdout"] == [
        (0, "n0", 0, "stdout"),
        (1, "n0", 1, "stdout"),
        (2, "n1", 0, "stdout"),
        (3, "n1", 1, "stdout"),
        (4, "n2", 0, "stdout"),
        (5, "n2", 1, "stdout"),
    ]
    assert [s.key for s in found if s.rank == 3] == ["3", "3.stderr"]


def test_after_a_restart_the_ranks_follow_the_job_s_nodes_now() -> None:
    # the spare n2 took n1's place: job.json on the supervisor's node says so
    found = logs.sources(make_spec(nodes=["n0", "n2"], restart=1))
    assert {s.rank: s.node for s in found} == {0: "n0", 1: "n0", 2: "n2", 3: "n2"}


def test_rank_and_node_narrow_the_logs() -> None:
    spec = make_spec()
    assert [s.rank for s in logs.select_sources(spec, rank=3)] == [3]
    assert [s.rank for s in logs.select_sources(spec, node="n0")] == [0, 1]


@pytest.mark.parametrize(
    ("rank", "node", "said"),
    [
        (4, "", r"rank=4: job j1 has ranks 0 to 3"),
        (None, "n7", r"node=n7 is not one of job j1's nodes \(n0, n1\)"),
    ],
)
def test_a_rank_or_node_not_the_job_s_is_refused(rank: int | None, node: str, said: str) -> None:
    with pytest.raises(LogsError, match=said):
        logs.select_sources(make_spec(), rank=rank, node=node)


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_an_mpirun_log_is_found_whatever_mpirun_s_job_number(tmp_path: Path) -> None:
    log = write(tmp_path / "logs" / "2" / "rank.3" / "stdout", "x\n")
    assert logs.resolve(tmp_path, Source(3, "n1", "mpirun", 3)) == log
    assert logs.resolve(tmp_path, Source(1, "n0", "mpirun", 1)) is None


def test_an_mpirun_log_is_found_however_its_number_is_padded(tmp_path: Path) -> None:
    # Open MPI pads the number to the widest: rank.00 ... rank.15 among 16 processes
    padded = write(tmp_path / "logs" / "1" / "rank.03" / "stdout", "x\n")
    write(tmp_path / "logs" / "1" / "rank.13" / "stdout", "y\n")
    assert logs.resolve(tmp_path, Source(3, "n0", "mpirun", 3)) == padded
    assert logs.resolve(tmp_path, Source(1, "n0", "mpirun", 1)) is None


def test_a_torchrun_worker_s_log_is_its_newest_run_s_latest_attempt(tmp_path: Path) -> None:
    root = tmp_path / "logs" / "torchrun"
    old = write(root / "j1_aaa" / "attempt_0" / "1" / "stdout.log", "old\n")
    write(root / "j1_aaa" / "attempt_0" / "1" / "stderr.log", "old err\n")
    os.utime(root / "j1_aaa", (1000, 1000))
    assert logs.resolve(tmp_path, Source(1, "n0", "torchrun", 1)) == old
    newer = write(root / "j1_zzz" / "attempt_0" / "1" / "stdout.log", "new\n")
    write(root / "j1_zzz" / "attempt_2" / "0" / "stdout.log", "other worker\n")
    assert logs.resolve(tmp_path, Source(1, "n0", "torchrun", 1)) == newer  # a newer run, even sorted first
    latest = write(root / "j1_zzz" / "attempt_1" / "1" / "stdout.log", "again\n")
    assert logs.resolve(tmp_path, Source(1, "n0", "torchrun", 1)) == latest  # torchrun's own restart
    assert logs.resolve(tmp_path, Source(1, "n0", "torchrun", 1, "stderr")) is None  # not in the newest run


# --- reading ------------------------------------------------------------------------------------------
def test_the_tail_is_the_last_whole_lines_and_the_offset_after_them(tmp_path: Path) -> None:
    log = write(tmp_path / "log", "".join(f"line {n}\n" for n in range(30)) + "partial")
    lines, at = logs.read_log(log, None, 3, final=False)
    assert lines == ["line 27", "line 28", "line 29"]
    assert at == [log.stat().st_ino, log.stat().st_size - len("partial")]
    lines, at = logs.read_log(log, None, 2, final=True)  # the job ended: its last line, unfinished, too
    assert lines == ["line 29", "partial"]
    assert at[1] == log.stat().st_size


def test_a_tail_longer_than_the_log_is_the_whole_log(tmp_path: Path) -> None:
    log = write(tmp_path / "log", "a\r\nb\n")
    assert logs.read_log(log, None, 20, final=False)[0] == ["a", "b"]
    assert logs.read_log(write(tmp_path / "empty", ""), None, 20, final=False) == (
        [],
        [os.stat(tmp_path / "empty").st_ino, 0],
    )


def test_a_tail_of_a_long_log_reads_back_only_its_end(tmp_path: Path) -> None:
    log = write(tmp_path / "log", "".join(f"{n:07d}\n" for n in range(300_000)))  # 2.4 MB
    assert logs.read_log(log, None, 2, final=False)[0] == ["0299998", "0299999"]


def test_follow_reads_what_came_after_the_offset_and_waits_for_a_line_s_end(tmp_path: Path) -> None:
    log = write(tmp_path / "log", "one\n")
    _, at = logs.read_log(log, None, 5, final=False)
    with open(log, "a") as handle:
        handle.write("two\nthr")
    lines, at = logs.read_log(log, at, 5, final=False)
    assert lines == ["two"]
    with open(log, "a") as handle:
        handle.write("ee\n")
    assert logs.read_log(log, at, 5, final=False)[0] == ["three"]


def test_a_new_file_in_the_log_s_place_is_read_from_its_start(tmp_path: Path) -> None:
    # a restart moves the attempt's logs away (JOB/attempts/N/) and the next attempt writes new files
    log = write(tmp_path / "log", "first attempt, a long line\n")
    _, at = logs.read_log(log, None, 5, final=False)
    keep = tmp_path / "attempts-0-log"
    log.rename(keep)
    write(log, "second\n")
    assert logs.read_log(log, at, 5, final=False)[0] == ["second"]


def test_a_line_longer_than_one_read_comes_in_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "READ_MAX", 10)
    log = write(tmp_path / "log", "")
    write(log, "x" * 25)
    lines, at = logs.read_log(log, [log.stat().st_ino, 0], 5, final=False)
    assert lines == ["x" * 10] and at[1] == 10


SECRET = [b"s3cr3t-value"]
PEM = "-----BEGIN KEY-----\nAAAAsecretbody\n-----END KEY-----"


def test_a_secret_is_masked_before_the_log_is_cut_into_lines(tmp_path: Path) -> None:
    log = write(tmp_path / "log", f"key {PEM} end\nnext\n")
    hidden = [PEM.encode()]
    assert logs.read_log(log, None, 5, final=False, hidden=hidden)[0] == ["key *** end", "next"]
    from_start = [log.stat().st_ino, 0]
    assert logs.read_log(log, from_start, 5, final=False, hidden=hidden)[0] == ["key *** end", "next"]


def test_a_secret_being_written_over_lines_waits_to_be_masked_whole(tmp_path: Path) -> None:
    log = write(tmp_path / "log", "start\n")
    hidden = [PEM.encode()]
    _, at = logs.read_log(log, None, 5, final=False, hidden=hidden)
    with open(log, "a") as handle:
        handle.write("-----BEGIN KEY-----\nAAAAsec")  # the key's first line is whole: kept back all the same
    lines, at = logs.read_log(log, at, 5, final=False, hidden=hidden)
    assert lines == [] and at[1] == len("start\n")
    with open(log, "a") as handle:
        handle.write("retbody\n-----END KEY-----\n")
    assert logs.read_log(log, at, 5, final=False, hidden=hidden)[0] == ["***"]


def test_a_secret_across_two_pieces_of_a_long_line_is_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "READ_MAX", 16)
    log = write(tmp_path / "log", "x" * 10 + "s3cr3t-value" + "y" * 20 + "\n")
    at: list[int] = [log.stat().st_ino, 0]
    said = []
    for _ in range(5):
        lines, at = logs.read_log(log, at, 5, final=False, hidden=SECRET)
        said += lines
    assert "".join(said) == "x" * 10 + "***" + "y" * 20


def test_a_tail_cut_by_its_bound_starts_at_a_whole_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "TAIL_MAX", 20)
    log = write(tmp_path / "log", "s3cr3t-value-and-more-of-it\nshort\n")  # the bound cuts the first line
    assert logs.read_log(log, None, 5, final=False, hidden=SECRET)[0] == ["short"]
    long = write(tmp_path / "long", "a" * 40 + "\n")  # one line longer than the bound: none of it
    assert logs.read_log(long, None, 5, final=False)[0] == []


def test_a_log_that_is_a_link_is_not_read(job: Path, tmp_path: Path) -> None:
    target = write(tmp_path / "outside", "a file of the host\n")
    rank_log(job, 0).unlink()
    rank_log(job, 0).symlink_to(target)
    lines, summary = logs.answer_here(Request("j1", str(job.parent), 5, rank=0), ShellMesh("n0"))
    assert lines == [] and summary["notes"] == ["[n0 rank 0] no log yet"]


def test_masking_sees_a_secret_that_began_before_the_bytes_shown() -> None:
    assert logs.mask_bytes(b"abs3cr3t-value cd", SECRET, 5) == b"*** cd"
    assert logs.mask_bytes(b"s3cr3t-value ab s3cr3t-value", SECRET, 12) == b" ab ***"


# --- the supervisor's node: both nodes' logs, prefixed and masked -----------------------------------------
class ShellMesh(Mesh):
    """The other nodes are this machine: their commands run in a shell (the jobs' directory is shared, so
    mpirun's rank files, one name per rank, stand for both nodes')."""

    def ssh(self, node: str, *options: str) -> list[str]:
        return ["/bin/sh", "-c"]


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    env = write(tmp_path / "env.sh", f"PATH={Path(sys.executable).parent}:$PATH; export PATH\n")
    monkeypatch.setattr(node_jobs, "NODE_ENV", str(env))
    job_dir = tmp_path / "jobs" / "j1"
    spec = make_spec(nodes=["n0", "n1"], nproc_per_node=1, job_dir=str(job_dir), secret_env=["TOKEN"])
    write(job_dir / "job.json", spec.dumps())
    write(job_dir / "secrets.json", json.dumps({"TOKEN": "s3cr3t-value"}))
    # the job's supervisor, alive: a process with the supervisor's command line (its status names its pid)
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    supervisor = subprocess.Popen([*sleep, "ddp_cluster.supervise", "--job-dir", str(job_dir)])
    deadline = time.monotonic() + 10
    while not supervisor_alive(job_dir, supervisor.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # its command line is the supervisor's once python runs
    write(job_dir / "status.json", Status(state="running", nodes=("n0", "n1"), pid=supervisor.pid).dumps())
    write(job_dir / "logs" / "1" / "rank.0" / "stdout", "r0 a\nr0 token s3cr3t-value\n")
    write(job_dir / "logs" / "1" / "rank.1" / "stdout", "r1 a\nr1 b\n")
    yield job_dir
    supervisor.kill()
    supervisor.wait()


def rank_log(job_dir: Path, rank: int) -> Path:
    return job_dir / "logs" / "1" / f"rank.{rank}" / "stdout"


def test_every_rank_s_last_lines_prefixed_with_node_and_rank_and_secrets_masked(job: Path) -> None:
    lines, summary = logs.answer_here(Request("j1", str(job.parent), 1), ShellMesh("n0"))
    assert lines == ["[n0 rank 0] r0 token ***", "[n1 rank 1] r1 b"]
    assert summary["state"] == "running" and summary["done"] is False and summary["first"] == "n0"
    assert summary["offsets"]["1"] == [rank_log(job, 1).stat().st_ino, rank_log(job, 1).stat().st_size]
    assert summary["notes"] == []


def test_follow_waits_for_a_new_line_on_another_node_and_answers_when_it_comes(job: Path) -> None:
    _, summary = logs.answer_here(Request("j1", str(job.parent), 5), ShellMesh("n0"))

    def later() -> None:
        time.sleep(0.8)
        with open(rank_log(job, 1), "a") as handle:
            handle.write("r1 new\n")

    writer = threading.Thread(target=later)
    writer.start()
    started = time.monotonic()
    lines, _ = logs.answer_here(
        Request("j1", str(job.parent), 5, offsets=summary["offsets"], wait=8), ShellMesh("n0")
    )
    took = time.monotonic() - started
    writer.join()
    assert lines == ["[n1 rank 1] r1 new"]
    assert 0.7 < took < 3.0, took


def test_a_line_here_makes_the_other_nodes_answer_at_once(job: Path) -> None:
    _, summary = logs.answer_here(Request("j1", str(job.parent), 5), ShellMesh("n0"))
    threading.Timer(0.5, lambda: rank_log(job, 0).open("a").write("r0 new\n")).start()
    started = time.monotonic()
    lines, _ = logs.answer_here(
        Request("j1", str(job.parent), 5, offsets=summary["offsets"], wait=8), ShellMesh("n0")
    )
    assert lines == ["[n0 rank 0] r0 new"]
    assert time.monotonic() - started < 3.0  # not the other node's 8 s


def test_an_ended_job_answers_at_once_with_its_last_partial_line_and_says_done(job: Path) -> None:
    _, summary = logs.answer_here(Request("j1", str(job.parent), 5), ShellMesh("n0"))
    with open(rank_log(job, 1), "a") as handle:
        handle.write("last words")
    write(job / "status.json", Status(state="succeeded", nodes=("n0", "n1")).dumps())
    started = time.monotonic()
    lines, summary = logs.answer_here(
        Request("j1", str(job.parent), 5, offsets=summary["offsets"], wait=8), ShellMesh("n0")
    )
    assert lines == ["[n1 rank 1] last words"]
    assert summary["done"] is True and summary["state"] == "succeeded"
    assert time.monotonic() - started < 3.0


def test_a_follow_ends_when_the_job_s_supervisor_is_gone(job: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write(job / "status.json", Status(state="running", nodes=("n0", "n1"), pid=gone.pid).dumps())
    _, summary = logs.answer_here(Request("j1", str(job.parent), 5), ShellMesh("n0"))
    assert summary["done"] is True and summary["state"] == "running, no supervisor on n0"
    started = time.monotonic()
    _, summary = logs.answer_here(
        Request("j1", str(job.parent), 5, offsets=summary["offsets"], wait=8), ShellMesh("n0")
    )
    assert summary["done"] is True and time.monotonic() - started < 3.0


def test_a_node_without_the_job_s_secrets_shows_none_of_its_logs(job: Path, tmp_path: Path) -> None:
    # the other node's job directory, without secrets.json (n1's reads run in it)
    other = tmp_path / "other" / "j1"
    write(other / "logs" / "1" / "rank.1" / "stdout", "r1 s3cr3t-value\n")
    body = {"sources": [[1, "n1", "mpirun", 1, "stdout"]], "offsets": None, "tail": 5, "final": False}
    said = {}
    for masked in (True, False):
        command = [sys.executable, "-m", "ddp_cluster.supervisor.logs", "j1", "--jobs-dir", str(other.parent)]
        said[masked] = subprocess.run(
            [*command, "--read", json.dumps({**body, "masked": masked})],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    assert "s3cr3t" not in said[True] and "secrets.json is not readable" in said[True]
    assert "r1 s3cr3t-value" in said[False]  # a job without secrets: shown as it is


def test_a_rank_without_a_log_yet_and_a_node_that_does_not_answer_are_noted(job: Path) -> None:
    rank_log(job, 1).unlink()
    lines, summary = logs.answer_here(Request("j1", str(job.parent), 5), ShellMesh("n0"))
    assert summary["notes"] == ["[n1 rank 1] no log yet"]
    write(rank_log(job, 1), "a partial line")
    lines, summary = logs.answer_here(Request("j1", str(job.parent), 5), ShellMesh("n0"))
    assert summary["notes"] == ["[n1 rank 1] no line written yet"]

    class DownMesh(ShellMesh):
        def ssh(self, node: str, *options: str) -> list[str]:
            return [
                "/bin/sh",
                "-c",
                "echo 'ssh: connect to host n1 port 2222: Connection refused' >&2; exit 255",
            ]

    lines, summary = logs.answer_here(Request("j1", str(job.parent), 5), DownMesh("n0"))
    assert lines == ["[n0 rank 0] r0 a", "[n0 rank 0] r0 token ***"]
    assert summary["notes"] == [
        "n1: its logs could not be read over the mesh's ssh"
        " (ssh: connect to host n1 port 2222: Connection refused)"
    ]


def test_secrets_that_are_gone_refuse_rather_than_print_unmasked(job: Path) -> None:
    (job / "secrets.json").unlink()
    with pytest.raises(LogsError, match=r"secrets.json is no longer on .* runs/j1/logs/"):
        logs.answer_here(Request("j1", str(job.parent), 5), ShellMesh("n0"))


def test_the_json_escaped_form_of_a_secret_is_masked_too(job: Path) -> None:
    write(job / "secrets.json", json.dumps({"TOKEN": 'pa"ss\\word'}))
    write(rank_log(job, 0), 'config {"token": "pa\\"ss\\\\word"}\n')
    lines, _ = logs.answer_here(Request("j1", str(job.parent), 5, rank=0), ShellMesh("n0"))
    assert lines == ['[n0 rank 0] config {"token": "***"}']


# --- the command line ---------------------------------------------------------------------------------
def test_the_command_prints_lines_then_its_summary(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    me = socket.gethostname()
    spec = make_spec(nodes=[me], nproc_per_node=2, job_dir=str(job))
    write(job / "job.json", spec.dumps())
    write(job / "status.json", Status(state="running", nodes=(me,), supervisor_node=me).dumps())
    assert logs.main(["j1", "--jobs-dir", str(job.parent), "--tail", "1", "--rank", "1"]) == 0
    out = capsys.readouterr().out
    answer = job_logs.parse_answer(out)
    assert answer.lines == [f"[{me} rank 1] r1 b"]
    assert answer.first == me and answer.state == "running" and set(answer.offsets) == {"1"}


def test_the_command_runs_itself_on_the_supervisor_s_node_once(
    job: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    me = socket.gethostname()
    write(job / "job.json", make_spec(nodes=[me], nproc_per_node=2, job_dir=str(job)).dumps())
    asked: list[str] = []

    class Forwarding(ShellMesh):
        def ssh(self, node: str, *options: str) -> list[str]:
            asked.append(node)
            return super().ssh(node, *options)

    monkeypatch.setattr(logs, "Mesh", Forwarding)
    # an earlier answer named "elsewhere": the command goes there (a shell here) and answers there, not again
    assert logs.main(["j1", "--jobs-dir", str(job.parent), "--tail", "1", "--first", "elsewhere"]) == 0
    answer = job_logs.parse_answer(capfd.readouterr().out)
    assert asked == ["elsewhere"]
    assert answer.lines == [f"[{me} rank 0] r0 token ***", f"[{me} rank 1] r1 b"]


def test_the_command_names_a_job_no_node_has(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    me = socket.gethostname()
    assert logs.main(["nosuch", "--jobs-dir", str(tmp_path), "--nodes", me]) == 3
    assert "no node has job nosuch" in capsys.readouterr().err


# --- the controller ---------------------------------------------------------------------------------------
def test_the_request_s_values_are_checked_before_anything_runs() -> None:
    assert LogsRequest.from_vars("j1", "5", "1", "", "true", "", ["n0"]) == LogsRequest(
        "j1", 5, 1, "", True, ""
    )
    assert LogsRequest.from_vars("j1", None, "", "", "", "") == LogsRequest("j1")
    assert LogsRequest.from_vars("j1", rank="0").rank == 0
    cases: list[tuple[dict[str, Any], str]] = [
        ({"job": "a b"}, "logs='a b' is not a job id"),
        ({"tail": "0"}, "tail='0' must be a positive whole number"),
        ({"tail": "-3"}, "tail='-3' must be a positive whole number"),
        ({"tail": True}, "tail=True must be a positive whole number"),
        ({"rank": "x"}, "rank='x' must be a whole number of 0 or more"),
        ({"rank": "-1"}, "rank='-1' must be a whole number of 0 or more"),
        ({"follow": "maybe"}, "follow='maybe' must be true or false"),
        ({"rank": "1", "node": "n0"}, "give one of them"),
        ({"via": "n9"}, r"via=n9 is not a node of the inventory \(n0, n1\)"),
    ]
    for given, said in cases:
        with pytest.raises(LogsError, match=said):
            LogsRequest.from_vars(**({"job": "j1"} | given), nodes=["n0", "n1"])


def test_the_node_command_carries_the_request_and_the_offsets() -> None:
    line = job_logs.node_command(
        LogsRequest("j1", 7, rank=2), "/workspace/jobs", {"2": [5, 9]}, 3.0, "n1", ["n0", "n1"]
    )
    assert line.startswith(f". {node_jobs.NODE_ENV} && python -m ddp_cluster.supervisor.logs j1 ")
    assert "--tail 7 --rank 2 --follow-from '{\"2\":[5,9]}' --wait 3 --first n1 --nodes n0,n1" in line


class FakeTransport:
    """The entry node's answers, in order; the commands it was given."""

    def __init__(self, answers: list[Done | Exception]) -> None:
        self.answers = answers
        self.commands: list[str] = []

    def run(self, command: str) -> Done:
        self.commands.append(command)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def put(self, local: str) -> str:
        raise AssertionError("nothing is copied")

    def close(self) -> None:
        pass


def answer(
    lines: list[str], offsets: dict[str, Any], state: str = "running", notes: list[str] | None = None
) -> Done:
    summary = {"offsets": offsets, "state": state, "done": state in ("succeeded", "failed"), "first": "n1"}
    return Done(0, "\n".join([*lines, json.dumps(summary | {"notes": notes or []})]) + "\n")


def test_follow_shows_the_tail_then_each_new_line_until_the_job_ends() -> None:
    transport = FakeTransport(
        [
            answer(["[n1 rank 0] a"], {"0": [1, 2]}, notes=["[n2 rank 1] no log yet"]),
            answer([], {"0": [1, 2]}, notes=["[n2 rank 1] no log yet"]),
            answer(["[n1 rank 0] b", "[n2 rank 1] c"], {"0": [1, 4], "1": [7, 2]}),
            answer(["[n1 rank 0] end"], {"0": [1, 8]}, state="succeeded"),
        ]
    )
    said: list[str] = []
    result = job_logs.show(transport, "n0", LogsRequest("j1", follow=True), "/workspace/jobs", said.append)
    assert said == [
        "[n1 rank 0] a",
        "[n2 rank 1] no log yet",
        "[n1 rank 0] b",
        "[n2 rank 1] c",
        "[n1 rank 0] end",
        "job j1 succeeded: nothing more to follow",
    ]
    assert result["lines"] == 4 and result["stopped"] == "ended" and result["state"] == "succeeded"
    assert "--follow-from" not in transport.commands[0]
    assert "--first n1" in transport.commands[1] and "'{\"0\":[1,2]}'" in transport.commands[1]
    assert '"1":[7,2]' in transport.commands[3]  # offsets of every log reached so far
    assert transport.commands[0].startswith("docker exec n0 /bin/bash -c ")


def test_a_follow_whose_supervisor_s_node_is_gone_finds_the_job_again() -> None:
    transport = FakeTransport(
        [
            answer(["[n1 rank 0] a"], {"0": [1, 2]}),
            Done(255, "", "n1, which runs the job's supervisor, does not answer over the mesh's ssh"),
            answer(["[n2 rank 0] b"], {"0": [3, 2]}, state="failed"),
        ]
    )
    said: list[str] = []
    job_logs.show(transport, "n0", LogsRequest("j1", follow=True), "/workspace/jobs", said.append)
    assert "--first n1" in transport.commands[1] and "--first" not in transport.commands[2]
    assert said[:2] == ["[n1 rank 0] a", "[n2 rank 0] b"]


def test_without_follow_one_ask_and_done() -> None:
    transport = FakeTransport([answer(["[n1 rank 0] a"], {"0": [1, 2]})])
    result = job_logs.show(transport, "n0", LogsRequest("j1"), "/workspace/jobs", lambda line: None)
    assert len(transport.commands) == 1 and result["stopped"] == ""


def test_an_interrupt_stops_the_following_and_nothing_else() -> None:
    transport = FakeTransport([answer(["[n1 rank 0] a"], {"0": [1, 2]}), answer([], {"0": [1, 2]})])
    asked = iter([False, True])
    said: list[str] = []
    result = job_logs.show(
        transport, "n0", LogsRequest("j1", follow=True), "/workspace/jobs", said.append, lambda: next(asked)
    )
    assert result["stopped"] == "interrupted"
    assert said[-1] == "job j1: stopped following (Ctrl-C); the job goes on (jobs.yml lists it)"
    assert all("--stop" not in command and "stop" not in command.split() for command in transport.commands)


def test_an_entry_node_that_fails_or_does_not_answer_is_said() -> None:
    down = FakeTransport([Unreachable("ssh: connection refused")])
    with pytest.raises(LogsError, match=r"entry node n0 does not answer .* -e via=NODE"):
        job_logs.show(down, "n0", LogsRequest("j1"), "/workspace/jobs", lambda line: None)
    refused = FakeTransport(
        [Done(3, "", "ddp_cluster.supervisor.logs: no node has job j1 (asked 2 node(s))")]
    )
    with pytest.raises(LogsError, match=r"n0: ddp_cluster\.supervisor\.logs: no node has job j1"):
        job_logs.show(refused, "n0", LogsRequest("j1"), "/workspace/jobs", lambda line: None)
    cut = FakeTransport([Done(0, "[n1 rank 0] a\n")])
    with pytest.raises(LogsError, match="gave no summary"):
        job_logs.show(cut, "n0", LogsRequest("j1"), "/workspace/jobs", lambda line: None)


# --- shown, never obeyed ----------------------------------------------------------------------------------
HOSTILE = (
    "title \x1b]0;owned\x07 clear \x1b[2J\x1b[H clip \x1b]52;c;cm0gLXJmIH4=\x07 bell \x07 back \x08\x08"
    " csi8 \x9b31m bidi \u202eevil\u202c"
)


def test_a_rank_s_escape_sequences_reach_the_controller_s_display_written_out(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the node's real answer (its command line), then the controller's follow of it, with a fake transport
    me = socket.gethostname()
    write(job / "job.json", make_spec(nodes=[me], nproc_per_node=2, job_dir=str(job)).dumps())
    write(job / "status.json", Status(state="running", nodes=(me,), supervisor_node=me).dumps())
    with open(rank_log(job, 1), "ab") as handle:
        handle.write((HOSTILE + "\n").encode() + b"progress 10%\r[n0 rank 0] forged\r\n")
    assert logs.main(["j1", "--jobs-dir", str(job.parent), "--tail", "2", "--rank", "1"]) == 0
    said: list[str] = []
    job_logs.show(
        FakeTransport([Done(0, capsys.readouterr().out)]), "n0", LogsRequest("j1"), "/j", said.append
    )
    assert said == [
        f"[{me} rank 1] title \\x1b]0;owned\\x07 clear \\x1b[2J\\x1b[H clip \\x1b]52;c;cm0gLXJmIH4=\\x07 bell"
        " \\x07 back \\x08\\x08 csi8 \\x9b31m bidi \\u202eevil\\u202c",
        # a carriage return mid-line cannot put the cursor back over the prefix (the one ending it is CRLF's)
        f"[{me} rank 1] progress 10%\\r[n0 rank 0] forged",
    ]


def test_every_line_and_note_a_follow_says_starts_with_its_prefix_and_holds_no_control_character() -> None:
    transport = FakeTransport(
        [
            answer(["[n1 rank 0] a\rb", "[n1 rank 0] \x1b[1A\x1b[2K up"], {"0": [1, 2]}, notes=["n2: \x1bc"]),
            answer(["[n1 rank 0] \x00\x7f\x85\u2028end\tok"], {"0": [1, 8]}, state="succeeded"),
        ]
    )
    said: list[str] = []
    job_logs.show(transport, "n0", LogsRequest("j1", follow=True), "/workspace/jobs", said.append)
    assert said == [
        "[n1 rank 0] a\\rb",
        "[n1 rank 0] \\x1b[1A\\x1b[2K up",
        "n2: \\x1bc",
        "[n1 rank 0] \\x00\\x7f\\x85\\u2028end\tok",
        "job j1 succeeded: nothing more to follow",
    ]
    assert all(ch == "\t" or ch.isprintable() for line in said for ch in line)


def test_an_entry_node_s_error_is_shown_not_obeyed() -> None:
    refused = FakeTransport([Done(2, "", "ddp_cluster.supervisor.logs: \x1b]52;c;eA==\x07 bad")])
    with pytest.raises(LogsError) as raised:
        job_logs.show(refused, "n0", LogsRequest("j1"), "/workspace/jobs", lambda line: None)
    assert "\x1b" not in str(raised.value) and "\\x1b]52;c;eA==\\x07 bad" in str(raised.value)
    cut = FakeTransport([Done(0, "\x1b[2J no summary\n")])
    with pytest.raises(LogsError, match=r"its last line: \\x1b\[2J no summary"):
        job_logs.show(cut, "n0", LogsRequest("j1"), "/workspace/jobs", lambda line: None)
