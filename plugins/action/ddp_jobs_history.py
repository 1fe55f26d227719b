"""Action ``ddp_jobs_history``: the cluster's job history from Slurm's accounting (jobs.yml -e history=true
[-e since=...]), asked on the task's node (every node is a Slurm client) and printed, newest first
(:mod:`ddp_cluster.job.history`). Changes nothing.

    - ddp_jobs_history:
        since: "{{ since | default('') }}"
"""

from __future__ import annotations

import site
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job import history
from ddp_cluster.job.transport import ActionTransport, Unreachable, in_container

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("since",))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        node = str((task_vars or {})["inventory_hostname"])
        since = str(self._task.args.get("since") or "").strip() or history.DEFAULT_SINCE
        try:
            command = history.command(since)
        except history.HistoryError as error:
            return {**result, "failed": True, "msg": str(error)}
        try:
            done = ActionTransport(self, ()).run(in_container(node, command))
        except Unreachable as error:
            return {**result, "failed": True, "msg": f"{node} does not answer: {error}"[:400]}
        if done.rc != 0:
            return {
                **result,
                "failed": True,
                "msg": f"Slurm's accounting did not answer on {node} ({done.said(300)}): see slurmdbd.log on"
                " the accounting node, and that site.yml converged",
            }
        jobs = history.parse(done.stdout)
        for line in history.lines(jobs, since):
            display.display(line)
        return {**result, "changed": False, "jobs": len(jobs)}
