"""Action ``ddp_jobs_drain``: drain or undrain the task's node (jobs.yml -e drain=NODE -e reason=... /
-e undrain=NODE), or, with ``gate``, drain the nodes a failed health gate names slow (on the gate's first
node, after the gate ended).

One command on the node's server, in its container (:mod:`ddp_cluster.supervisor.drain`, its record in the
node's jobs' directory); what it did comes back as ``msg`` (:func:`ddp_cluster.job.node_jobs.drain_result`:
a node that runs a job is drained, and the job goes on). In check mode the command changes nothing and says
what would change. ``by``: who asked, ``user@controller`` unless given.

    - ddp_jobs_drain:
        undrain: false
        reason: "{{ reason }}"
    - ddp_jobs_drain:
        gate: "{{ _ddp_job_planned }}"
    - ddp_jobs_drain:                  # plan.yml: every node's record, read through one node's mesh
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
from ddp_cluster.job.transport import ActionTransport, Unreachable, in_container

display = Display()


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("undrain", "reason", "by", "gate", "show", "via"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        variables = task_vars or {}
        node = str(variables["inventory_hostname"])
        args = self._task.args
        check = bool(self._task.check_mode)
        transport = ActionTransport(self, (AnsibleError,))
        if args.get("show"):
            return {**result, **self._show(args["show"], transport, variables)}
        gate = args.get("gate")
        if gate:
            return {**result, **self._gate(gate, node, transport, str(args.get("by") or ""), check)}
        records = str(self._templar.template(variables.get("cluster_controller_dir")))
        jobs = node_jobs.workspace_jobs(str(Path(records, "nodes")), node)
        undrain = boolean(args.get("undrain") or False, strict=False)
        reason = str(args.get("reason") or "")
        by = str(args.get("by") or _who())
        line = node_jobs.drain_command(jobs, undrain, reason, by, check)
        try:
            done = transport.run(in_container(node, line, shell="/bin/bash"))
        except Unreachable as error:
            return {**result, "unreachable": True, "msg": f"{node}'s server does not answer: {error}"}
        answer = node_jobs.drain_result(node, undrain, check, done.stdout, done.rc)
        if not answer.get("failed"):
            display.display(answer["msg"])
        return {**result, **answer}

    def _show(self, nodes: Any, transport: ActionTransport, variables: dict[str, Any]) -> dict[str, Any]:
        """Every node's drain record, asked through the node ``via`` (the task is delegated to it) over the
        cluster's mesh: ``drained`` (node -> record), ``unknown`` (nodes that did not answer). Read-only: it
        runs in check mode too. A node that cannot be asked is no failure (each node's check refuses a drained
        one): ``drained`` is then absent."""
        listed = [str(node) for node in nodes]
        via = str(self._task.args.get("via") or listed[0])
        records = str(self._templar.template(variables.get("cluster_controller_dir")))
        jobs = node_jobs.workspace_jobs(str(Path(records, "nodes")), via)
        try:
            done = transport.run(in_container(via, node_jobs.show_command(jobs, listed), shell="/bin/bash"))
        except Unreachable as error:
            display.warning(f"the drained nodes could not be read through {via}: {error}")
            return {"changed": False, "nodes": listed}
        answer = node_jobs.parse(done.stdout)
        if answer is None or not isinstance(answer.get("drained"), dict):
            display.warning(f"the drained nodes could not be read through {via}: {done.said(200)}")
            return {"changed": False, "nodes": listed}
        return {"changed": False, "nodes": listed, "drained": answer["drained"], "unknown": answer["unknown"]}

    def _gate(self, plan: Any, node: str, transport: ActionTransport, by: str, check: bool) -> dict[str, Any]:
        """Drain the nodes health gate ``plan``'s verdict names slow, from its first node ``node``."""
        job = str(plan["id"])
        line = node_jobs.gate_drain_command(
            node_jobs.jobs_dir(str(plan["job_dir"])), job, by or f"health gate {job} ({_who()})", check
        )
        try:
            done = transport.run(in_container(node, line, shell="/bin/bash"))
        except Unreachable as error:  # the report says the gate's verdict; a drain is not worth a failure
            display.warning(f"health gate {job}: its failing nodes could not be drained: {error}")
            return {"changed": False, "lines": []}
        answer = node_jobs.parse(done.stdout) or {}
        lines = [str(text) for text in answer.get("lines") or []]
        for text in lines:
            display.display(text)
        if not answer:
            said = done.said(200)
            display.warning(f"health gate {job}: the drain of its failing nodes gave no answer ({said})")
        return {"changed": bool(answer.get("changed")), "lines": lines}
