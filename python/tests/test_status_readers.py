"""A status.json that is JSON but no status (a record of the wrong type, written by something other than the
supervisor) is named by each reader, the wait, the report and jobs.yml's table, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

from test_control import FakeNode, follow
from test_jobreport import archive, planned

from ddp_cluster.job import node_jobs
from ddp_cluster.job import report as jobreport
from ddp_cluster.job.status import Status

BAD = json.dumps({"state": "running", "restarts": [{"restart": 1, "training_again_s": "5"}]})
NAMED = "restarts[0].training_again_s='5' must be int or float"


class Raw:
    """What a status.json holds, as text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def dumps(self) -> str:
        return self.text


def test_the_wait_names_it_once_and_goes_on(tmp_path: Path) -> None:
    done = Status(state="succeeded", rc=0, elapsed=3.0)
    node = FakeNode([Raw(BAD), Raw(BAD), Raw(BAD), done])  # type: ignore[list-item]
    _, said = follow(tmp_path, node, tmp_path / "interrupt")
    named = [line for line in said if NAMED in line]
    assert len(named) == 1, said
    assert "node0:/srv/ddp/node0/jobs/J1/status.json is not a status the job's supervisor wrote" in named[0]
    assert any("succeeded" in line for line in said), said


def test_the_report_warns_naming_it(tmp_path: Path) -> None:
    run_dir = planned(tmp_path)
    archive(run_dir, "s0", {"status.json": BAD})
    done = jobreport.report(run_dir)
    assert done.exit_status == 1
    assert any(NAMED in warning and "is not a status" in warning for warning in done.warnings), done.warnings


def test_jobs_tables_names_it_under_the_job() -> None:
    reports = {"n0": {"jobs": {"J1": {"nodes": ["n0"], "status": None, "status_problem": f"x: {NAMED}"}}}}
    lines = node_jobs.table(reports)
    assert any(line.startswith("J1") and "its status.json is no status" in line for line in lines), lines
    assert f"J1: n0: x: {NAMED}" in lines
