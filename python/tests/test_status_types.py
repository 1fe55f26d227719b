"""status.json's records checked by type when read: a bad one is a StatusError naming the field, its value
and the type it must have, never a crash further on (the wait's, the report's, jobs.yml's lines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.job import status
from ddp_cluster.job.status import Status, StatusError, TornStatus
from ddp_cluster.supervisor import jobs

RESTART: dict[str, Any] = {
    "restart": 1,
    "cause": "lost",
    "lost": ["n1"],
    "nodes_before": ["n0", "n1"],
    "nodes_after": ["n0", "n2"],
    "spares_taken": ["n2"],
    "lost_at": 100.5,
    "restarted_at": 104,
    "training_again_s": 12.3,
    "checkpoint": "epoch-00003.ckpt",
    "resume_step": 150,
    "last_step": 170,
    "steps_redone": 20,
    "checkpoints_skipped": [],
    "supervisor_moved": "n0 -> n1",
}
REPLICA: dict[str, Any] = {
    "place": "n1",
    "kind": "node",
    "checkpoint": None,
    "bytes": 0,
    "seconds": 0.0,
    "at": None,
    "copying": None,
    "failures": 0,
    "error": "",
    "lost": False,
}


def test_the_supervisors_records_read_back_as_they_were() -> None:
    written = Status(state="running", restarts=(RESTART,), replicas=(REPLICA,), checkpoint_steps={"a": 3})
    assert status.loads(written.dumps()) == written
    assert status.describe_restart(RESTART).endswith("training again 12.3 s after the loss")


@pytest.mark.parametrize(
    ("name", "record", "field", "value", "expected"),
    [
        ("restarts", RESTART, "training_again_s", "5", "int or float"),
        ("restarts", RESTART, "training_again_s", True, "int or float"),
        ("restarts", RESTART, "restart", 1.5, "int"),
        ("restarts", RESTART, "lost", "n1", "list of strings"),
        ("restarts", RESTART, "nodes_after", ["n0", 2], "list of strings"),
        ("restarts", RESTART, "checkpoint", 3, "str"),
        ("replicas", REPLICA, "bytes", "10", "int"),
        ("replicas", REPLICA, "lost", 0, "bool"),
    ],
)
def test_a_records_field_of_the_wrong_type_is_named(
    name: str, record: dict[str, Any], field: str, value: Any, expected: str
) -> None:
    text = json.dumps({"state": "running", name: [record, record | {field: value}]})
    with pytest.raises(StatusError) as error:
        status.loads(text)
    assert not isinstance(error.value, TornStatus)
    assert str(error.value) == f"{name}[1].{field}={value!r} must be {expected}"


def test_a_record_that_is_no_mapping_and_a_step_that_is_no_int_are_named() -> None:
    with pytest.raises(StatusError, match=r"^restarts\[0\]='lost' must be a record"):
        Status.from_dict({"restarts": ["lost"]})
    with pytest.raises(StatusError, match=r"^checkpoint_steps\['a.ckpt'\]='3' must be int$"):
        Status.from_dict({"checkpoint_steps": {"a.ckpt": "3"}})
    with pytest.raises(StatusError, match=r"^elapsed=True must be int or float$"):
        Status.from_dict({"elapsed": True})


def test_unknown_and_unset_record_fields_pass() -> None:
    found = Status.from_dict({"restarts": [{"restart": 1, "training_again_s": None, "new_field": {"x": 1}}]})
    assert found.restarts[0]["new_field"] == {"x": 1}
    assert "training again" not in status.describe_restart(found.restarts[0])


def test_the_supervisor_cannot_write_a_bad_record() -> None:
    # update() checks as a read does: the supervisor's own write of a bad record fails, never the readers.
    with pytest.raises(StatusError, match="training_again_s='5'"):
        Status().update(restarts=[RESTART | {"training_again_s": "5"}])


def test_read_checked_tells_a_torn_file_from_one_that_is_no_status(tmp_path: Path) -> None:
    path = tmp_path / status.FILE
    assert status.read_checked(path) == (None, "")
    path.write_text('{"state": "runn')
    assert status.read_checked(path) == (None, "")
    with pytest.raises(TornStatus):
        status.loads(path.read_text())
    path.write_text(json.dumps({"state": "running", "restarts": [RESTART | {"training_again_s": "5"}]}))
    found, problem = status.read_checked(path)
    assert found is None and status.read(path) is None
    assert problem.startswith(
        f"{path} is not a status the job's supervisor wrote (restarts[0].training_again_s"
    )
    assert "must be int or float" in problem
    path.write_text(Status(state="succeeded").dumps())
    assert status.read_checked(path) == (Status(state="succeeded"), "")


def test_a_nodes_job_list_names_a_status_that_is_no_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs, "processes", lambda jobs_dir: {})
    for job, written in {
        "good": Status(state="succeeded").dumps(),
        "bad": json.dumps({"state": "running", "restarts": [RESTART | {"training_again_s": "5"}]}),
    }.items():
        (tmp_path / job).mkdir()
        (tmp_path / job / status.FILE).write_text(written)
    listed = jobs.node_report(str(tmp_path))["jobs"]
    assert listed["good"]["status"]["state"] == "succeeded" and listed["good"]["status_problem"] == ""
    assert listed["bad"]["status"] is None
    assert "restarts[0].training_again_s='5' must be int or float" in listed["bad"]["status_problem"]


def test_a_restart_that_drained_a_node_says_so() -> None:
    record = {**RESTART, "cause": "device-fault: node n1 device 1: health alarm (npu-smi)", "drained": ["n1"]}
    assert status.loads(Status(state="running", restarts=(record,)).dumps()).restarts[0]["drained"] == ["n1"]
    assert "(drained n1)" in status.describe_restart(record)
    assert "drained" not in status.describe_restart(RESTART)
    with pytest.raises(status.StatusError, match="drained"):
        status.loads(Status(state="running", restarts=({**RESTART, "drained": "n1"},)).dumps())


# --- whatever wrote the file: a named problem, never an exception -------------------------------------------
def test_a_status_that_is_no_utf8_is_named_with_its_byte(tmp_path: Path) -> None:
    path = tmp_path / status.FILE
    path.write_bytes(b'{"state": "running", "reason": "caf\xe9"}')
    found, problem = status.read_checked(path)
    assert found is None and status.read(path) is None
    assert problem.startswith(f"{path} is not a status the job's supervisor wrote (it is not UTF-8:")
    assert "byte 0xe9 at offset 35" in problem


def test_a_status_larger_than_any_is_named_and_not_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(status, "MAX_BYTES", 1024)
    path = tmp_path / status.FILE
    path.write_text(json.dumps({"state": "running", "reason": "x" * 4096}))
    found, problem = status.read_checked(path)
    assert found is None and "larger than 0 MiB, which no status is" in problem


def test_a_status_nested_past_the_parser_s_depth_is_named() -> None:
    with pytest.raises(StatusError, match="nests deeper than any status"):
        status.loads('{"state": "running", "progress": ' + "[" * 200_000 + "]" * 200_000 + "}")


def test_a_settled_file_that_is_no_json_is_named_a_live_one_is_a_torn_copy(tmp_path: Path) -> None:
    path = tmp_path / status.FILE
    path.write_bytes(b"\x00\x01 garbage")
    assert status.read_checked(path) == (None, "")
    found, problem = status.read_checked(path, settled=True)
    assert found is None and "(not JSON: " in problem


def test_a_huge_wrong_value_is_quoted_short() -> None:
    with pytest.raises(StatusError) as error:
        Status.from_dict({"state": "running", "reason": ["x" * 100_000]})
    assert len(str(error.value)) < 300 and "... (100004 characters) must be str" in str(error.value)


def test_progress_and_restarts_are_shown_never_obeyed() -> None:
    assert status.describe_progress("step 3\r\x1b]0;t\x07\nnext") == "step 3\\r\\x1b]0;t\\x07\\nnext"
    assert status.describe_progress({"step": 3, "loss": "\x1b[2J"}) == "step 3, loss \\x1b[2J"
    line = status.describe_restart(RESTART | {"cause": "lost\x1b]52;c;eA==\x07", "lost": ["n1\u202e"]})
    assert "lost\\x1b]52;c;eA==\\x07; lost n1\\u202e;" in line
