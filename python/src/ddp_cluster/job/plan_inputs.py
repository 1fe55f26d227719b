"""What the ``ddp_job_plan`` action hands the planner (:func:`ddp_cluster.job.plan.make_plan`): the request
and the inventory, from the variables as Ansible resolved them, and the plan of an earlier run to attach to.

``value(name)`` is the action's: a variable, templated (train.yml's extra vars through the role's defaults).
No Ansible import: the action passes what it has.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ddp_cluster.job import control
from ddp_cluster.job import plan as planning

Value = Callable[[str], Any]


def request(options: Mapping[str, Any], variables: Mapping[str, Any], value: Value) -> dict[str, Any]:
    """The job's request: each of the role's options that is set, by its name without the role's prefix."""
    return {name.removeprefix(planning.PREFIX): value(name) for name in options if name in variables}


def visible(hostvars: Any, node: str) -> str:
    """A node's ASCEND_RT_VISIBLE_DEVICES from its node_container_env (empty: every device)."""
    try:
        env = hostvars[node].get("node_container_env") or {}
    except (KeyError, AttributeError):
        return ""
    return str(env.get("ASCEND_RT_VISIBLE_DEVICES", "") or "") if isinstance(env, Mapping) else ""


def inventory(variables: Mapping[str, Any], value: Value, npu_plan: Mapping[str, Any]) -> planning.Inventory:
    """The inventory's nodes and what site.yml recorded of them, and what this playbook run planned before."""
    hostvars = variables.get("hostvars", {})
    nodes = [str(node) for node in variables.get("groups", {}).get("nodes", [])]
    records = Path(str(value("cluster_controller_dir")), planning.RECORDS_DIR)
    return planning.Inventory(
        nodes=nodes,
        accelerator=str(value("cluster_accelerator")),
        cluster=str(value("cluster_name") or ""),
        records=planning.read_records(records),
        records_dir=str(records),
        unconverged=planning.unconverged(records),
        visible={node: visible(hostvars, node) for node in nodes},
        npu_plan=npu_plan,
        cwd=os.getcwd(),
        previous=previous(variables.get("_ddp_job_plan") or {}),
        gate_passed=str(variables.get("_ddp_job_gate_passed") or ""),
        env_names=frozenset(name for name, set_to in os.environ.items() if set_to),
        **drained(variables.get("__ddp_job_drained"), nodes),
    )


def previous(fact: Mapping[str, Any]) -> dict[str, Any]:
    """The plan made before in this run (a health gate's), whole: its fact is small (no packing, no spec),
    the rest is in its plan file; the fact alone when that cannot be read (the project is packed again)."""
    try:
        return planning.whole(fact)
    except (OSError, ValueError):
        return dict(fact)


def drained(read: Any, nodes: list[str]) -> dict[str, Any]:
    """The Inventory's ``drained`` and ``drain_unknown``, from what plan.yml's read of the nodes' drain
    records returned (the ``ddp_jobs_drain`` action with ``show``: ``drained``, node -> record; ``unknown``,
    the nodes that did not answer). A read that failed: every node unknown, none drained (each node's own
    check before the start refuses a drained one); one that did not run (attach): nothing."""
    if not isinstance(read, Mapping) or read.get("skipped"):
        return {}
    records = read.get("drained")
    if not isinstance(records, Mapping):
        return {"drain_unknown": list(nodes)}
    return {
        "drained": {str(node): dict(item) for node, item in records.items() if isinstance(item, Mapping)},
        "drain_unknown": [str(node) for node in read.get("unknown") or []],
    }


def attach(request: Mapping[str, Any], say: Callable[[str], None]) -> dict[str, Any]:
    """The action's result for ``attach=ID``: the plan of that earlier run as the fact ``_ddp_job_plan``, or
    a failure saying there is none."""
    job_id = str(request["attach"]).strip()
    runs = Path(os.getcwd(), str(request.get("runs_dir") or "runs")).resolve()
    try:
        facts = control.attach_plan(runs, job_id)
    except control.AttachError as error:
        return {"failed": True, "msg": str(error)}
    say(f"job {job_id}: following it on {', '.join(facts.get('nodes', []))} (attach)")
    return {"changed": False, "ansible_facts": {"_ddp_job_plan": facts}}
