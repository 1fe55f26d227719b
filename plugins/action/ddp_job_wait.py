"""Action ``ddp_job_wait``: start a planned job on its first node and wait for it, printing its progress,
within a bound; with ``detach`` return once every rank runs; with ``attach`` start nothing and follow it.

The lifecycle is :class:`ddp_cluster.job.control.JobControl` (start, wait, detach, attach, stop, the first
node gone, the bound, Ctrl-C), unit-tested with a fake transport; this action hands it a transport on the
task's own connection to the first node's server (no module) and the file the ``ddp_job_interrupt`` callback
leaves on Ctrl-C, and the values of the job's secret_env from the controller's environment (a start only).
The last status read is returned and written to runs/<id>/status.json on the controller.

    - ddp_job_wait:
        plan: "{{ _ddp_job_plan }}"
        stopped: false     # true: jobs.yml -e stop=ID follows the job it stopped

``plan`` is the fact ``_ddp_job_plan`` (small); the whole plan is read from its ``plan_path``, once.
"""

from __future__ import annotations

import os
import site
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job import secrets
from ddp_cluster.job.control import JobControl, interrupt_file
from ddp_cluster.job.plan import whole
from ddp_cluster.job.transport import LOCAL_TIMEOUT, ActionTransport

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = True
    _VALID_ARGS = frozenset(("plan", "stopped"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        if self._task.check_mode:  # the plan was checked; nothing starts
            return {**result, "skipped": True, "msg": "check mode: the job would start here"}
        node = str((task_vars or {})["inventory_hostname"])
        # the wait's commands return at once, a stop within a minute: none hangs the wait past its bound
        transport = ActionTransport(self, (AnsibleError,), bound=LOCAL_TIMEOUT)
        # The callback runs in the playbook's own process, this action's parent.
        interrupt = interrupt_file(os.getppid())
        try:
            plan = whole(self._task.args["plan"])
        except (OSError, ValueError) as error:
            return {**result, "failed": True, "msg": f"the job's plan could not be read ({error})"}
        # jobs.yml -e stop=ID follows the job it stopped: one cancelled in Slurm's queue was stopped as asked
        plan["stopped"] = bool(self._task.args.get("stopped"))
        try:  # the job's secret_env, from this controller's environment now (the plan kept the names only)
            values = secrets.for_start(plan, os.environ)
        except secrets.SecretError as error:
            return {**result, "failed": True, "msg": f"{error}; nothing was started"}
        control = JobControl(plan, node, transport, display.display, interrupt, secrets=values)
        return {**result, **control.run()}
