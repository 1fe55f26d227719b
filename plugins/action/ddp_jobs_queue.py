"""Action ``ddp_jobs_queue``: Slurm's queue as jobs.yml lists it, asked on one node (every node is a Slurm
client); with ``stop`` a job still waiting in the queue is cancelled first (``scancel``: a running one is
stopped by its nodes, as any job).

One command on the node's server, in its container: ``squeue`` in :data:`ddp_cluster.job.queue.SQUEUE_FORMAT`
(pending, running and recently ended jobs), returned as ``entries``; a node whose Slurm does not answer is no
failure: ``down`` says why, and the list says so.

    - ddp_jobs_queue:
        stop: "{{ stop | default('') }}"
"""

from __future__ import annotations

import dataclasses
import shlex
import site
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job import node_jobs, queue
from ddp_cluster.job.transport import ActionTransport, Unreachable, in_container


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("stop",))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        node = str((task_vars or {})["inventory_hostname"])
        stop = str(self._task.args.get("stop") or "")
        if stop and not node_jobs.JOB_ID.fullmatch(stop):
            return {**result, "failed": True, "msg": f"stop={stop} is not a job id: jobs.yml lists them"}
        command = f"squeue -h -t all -o {shlex.quote(queue.SQUEUE_FORMAT)}"
        if stop and not self._task.check_mode:
            command = f"scancel --state=PENDING --name={shlex.quote(stop)} 2>&1; {command}"
        transport = ActionTransport(self, ())
        try:
            done = transport.run(in_container(node, command))
        except Unreachable as error:
            return {**result, "changed": False, "down": f"{node}: {error}"[:300]}
        try:
            entries = queue.parse_squeue(done.stdout) if done.rc == 0 else None
        except queue.QueueError as error:
            return {**result, "changed": False, "down": f"{node}: {error}"[:300]}
        if entries is None:
            said = (done.stderr or done.stdout).strip().splitlines()
            return {**result, "changed": False, "down": f"{node}: {said[-1] if said else done.rc}"[:300]}
        cancelled = bool(stop) and any(entry.name == stop and entry.state == "CANCELLED" for entry in entries)
        return {
            **result,
            "changed": cancelled,
            "entries": [dataclasses.asdict(entry) for entry in entries],
        }
