"""Action ``ddp_jobs_node``: what one node knows of the cluster's jobs (jobs.yml), and with ``stop`` a job
stopped there first.

One command on the node's server, in its container (:func:`ddp_cluster.job.node_jobs.ask`: ``python -m
ddp_cluster.supervisor.jobs``), whose JSON comes back as ``report``. A node whose container does not answer
is not a failure: its ``down`` says why, and the list shows it.

    - ddp_jobs_node:
        stop: "{{ stop | default('') }}"
"""

from __future__ import annotations

import site
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job import node_jobs
from ddp_cluster.job.transport import ActionTransport


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("stop", "reason"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        variables = task_vars or {}
        node = str(variables["inventory_hostname"])
        stop = str(self._task.args.get("stop") or "")
        if stop and not node_jobs.JOB_ID.fullmatch(stop):
            return {**result, "failed": True, "msg": f"stop={stop} is not a job id: jobs.yml lists them"}
        if self._task.check_mode and stop:
            return {**result, "skipped": True, "msg": f"check mode: job {stop} would be stopped here"}
        records = Path(str(self._templar.template(variables.get("cluster_controller_dir"))), "nodes")
        jobs = node_jobs.workspace_jobs(str(records), node)
        reason = str(self._task.args.get("reason") or f"stopped with jobs.yml -e stop={stop}")
        transport = ActionTransport(self, ())
        return {
            **result,
            **node_jobs.ask(transport, node, jobs, stop, reason if stop else None),
        }
