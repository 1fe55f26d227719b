"""Action ``ddp_jobs_sync``: bring a running job's results so far into runs/<id>/ (jobs.yml -e sync=ID).

Runs on the entry node (``-e via=NODE``, else the inventory's first): one command in its container
(:func:`ddp_cluster.job.sync.sync`, ``python -m ddp_cluster.supervisor.sync``), which finds the job's first
node and gathers every node's changed files over the mesh; the answer is laid out on the controller and the
action prints what it brought, its bytes and where. In check mode the nodes only say what would move.

    - ddp_jobs_sync:
        job: "{{ sync }}"
        runs_dir: "{{ ddp_job_runs_dir | default(playbook_dir ~ '/../../runs') }}"
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

from ddp_cluster.job import sync
from ddp_cluster.job.transport import ActionTransport, Unreachable

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("job", "runs_dir", "nodes"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        variables = task_vars or {}
        node = str(variables["inventory_hostname"])
        job = str(self._task.args.get("job") or "")
        # runs/<id> where train.yml's plan writes it (a relative runs_dir: from the working directory)
        runs = Path(os.getcwd(), str(self._task.args.get("runs_dir") or "runs")).resolve()
        records = Path(str(self._templar.template(variables.get("cluster_controller_dir"))), "nodes")
        workspace = "/workspace"
        try:
            record = json.loads((records / f"{node}.json").read_text(encoding="utf-8"))
            workspace = str(record.get("container_workspace") or workspace)
        except (OSError, ValueError):
            pass
        nodes = [str(name) for name in self._task.args.get("nodes") or []]
        transport = ActionTransport(self, (AnsibleError,))
        check = bool(self._task.check_mode)
        try:
            synced = sync.sync(transport, node, f"{workspace}/jobs", job, runs / job, nodes, check=check)
        except (sync.SyncError, Unreachable) as error:
            return {**result, "failed": True, "msg": str(error)}
        lines = synced.lines()
        display.display("\n".join(lines))
        return {
            **result,
            "changed": bool(synced.files) and not synced.check,
            "lines": lines,
            "files": synced.files,
            "bytes": synced.bytes,
            "packed": synced.packed,
            "answered": synced.answer,
            "pending": synced.pending,
            "over": synced.over,
            "run_dir": str(synced.run_dir),
            **({"warnings": synced.warnings} if synced.warnings else {}),
        }
