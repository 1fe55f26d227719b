"""ddp_cluster.job.status: the supervisor's status.json as one typed object, for every reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_cluster.job import status
from ddp_cluster.job.status import Status, StatusError


def test_a_status_round_trips_and_names_a_lost_node_as_a_field(tmp_path: Path) -> None:
    failed = Status().update(
        state="failed", reason="node b stopped answering ssh", lost_nodes=["b"], failed_node="b"
    )
    path = tmp_path / status.FILE
    path.write_text(failed.dumps())
    read = status.read(path)
    assert (
        read == failed and read is not None and read.lost_nodes == ("b",) and read.done and not read.succeeded
    )


def test_fields_of_a_newer_supervisor_are_ignored_and_a_wrong_type_is_named() -> None:
    assert Status.from_dict({"state": "running", "attempts_made": 2}).state == "running"
    with pytest.raises(StatusError, match="failed_rank='1' must be int"):
        Status.from_dict({"state": "failed", "failed_rank": "1"})
    with pytest.raises(StatusError, match="state='done' is unknown"):
        Status.from_dict({"state": "done"})
    with pytest.raises(StatusError, match="lost_nodes='b' must be a list"):
        Status.from_dict({"lost_nodes": "b"})


def test_a_torn_or_missing_file_reads_as_none(tmp_path: Path) -> None:
    assert status.read(tmp_path / "none.json") is None
    (tmp_path / "torn.json").write_text('{"state": "runn')
    assert status.read(tmp_path / "torn.json") is None
    (tmp_path / "old.json").write_text(json.dumps({"state": "succeeded", "elapsed": 3.2, "rc": 0}))
    assert status.read(tmp_path / "old.json") == Status(state="succeeded", elapsed=3.2, rc=0)


def test_progress_is_one_line() -> None:
    line = status.describe_progress({"epoch": 2, "step": 46, "loss": 0.40941, "test_accuracy": 0.95})
    assert line == "epoch 2, step 46, loss 0.4094, test_accuracy 0.95"
    assert status.describe_progress(None) == "starting"
    assert status.describe_progress("x" * 300) == "x" * 200
