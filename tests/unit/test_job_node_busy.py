"""The ddp_job_node action's one-job-per-node check (plugins/action/ddp_job_node.py): the ``busy:`` lines its
in-node script prints and what they make of the node, and the script itself, run with /bin/sh on this machine
(pgrep over this machine's processes; no container). Container-free."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


node = _load("ddp_job_node_busy_under_test", REPO / "plugins" / "action" / "ddp_job_node.py")

FAKE_JOBS = "/nonexistent-ddp/jobs"


# --- busy_jobs(): the busy: lines ---


def test_busy_lines_name_the_other_jobs_and_their_nodes() -> None:
    output = "\n".join(
        [
            'busy: J1 "nodes": ["node0", "node1"]',
            'busy: J2 "nodes": [    "node2",    "node3"  ]',  # job.json's indented list, its newlines cut
            'busy: OWN "nodes": ["node0"]',
            "listening: LISTEN 0 128 0.0.0.0:29501 0.0.0.0:*",
            "up",
        ]
    )
    assert node.busy_jobs(output, "OWN") == {"J1": ["node0", "node1"], "J2": ["node2", "node3"]}
    assert node.busy_jobs(output, "J1") == {"J2": ["node2", "node3"], "OWN": ["node0"]}


def test_a_busy_line_without_readable_nodes_still_names_the_job() -> None:
    output = "busy: J3 \nbusy: J4 garbage\nbusy: J5\nup"
    assert node.busy_jobs(output, "J9") == {"J3": [], "J4": [], "J5": []}
    assert node.busy_jobs("up\nnot busy: J6\n", "J9") == {}


# --- problems(): what a busy node is told ---


def test_a_node_busy_with_another_job_names_it_and_not_the_master_port() -> None:
    output = 'busy: J1 "nodes": ["node0", "node1"]\nlistening: LISTEN 0 128 *:29501 *:*\nup'
    found = node.problems("node0", "node0", output, 29501, [], own="J2")
    assert len(found) == 1
    assert found[0].startswith("node0 runs another job: job J1 (nodes node0, node1).")
    assert "jobs.yml -e stop=J1" in found[0] and "-e wait=true" in found[0]
    assert "master port" not in found[0]


def test_two_other_jobs_are_both_named_and_the_first_one_is_offered_to_stop() -> None:
    output = 'busy: J1 "nodes": ["node0"]\nbusy: J3 \nup'
    (problem,) = node.problems("node0", "node0", output, None, [], own="J2")
    assert "job J1 (nodes node0); job J3 (nodes ?)" in problem and "-e stop=J1" in problem


def test_the_master_port_is_named_when_no_other_job_runs() -> None:
    output = 'listening: LISTEN 0 128 *:29501 *:*\nbusy: J2 "nodes": ["node0"]\nup'
    (problem,) = node.problems("node0", "node0", output, 29501, [], own="J2")  # its own job is no other job
    assert problem.startswith("node0: the master port 29501 is taken (LISTEN 0 128 *:29501 *:*)")
    assert node.problems("node0", "node0", "up", 29501, [], own="J2") == []


def test_a_node_container_that_does_not_answer_is_down_not_busy() -> None:
    (problem,) = node.problems("node1", "node1", 'busy: J1 "nodes": ["node1"]\ndown: 1', None, [], own="J2")
    assert "the node container node1 does not run" in problem and "runs another job" not in problem


# --- the in-node script, run here ---


def run_script(script: str) -> str:
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


needs_pgrep = pytest.mark.skipif(shutil.which("pgrep") is None, reason="pgrep is not installed here")


@needs_pgrep
def test_the_script_on_an_idle_node_prints_up_and_no_busy_line() -> None:
    script = node._in_node(29501, FAKE_JOBS)
    assert f"{FAKE_JOBS}/" not in script  # split, so that its own command line does not match
    lines = run_script(script).splitlines()
    assert lines[-1] == "up"
    assert [line for line in lines if line.startswith("busy:")] == []


def start_rank(argv_path: str) -> subprocess.Popen[bytes]:
    """A stand-in rank: a sleeping process whose command line names a job's directory."""
    rank = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(5)", "--output-dir", argv_path],
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


@needs_pgrep
def test_a_rank_of_another_job_makes_exactly_one_busy_line() -> None:
    ranks = [start_rank(f"{FAKE_JOBS}/J9/output"), start_rank(f"{FAKE_JOBS}/J9/logs")]  # two, one job
    try:
        output = run_script(node._in_node(29501, FAKE_JOBS))
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    assert [line.rstrip() for line in output.splitlines() if line.startswith("busy:")] == ["busy: J9"]
    assert output.splitlines()[-1] == "up"
    assert node.busy_jobs(output, "J1") == {"J9": []}
    assert node.busy_jobs(output, "J9") == {}


@needs_pgrep
def test_the_busy_line_carries_the_nodes_from_the_jobs_job_json(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    (jobs / "J9").mkdir(parents=True)
    (jobs / "J9" / "job.json").write_text(json.dumps({"id": "J9", "nodes": ["node0", "node1"]}, indent=2))
    rank = start_rank(f"{jobs}/J9/output")
    try:
        output = run_script(node._in_node(None, str(jobs)))
    finally:
        rank.kill()
        rank.wait()
    busy = [line for line in output.splitlines() if line.startswith("busy:")]
    assert len(busy) == 1 and busy[0].startswith("busy: J9 ")
    assert node.busy_jobs(output, "J1") == {"J9": ["node0", "node1"]}
    (problem,) = node.problems("node1", "node1", output, None, [], own="J1")
    assert problem.startswith("node1 runs another job: job J9 (nodes node0, node1).")


def test_the_check_script_runs_the_in_node_script_in_the_container() -> None:
    script = node.check_script("node0", 29501, node.HCCN_TOOL, [], FAKE_JOBS)
    assert script.startswith("docker exec node0 /bin/sh -c ")
    assert "[/]${d#/}/$j/" in script and f"{FAKE_JOBS}/" not in script
