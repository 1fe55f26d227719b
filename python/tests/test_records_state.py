"""The nodes site.yml's last run did not converge (ddp_cluster.job.records.unconverged): read from each node's
NODE.state.json beside its record, so that a job passes over them; the records themselves read as before."""

from __future__ import annotations

import json
from pathlib import Path

from ddp_cluster.job import records

RECORD = {"interface": "eth0", "address": "172.30.99.10/24", "workspace": "/w"}


def state(converged: bool, reason: str = "", at: str = "2026-11-26T13:00:00Z") -> dict[str, object]:
    return {"wanted": {}, "actual": {}, "converged": converged, "reason": reason, "at": at}


def write(directory: Path, name: str, data: object) -> None:
    (directory / name).write_text(data if isinstance(data, str) else json.dumps(data))


def test_state_files_are_not_records(tmp_path: Path) -> None:
    write(tmp_path, "s0.json", RECORD)
    write(tmp_path, "s0.state.json", state(True))
    write(tmp_path, "s1.state.json", "{")  # a state file that cannot be read is no record's business
    assert records.read_records(tmp_path) == {"s0": RECORD}


def test_nodes_whose_state_says_not_converged_are_named_with_why_and_when(tmp_path: Path) -> None:
    write(tmp_path, "s0.state.json", state(True))
    write(tmp_path, "s1.state.json", state(False, "unreachable in containers: Connection refused"))
    write(tmp_path, "s2.state.json", state(False, "", at=""))
    write(tmp_path, "s3.json", RECORD)  # no state file: recorded before site.yml wrote them
    write(tmp_path, "s4.state.json", "not json")
    write(tmp_path, "s5.state.json", {"converged": "false"})  # only a JSON false says it
    assert records.unconverged(tmp_path) == {
        "s1": "unreachable in containers: Connection refused (site.yml, 2026-11-26T13:00:00Z)",
        "s2": "no reason recorded",
    }
    assert records.unconverged(tmp_path / "none") == {}


def test_a_passed_over_node_says_why_and_what_to_run() -> None:
    said = records.unconverged_reason("hosts: Install the engine: no docker-ce")
    assert said == (
        "not converged by the last site.yml: hosts: Install the engine: no docker-ce; run site.yml again"
        " for it"
    )
    assert said.startswith(records.NOT_CONVERGED)
