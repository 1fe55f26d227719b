"""Action ``ddp_job_report``: ``ddp-cluster report RUN_DIR`` on the controller
(:func:`ddp_cluster.job.report.report`) for a job whose nodes' archives were fetched, printed as its lines;
fails with the report's one-line failure.

Run once, on the controller (``delegate_to: localhost``, ``delegate_facts: true``): a preflight gate that
passed sets ``_ddp_job_gate_passed`` there, which the job's plan reads.

    - ddp_job_report:
        plan: "{{ _ddp_job_plan }}"
"""

from __future__ import annotations

import site
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job import report as jobreport

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("plan",))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        if self._task.check_mode:  # the plan was checked; nothing starts
            return {**result, "skipped": True, "msg": "check mode: no job ran, nothing to report"}
        plan = self._task.args["plan"]
        done = jobreport.report(Path(plan["run_dir"]))
        for warning in done.warnings:
            display.display(f"[WARNING] {plan['label']} {plan['id']}: {warning}")
        display.display("\n".join(done.lines))
        facts = (
            {"_ddp_job_gate_passed": plan["id"]} if done.gate_passed and plan["kind"] == "preflight" else {}
        )
        if done.failure:
            return {**result, "failed": True, "msg": done.failure, "ansible_facts": facts}
        return {**result, "changed": False, "ansible_facts": facts}
