"""Action ``ddp_job_plan``: plan a job on the controller with :func:`ddp_cluster.job.plan.make_plan`
(one call).

Takes the ``ddp_job`` role's variables as Ansible resolved them (train.yml's extra vars through the role's
defaults), the role's argument_specs (their types and choices), the inventory's nodes and what site.yml
recorded of them; writes the job's files (runs/<id>/plan.json, job.tar.gz) and returns the plan as the fact
``_ddp_job_plan``, or fails naming every variable that is wrong. Nothing is written when the plan fails.

    - ddp_job_plan:
        npu_plan: "{{ device-IP plan of the nodes, npu only }}"
"""

from __future__ import annotations

import os
import site
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job import plan as planning

display = Display()
PREFIX = planning.PREFIX


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("npu_plan",))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        variables = task_vars or {}
        role = self._task._role
        if role is None:
            return {
                **result,
                "failed": True,
                "msg": "ddp_job_plan runs in the ddp_job role (tasks_from: plan.yml)",
            }
        specs = yaml.safe_load(Path(role._role_path, "meta", "argument_specs.yml").read_text())
        options: Mapping[str, Mapping[str, Any]] = specs["argument_specs"]["main"]["options"]
        request = {
            name.removeprefix(PREFIX): self._value(variables, name) for name in options if name in variables
        }
        if str(request.get("attach") or "").strip():
            return self._attach(result, str(request["attach"]).strip(), request)
        hostvars = variables.get("hostvars", {})
        nodes = [str(node) for node in variables.get("groups", {}).get("nodes", [])]
        records = Path(str(self._value(variables, "cluster_controller_dir")), planning.RECORDS_DIR)
        try:
            inventory = planning.Inventory(
                nodes=nodes,
                accelerator=str(self._value(variables, "cluster_accelerator")),
                records=planning.read_records(records),
                records_dir=str(records),
                visible={node: _visible(hostvars, node) for node in nodes},
                npu_plan=self._task.args.get("npu_plan") or {},
                cwd=os.getcwd(),
                previous=variables.get("_ddp_job_plan") or {},
                gate_passed=str(variables.get("_ddp_job_gate_passed") or ""),
            )
            plan = planning.make_plan(request, options, inventory, pack=not self._task.check_mode)
            if not self._task.check_mode:
                planning.write_files(plan)
        except planning.PlanError as error:
            return {**result, "failed": True, "msg": str(error)}
        facts = plan.to_dict()
        for line in facts["lines"]:
            display.display(line)
        return {
            **result,
            "changed": not facts["packed"].get("reused", True),
            "ansible_facts": {"_ddp_job_plan": facts},
        }

    def _attach(self, result: dict[str, Any], job_id: str, request: Mapping[str, Any]) -> dict[str, Any]:
        """The plan of an earlier run (runs/<id>/plan.json), to follow the job without starting it."""
        runs = Path(os.getcwd(), str(request.get("runs_dir") or "runs")).resolve()
        try:
            facts = planning.load(runs / job_id)
        except (OSError, ValueError) as error:
            return {
                **result,
                "failed": True,
                "msg": f"attach={job_id}: this controller has no plan of that job ({runs / job_id}/"
                f"{planning.PLAN_FILE}: {error}); `ansible-playbook jobs.yml` lists the cluster's jobs",
            }
        if facts.get("kind") != "train":
            return {**result, "failed": True, "msg": f"attach={job_id} is a {facts.get('label')}, not a job"}
        facts.update(attach=True, detach=False)
        display.display(f"job {job_id}: following it on {', '.join(facts.get('nodes', []))} (attach)")
        return {**result, "changed": False, "ansible_facts": {"_ddp_job_plan": facts}}

    def _value(self, variables: Mapping[str, Any], name: str) -> Any:
        return self._templar.template(variables.get(name))


def _visible(hostvars: Any, node: str) -> str:
    """A node's ASCEND_RT_VISIBLE_DEVICES from its node_container_env (empty: every device)."""
    try:
        env = hostvars[node].get("node_container_env") or {}
    except (KeyError, AttributeError):
        return ""
    return str(env.get("ASCEND_RT_VISIBLE_DEVICES", "") or "") if isinstance(env, Mapping) else ""
