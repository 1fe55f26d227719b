"""Action ``ddp_jobs_node``: what one node knows of the cluster's jobs (jobs.yml), and with ``stop`` a job
stopped there first.

One command on the node's server: ``docker exec NODE python -m ddp_cluster.supervisor.jobs`` (see
:mod:`ddp_cluster.supervisor.jobs`), whose JSON comes back as ``report``. A node whose container does not
answer is not
a failure: its ``down`` says why, and the list shows it.

    - ddp_jobs_node:
        stop: "{{ stop | default('') }}"
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase

JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("stop", "reason"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        variables = task_vars or {}
        node = str(variables["inventory_hostname"])
        stop = str(self._task.args.get("stop") or "")
        if stop and not JOB_ID.match(stop):
            return {**result, "failed": True, "msg": f"stop={stop} is not a job id: jobs.yml lists them"}
        if self._task.check_mode and stop:
            return {**result, "skipped": True, "msg": f"check mode: job {stop} would be stopped here"}
        records = Path(str(self._templar.template(variables.get("cluster_controller_dir"))), "nodes")
        workspace = "/workspace"
        try:
            record = json.loads((records / f"{node}.json").read_text(encoding="utf-8"))
            workspace = str(record.get("container_workspace") or workspace)
        except (OSError, ValueError):
            pass
        module = "ddp_cluster.supervisor.jobs"
        command = f". /etc/ddp-cluster/env.sh && exec python -m {module} --jobs-dir {workspace}/jobs"
        if stop:
            reason = str(self._task.args.get("reason") or f"stopped with jobs.yml -e stop={stop}")
            command += f" --stop {shlex.quote(stop)} --reason {shlex.quote(reason)}"
        done = self._low_level_execute_command(
            f"docker exec {shlex.quote(node)} /bin/bash -c {shlex.quote(command)}"
        )
        output = str(done.get("stdout", "")).strip()
        try:
            report = json.loads(output.splitlines()[-1]) if done["rc"] == 0 and output else None
        except ValueError:
            report = None
        if report is None:
            said = (str(done.get("stderr", "")).strip() or output or f"rc {done['rc']}").splitlines()
            return {**result, "changed": False, "down": f"its container does not answer: {said[-1][:200]}"}
        return {**result, "changed": bool(stop), "report": report}
