"""Action ``ddp_node_container``: the node_container role's one module run per node, then on the controller
(no second module run) the check of sshd's configuration and the node's record that every job's plan reads
(``record.path``: its interface, address, CPU binding and workspace).

The module (roles/node_container/library/ddp_node_container.py) makes the node's directories, settings file
and container and reads sshd's effective configuration; this action fails with what is wrong when sshd did
not answer in time or is not configured as the cluster needs (port, password and keyboard-interactive login
off, root by key only), and writes the record only when its content differs. Check mode writes nothing. The
probe's lines are read by ddp_cluster.server.node, the module's own code. ``jobs.dir`` (the jobs' folder in
the container) becomes ``jobs.command``, the node's report of its jobs that the module asks before it
replaces a running container, and ``jobs.stop_command``, the stop of one (as jobs.yml's) that force=true runs.
"""

from __future__ import annotations

import os
import site
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.files import write_atomic
from ddp_cluster.job import node_jobs
from ddp_cluster.server import node


class ActionModule(ActionBase):
    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        record = args.pop("record")
        host = (task_vars or {}).get("inventory_hostname", "?")
        if "jobs" in args:  # the node's report of its jobs and its stop: the commands jobs.yml runs
            jobs = dict(args["jobs"])
            folder, reason = str(jobs.pop("dir")), f"stopped by site.yml -e force=true (it recreated {host})"
            jobs["command"] = node_jobs.command(folder)
            jobs["stop_command"] = node_jobs.command(folder, "{job}", reason)
            args["jobs"] = jobs
        result.update(
            self._execute_module(module_name="ddp_node_container", module_args=args, task_vars=task_vars)
        )
        if result.get("failed"):
            return result
        lines = result.get("sshd") or []
        if not lines and self._play_context.check_mode:  # the container does not run yet: nothing to check
            return result
        failure = node.sshd_failure(
            host, args["container"]["name"], args["sshd"], lines, result.get("sshd_error") or ""
        )
        if failure:
            raise AnsibleActionFail(failure)
        probe = node.probe_lines(lines)
        result["ansible_facts"] = {
            "ddp_node_host_keys": node.host_keys(probe),
            "ddp_node_files": node.files_of(probe),
            "ddp_node_changed": bool(result.get("container_changed")),
        }
        text, path = node.record_of(probe, record["workspace"], record["container_workspace"]), record["path"]
        before = Path(path).read_text(encoding="utf-8") if os.path.exists(path) else ""
        if before != text:
            result["changed"] = True
            result.setdefault("actions", []).append(f"recorded the node in {path}")
            if self._play_context.diff:
                result.setdefault("diff", {"before": {}, "after": {}})
                result["diff"]["before"]["record"], result["diff"]["after"]["record"] = before, text
            if not self._play_context.check_mode:
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                write_atomic(Path(path), text.encode())
                os.chmod(path, 0o644)
        return result
