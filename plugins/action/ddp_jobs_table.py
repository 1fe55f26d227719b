"""Action ``ddp_jobs_table``: print the cluster's jobs and nodes (jobs.yml), from every node's
``ddp_jobs_node`` result (:func:`ddp_cluster.job.node_jobs.table`), then Slurm's queue (``ddp_jobs_queue``'s
result, :func:`ddp_cluster.job.queue.lines`). Runs once, on the controller.

    - ddp_jobs_table:
        results: "{{ dict of node -> its ddp_jobs_node result }}"
        queue: "{{ the ddp_jobs_queue result: Slurm's queue }}"
"""

from __future__ import annotations

import site
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job import node_jobs, queue
from ddp_cluster.text import visible

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("results", "queue"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        given = self._task.args.get("results") or {}
        reports: dict[str, Any] = {}
        down: dict[str, str] = {}
        for node, item in given.items():
            item = item if isinstance(item, Mapping) else {}
            if isinstance(item.get("report"), Mapping):
                reports[str(node)] = item["report"]
            else:
                down[str(node)] = str(item.get("down") or item.get("msg") or "it did not answer")
        lines = node_jobs.table(reports, down)
        asked = self._task.args.get("queue")
        if isinstance(asked, Mapping) and not asked.get("skipped"):
            said = str(asked.get("down") or asked.get("msg") or "") if "entries" not in asked else ""
            entries = queue.from_dicts(asked.get("entries") or [])
            lines += ["", *(visible(line, newlines=False) for line in queue.lines(entries, said))]
        display.display("\n".join(lines))
        return {**result, "changed": False, "lines": lines}
