"""Action ``ddp_job_node``: check that a planned job can start on its nodes; changes nothing but what an
earlier job left in a node's image (below).

On the job's first node it checks every node of the job at once, with one command on the first node's server
(:func:`ddp_cluster.job.node_check.check_nodes`: the first node asks the others over the mesh, so the
controller's work does not grow with the node count; no module): each node answers, runs no other job (with
``wait_for_nodes``, waited for within the job's time bound) and is not drained, the first node's master port
is free and its listen backlog holds the ranks. Before an npu health gate (the plan's ``check_each``) every
node runs the task and checks itself instead (:func:`~ddp_cluster.job.node_check.check_node`, one command on
its own server): its devices must also reach the next server's (``hccn_tool -ping``, a tool of the server).
First each node puts back what the image owns of the files a shell or Python runs at its start
(:mod:`ddp_cluster.server.image_reset`: an earlier job's ``sitecustomize.py``, ``.pth`` or key in root's
``~/.ssh``); the task reports ``changed`` and says what it undid when it undid anything, and refuses the
node (naming the path and the fix) when it cannot put a file back.
A failure names each node, what is wrong and the fix. The job's files are written only after every node
passed (by ``ddp_job_wait``, on the first node), so a refused job leaves nothing behind.

    - ddp_job_node:
        plan: "{{ _ddp_job_plan }}"

``plan`` is the fact ``_ddp_job_plan`` (small); the whole plan is read from its ``plan_path``, once.
"""

from __future__ import annotations

import site
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job.node_check import HCCN_TOOL, check_node, check_nodes
from ddp_cluster.job.plan import check_each, whole
from ddp_cluster.job.transport import ActionTransport

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("plan",))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        variables = task_vars or {}
        node = str(variables["inventory_hostname"])
        tool = str(self._templar.template(variables.get("hccn_network_tool")) or HCCN_TOOL)
        transport = ActionTransport(self, ())  # a connection that fails fails the task, as Ansible does
        try:
            plan = whole(self._task.args["plan"])
        except (OSError, ValueError) as error:
            return {**result, "failed": True, "msg": f"{node}: the job's plan could not be read ({error})"}
        if check_each(plan):
            return {**result, **check_node(plan, node, transport, tool, display.display)}
        if node != plan["first"]:
            return {**result, "skipped": True, "msg": f"checked from {plan['first']}"}
        return {**result, **check_nodes(plan, transport, display.display)}
