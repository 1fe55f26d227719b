"""Action ``ddp_jobs_drain``: drain or undrain the task's node (jobs.yml -e drain=NODE -e reason=... /
-e undrain=NODE); with ``show``, read every node's drain record through one node (plan.yml); with ``gate``,
drain the nodes a failed health gate names slow (on the gate's first node, after the gate ended).

One command on the node's server, in its container (:mod:`ddp_cluster.supervisor.drain`); the logic is
:mod:`ddp_cluster.job.node_jobs`' (drain_node, read_drained, drain_after_gate). In check mode the command
changes nothing and says what would change. ``by``: who asked, ``user@controller`` unless given.

    - ddp_jobs_drain:
        undrain: false
        reason: "{{ reason }}"
    - ddp_jobs_drain:
        gate: "{{ _ddp_job_planned }}"
    - ddp_jobs_drain:
        show: "{{ groups['nodes'] }}"
        via: "{{ groups['nodes'][0] }}"
      delegate_to: "{{ groups['nodes'][0] }}"
"""

from __future__ import annotations

import getpass
import site
import socket
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job import node_jobs
from ddp_cluster.job.transport import ActionTransport

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("undrain", "reason", "by", "gate", "show", "via"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        variables = task_vars or {}
        args = self._task.args
        node = str(args.get("via") or variables["inventory_hostname"])
        check = bool(self._task.check_mode)
        by = str(args.get("by") or f"{getpass.getuser()}@{socket.gethostname()}")
        transport = ActionTransport(self, (AnsibleError,))
        records = Path(str(self._templar.template(variables.get("cluster_controller_dir"))), "nodes")
        jobs = node_jobs.workspace_jobs(str(records), node)
        if args.get("show"):
            answer = node_jobs.read_drained(transport, node, jobs, args["show"], display.warning)
        elif args.get("gate"):
            gate = args["gate"]
            who = str(args.get("by") or f"health gate {gate['id']} ({by})")
            answer = node_jobs.drain_after_gate(
                transport, gate, node, who, check, display.display, display.warning
            )
        else:
            undrain = boolean(args.get("undrain") or False, strict=False)
            reason = str(args.get("reason") or "")
            answer = node_jobs.drain_node(transport, node, jobs, undrain, reason, by, check, display.display)
        return {**result, **answer}
