"""What the ddp_job_plan action hands the planner (ddp_cluster.job.plan_inputs): the request from the role's
options as Ansible resolved them, each node's visible devices, and attach's plan of an earlier run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.job import plan_inputs


def test_the_request_holds_the_options_that_are_set_without_the_roles_prefix() -> None:
    options = {"ddp_job_nodes": {}, "ddp_job_epochs": {}, "ddp_job_detach": {}}
    variables = {"ddp_job_nodes": "{{ nodes }}", "ddp_job_epochs": 3, "other": 1}
    resolved = {"ddp_job_nodes": 2, "ddp_job_epochs": 3}
    assert plan_inputs.request(options, variables, resolved.__getitem__) == {"nodes": 2, "epochs": 3}


def test_a_nodes_visible_devices_come_from_its_container_env() -> None:
    hostvars: dict[str, Any] = {
        "n0": {"node_container_env": {"ASCEND_RT_VISIBLE_DEVICES": "0,1"}},
        "n1": {"node_container_env": None},
        "n2": {"node_container_env": "not a mapping"},
    }
    assert [plan_inputs.visible(hostvars, node) for node in ("n0", "n1", "n2", "n9")] == ["0,1", "", "", ""]


def test_attach_gives_the_earlier_runs_plan_or_says_there_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "J1").mkdir(parents=True)
    plan = {"kind": "train", "id": "J1", "nodes": ["n0", "n1"], "detach": True, "run_dir": "runs/J1"}
    (tmp_path / "runs" / "J1" / "plan.json").write_text(json.dumps(plan))
    said: list[str] = []
    result = plan_inputs.attach({"attach": " J1 "}, said.append)
    assert result["changed"] is False
    assert result["ansible_facts"]["_ddp_job_plan"] == {**plan, "attach": True, "detach": False}
    assert said == ["job J1: following it on n0, n1 (attach)"]
    missing = plan_inputs.attach({"attach": "J2", "runs_dir": "elsewhere"}, said.append)
    assert missing["failed"] is True
    assert missing["msg"].startswith(
        f"attach=J2: this controller has no plan of that job ({tmp_path}/elsewhere/J2"
    )


def test_the_drained_nodes_come_from_plan_ymls_read_of_the_nodes() -> None:
    record = {"node": "n1", "reason": "bad", "since": "T", "by": "ops"}
    read = {"changed": False, "nodes": ["n0", "n1"], "drained": {"n1": record}, "unknown": ["n2"]}
    nodes = ["n0", "n1", "n2"]
    assert plan_inputs.drained(read, nodes) == {"drained": {"n1": record}, "drain_unknown": ["n2"]}
    # the read failed (the entry node did not answer): nothing is known to be drained, every node unknown
    assert plan_inputs.drained({"unreachable": True, "msg": "x"}, nodes) == {"drain_unknown": nodes}
    assert plan_inputs.drained({"skipped": True}, nodes) == {}  # attach: no plan made
    assert plan_inputs.drained(None, nodes) == {}


def test_the_plan_made_before_is_read_whole_from_its_file(tmp_path: Path) -> None:
    # The health gate's fact is small; the job's plan reuses the gate's packing, which only its file holds.
    packed = {"workdir": "/p", "files": 3}
    whole = {"id": "j-preflight", "base_id": "j", "kind": "preflight", "packed": packed}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(whole))
    fact = {"id": "j-preflight", "base_id": "j", "kind": "preflight", "plan_path": str(path)}
    assert plan_inputs.previous(fact)["packed"] == packed
    assert plan_inputs.previous({}) == {}
    gone = {**fact, "plan_path": str(tmp_path / "gone.json")}
    assert plan_inputs.previous(gone) == gone  # no file: the project is packed again


def test_the_inventory_names_its_cluster_so_that_resume_looks_at_its_own_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    values = {"cluster_controller_dir": str(tmp_path), "cluster_accelerator": "cpu", "cluster_name": "sim"}
    variables: dict[str, Any] = {"groups": {"nodes": ["n0"]}, "hostvars": {"n0": {}}}
    assert plan_inputs.inventory(variables, values.get, {}).cluster == "sim"
    del values["cluster_name"]
    assert plan_inputs.inventory(variables, values.get, {}).cluster == ""
