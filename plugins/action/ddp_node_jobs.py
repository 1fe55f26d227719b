"""Action ``ddp_node_jobs``: the node_container role's module of that name (the jobs that run in a node's
container, asked of the node before teardown.yml removes it), given the node's commands.

``dir`` (the jobs' folder in the container) becomes ``command``, the node's report of its jobs, and
``stop_command``, the stop of one, as jobs.yml's: the commands ``ddp_cluster.job.node_jobs`` builds for every
caller, site.yml's check before it recreates a container included.
"""

from __future__ import annotations

import site
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job import node_jobs


class ActionModule(ActionBase):
    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        host = (task_vars or {}).get("inventory_hostname", "?")
        folder = str(args.pop("dir"))
        args["command"] = node_jobs.command(folder)
        args["stop_command"] = node_jobs.command(
            folder, "{job}", f"stopped by teardown.yml -e force=true (it removed {host})"
        )
        result.update(
            self._execute_module(module_name="ddp_node_jobs", module_args=args, task_vars=task_vars)
        )
        return result
