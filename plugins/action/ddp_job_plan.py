"""Action ``ddp_job_plan``: plan a job on the controller with :func:`ddp_cluster.job.plan.make_plan`
(one call).

Takes the ``ddp_job`` role's variables as Ansible resolved them (train.yml's extra vars through the role's
defaults), the role's argument_specs (their types and choices), the inventory's nodes and what site.yml
recorded of them; writes the job's files (runs/<id>/plan.json, job.tar.gz) and returns the fact
``_ddp_job_plan``, or fails naming every variable that is wrong. Nothing is written when the plan fails.
The fact is small (:func:`ddp_cluster.job.plan.fact`: the job's id, nodes, directories and ``plan_path``),
as every task of the job templates it on every node; the actions read the whole plan from ``plan_path``. In
check mode the plan goes to a file of the controller's temporary directory (runs/ stays as it was).

    - ddp_job_plan:
        npu_plan: "{{ device-IP plan of the nodes, npu only }}"
"""

from __future__ import annotations

import site
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from ansible import context
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible.utils.vars import load_extra_vars

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job import plan as planning
from ddp_cluster.job import plan_inputs
from ddp_cluster.job.request import USER_NAMES, misspelled, role_settings

display = Display()


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
        value = self._value(variables)
        request = plan_inputs.request(options, variables, value)
        if not str(request.get("attach") or "").strip() and (typos := self._typos(options)):
            return {**result, "failed": True, "msg": "; ".join(typos) + "; nothing was started"}
        if str(request.get("attach") or "").strip():
            return {**result, **planning.attached_fact(plan_inputs.attach(request, display.display))}
        try:
            inventory = plan_inputs.inventory(variables, value, self._task.args.get("npu_plan") or {})
            plan = planning.make_plan(request, options, inventory, pack=not self._task.check_mode)
            if not self._task.check_mode:
                planning.write_files(plan)
        except planning.PlanError as error:
            return {**result, "failed": True, "msg": str(error)}
        whole = plan.to_dict()
        for line in [*whole["lines"], *([planning.dry_run_line(whole)] if self._task.check_mode else [])]:
            display.display(line)
        return {
            **result,
            "changed": not whole["packed"].get("reused", True),
            "ansible_facts": {"_ddp_job_plan": planning.made_fact(plan, whole, self._task.check_mode)},
        }

    def _typos(self, options: Mapping[str, Any]) -> list[str]:
        """The command line's extra vars that are typos of a setting (request.misspelled)."""
        roles = Path(self._task._role._role_path).parent
        known = {*USER_NAMES.values(), *options, "preflight", *role_settings(roles)}
        playbook = Path(str((context.CLIARGS.get("args") or ["train.yml"])[0])).name
        return misspelled(load_extra_vars(self._loader), known, playbook)

    def _value(self, variables: Mapping[str, Any]) -> Callable[[str], Any]:
        return lambda name: self._templar.template(variables.get(name))
