"""Action ``ddp_jobs_logs``: a running job's logs (jobs.yml -e logs=ID), read through one node.

Runs on the entry node (the play's host: ``-e via=NODE``, else the inventory's first) and speaks only to it,
on the task's own connection, in its container: :func:`ddp_cluster.job.logs.show` asks its
``python -m ddp_cluster.supervisor.logs``, which finds the job's supervisor through the mesh and reads every
node's logs from there. The lines go to the display as they come; with ``follow`` it asks again with the
offsets reached until the job ends, or until Ctrl-C (the ``ddp_job_interrupt`` callback's file), which stops
the following, never the job.

    - ddp_jobs_logs:
        job: "{{ logs }}"
        tail: "{{ tail | default('') }}"
        rank: "{{ rank | default('') }}"
        node: "{{ node | default('') }}"
        follow: "{{ follow | default('') }}"
        via: "{{ via | default('') }}"
        nodes: "{{ groups['nodes'] }}"
"""

from __future__ import annotations

import json
import os
import site
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job import logs as job_logs
from ddp_cluster.job.control import interrupt_file
from ddp_cluster.job.transport import ActionTransport

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("job", "tail", "rank", "node", "follow", "via", "nodes"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        variables = task_vars or {}
        entry = str(variables["inventory_hostname"])
        args = self._task.args
        nodes = [str(node) for node in args.get("nodes") or []]
        try:
            request = job_logs.LogsRequest.from_vars(
                args.get("job"),
                args.get("tail"),
                args.get("rank"),
                args.get("node"),
                args.get("follow"),
                args.get("via"),
                nodes,
            )
        except job_logs.LogsError as error:
            return {**result, "failed": True, "msg": str(error)}
        records = Path(str(self._templar.template(variables.get("cluster_controller_dir"))), "nodes")
        workspace = "/workspace"
        try:
            record = json.loads((records / f"{entry}.json").read_text(encoding="utf-8"))
            workspace = str(record.get("container_workspace") or workspace)
        except (OSError, ValueError):
            pass
        # The callback runs in the playbook's own process, this action's parent; a file left by an earlier
        # Ctrl-C of that process is not this one's.
        interrupt = interrupt_file(os.getppid())
        interrupt.unlink(missing_ok=True)
        try:
            shown = job_logs.show(
                ActionTransport(self, (AnsibleError,)),
                entry,
                request,
                f"{workspace}/jobs",
                display.display,
                interrupt.exists,
                nodes,
            )
        except job_logs.LogsError as error:
            return {**result, "failed": True, "msg": str(error)}
        return {**result, **shown}
