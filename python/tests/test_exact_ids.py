"""Job ids matched exactly and checked whole (issue 45, point 9): an id is checked with fullmatch and a length
limit wherever it comes in (request, spec, attach, the node's command line), with an error naming it; the
pgrep/pkill patterns of a job's processes match its directory as a fixed string (job ``a.1``'s never reaches
job ``a-1``'s), shown on real processes. No container."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_job import BASE

from ddp_cluster.job import control, node_jobs, request, spec
from ddp_cluster.supervisor import jobs, liveness, remote

LONG_ID = "j" * 300


@pytest.mark.parametrize(
    "value", ["a.1\n", "a.1\n\n", LONG_ID, "j" * 65, "", "../x", "a b", "-rf", "a/1", "é"]
)
def test_what_is_no_job_id_is_named(value: str) -> None:
    problem = node_jobs.id_problem(value, "job_id")
    assert problem.startswith("job_id="), problem
    if len(value) > node_jobs.ID_MAX:
        assert f"is {len(value)} characters long: a job id is at most {node_jobs.ID_MAX}" in problem
        assert len(problem) < 200, "a long id is shown cut, not whole"
    else:
        assert "is not a job id: a job id is letters, digits, _ . and -" in problem


@pytest.mark.parametrize("value", ["a.1", "a-1", "A_b.c-9", "j" * 64, "20260101-120000-abcd"])
def test_a_job_id_passes_whole(value: str) -> None:
    assert node_jobs.id_problem(value) == ""
    assert node_jobs.JOB_ID.fullmatch(value) is not None


def test_the_specs_own_check_matches_whole_and_bounds_the_length() -> None:
    assert spec.NAME.match("a.1\n") is None, "a trailing newline is no part of an id"
    for bad, said in (("a.1\n", "is not a job id"), (LONG_ID, "300 characters long")):
        with pytest.raises(spec.JobSpecError, match=said):
            spec.JobSpec.from_dict({**BASE, "id": bad})


def test_the_request_names_a_bad_job_id_and_a_bad_attach_before_anything_is_planned() -> None:
    problems = request.id_problems({"id": LONG_ID, "attach": "a.1\n"})
    assert len(problems) == 2
    assert problems[0].startswith("job_id='jjjj") and "300 characters long" in problems[0]
    assert problems[1].startswith("attach='a.1\\n' is not a job id")
    assert request.id_problems({"id": "", "attach": ""}) == []  # none asked: one is made
    assert request.check_request({"id": "a.1\n"}, {"ddp_job_id": {"type": "str"}}) == [
        node_jobs.id_problem("a.1\n", "job_id")
    ]


def test_attach_names_a_long_id_without_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(control.AttachError, match="300 characters long"):
        control.attach_plan(tmp_path, LONG_ID)


@pytest.mark.parametrize("option", ["--claim", "--stop", "--release"])
def test_the_node_command_refuses_an_id_with_a_newline_or_too_long(
    tmp_path: Path, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad in ("a.1\n", LONG_ID):
        with pytest.raises(SystemExit):
            jobs.main(["--jobs-dir", str(tmp_path), option, bad])
        said = capsys.readouterr().err
        assert f"{option}=" in said and ("is not a job id" in said or "characters long" in said), said
    assert not (tmp_path / jobs.CLAIM).exists()


# --- fixed strings in pgrep and pkill ---


@pytest.fixture
def two_jobs(tmp_path: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """A process of job a.1 and one of job a-1, each naming its directory on its command line."""
    root = tmp_path / "jobs"
    started = {
        job: subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)", f"{root}/{job}/output"],
        )
        for job in ("a.1", "a-1")
    }
    time.sleep(0.3)
    yield started
    for proc in started.values():
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


def pgrep(pattern: str) -> set[int]:
    found = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True, check=False)
    return {int(pid) for pid in found.stdout.split()}


def test_a_jobs_pattern_matches_its_own_directory_only(
    tmp_path: Path, two_jobs: dict[str, subprocess.Popen[bytes]]
) -> None:
    root = tmp_path / "jobs"
    dotted = remote.pattern(f"{root}/a.1/")
    assert dotted.startswith("[/]") and "a\\.1/" in dotted
    assert pgrep(dotted) == {two_jobs["a.1"].pid}, "job a.1's pattern must not reach job a-1"
    assert pgrep(remote.pattern(f"{root}/a-1/")) == {two_jobs["a-1"].pid}
    assert liveness.tag_pattern(f"{root}/a.1/") == dotted
    assert node_jobs.literal_of(dotted) == f"{root}/a.1/"


def test_the_sweep_of_job_a_1_leaves_job_a_dash_1_running(
    tmp_path: Path, two_jobs: dict[str, subprocess.Popen[bytes]]
) -> None:
    """``jobs.yml -e stop=a.1`` ends in this sweep on each node (jobs.stop_here, the supervisor's stop)."""
    me = socket.gethostname()
    with ThreadPoolExecutor(max_workers=1) as pool:
        remote.Mesh(me).sweep([me], f"{tmp_path}/jobs/a.1/", pool, grace=0.5)
    assert two_jobs["a.1"].wait(timeout=10) is not None
    assert two_jobs["a-1"].poll() is None, "job a-1's process was stopped by job a.1's sweep"


def test_the_watchers_sweep_is_as_exact(tmp_path: Path, two_jobs: dict[str, subprocess.Popen[bytes]]) -> None:
    liveness.sweep_node(liveness.tag_pattern(f"{tmp_path}/jobs/a.1/"), grace=0.5)
    assert two_jobs["a.1"].wait(timeout=10) is not None
    assert two_jobs["a-1"].poll() is None


def test_every_character_a_regular_expression_gives_a_meaning_is_escaped() -> None:
    text = "/w s/jobs/x.y+z*(1)[2]{3}|4^5$6?7\\8/"
    pattern = node_jobs.literal_pattern(text)
    assert node_jobs.literal_of(pattern) == text
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", f"{text}out"])
    try:
        time.sleep(0.3)
        assert pgrep(pattern) == {proc.pid}
        assert pgrep(node_jobs.literal_pattern("/w s/jobs/xAy+z")) == set()
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(ValueError):
        node_jobs.literal_pattern("^starts")


def test_the_commands_that_look_for_a_supervisor_escape_its_directory() -> None:
    check = control.supervisor_check("/workspace/jobs/a.1")
    assert "a\\.1$" in check and "a.1$" not in check.replace("a\\.1$", "")
    from ddp_cluster.supervisor import standby

    assert "a\\.1 " in standby.start_command("/workspace/jobs/a.1", "n0", 25, "/etc/env.sh")


def test_the_watchers_tag_survives_its_command_line(tmp_path: Path) -> None:
    """The watcher takes its tag in pattern form and reads the text back exactly (liveness.main)."""
    seen: dict[str, str] = {}

    class Stop(Exception):
        pass

    def watch(*args: object, **kwargs: object) -> None:
        seen["tag"] = str(kwargs["tag"])
        raise Stop

    original = liveness.Watch
    liveness.Watch = watch  # type: ignore[assignment,misc]
    try:
        with pytest.raises(Stop), contextlib.redirect_stdout(io.StringIO()):
            liveness.main(
                ["--nodes", "n0,n1", "--index", "1", "--tag", liveness.tag_pattern("/workspace/jobs/a.1/")],
                stdin=io.StringIO(""),
            )
    finally:
        liveness.Watch = original  # type: ignore[misc]
    assert seen["tag"] == "/workspace/jobs/a.1/"
    assert os.sep == "/"
