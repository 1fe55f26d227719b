"""Action ``ddp_job_collect``: bring one node's results of a job to the controller, as one archive.

Runs the ``ddp_job_pack`` module on the node's server (everything of the job's directory but older
checkpoints, whatever the job's end; the server's own Python, so a node whose container died still sends its
logs) and fetches the archive to runs/<id>/.incoming/<node>.tar.gz, checked against the SHA-256 the module
computed from its own bytes. The module writes the archive outside the workspace, in a directory of the
server's root (mode 0700) that nothing of the node container can reach: the fetch, as root, never reads a
path a job's code could swap for a link. The archive and its directory are removed from the server after
the fetch, whether it worked or not. Every
node at once (one task; Ansible's forks). The module refuses a job directory reached through a link (named
in the warning) and leaves out devices and fifos (a warning names them). A node the supervisor found lost
(``lost: true``) may not answer at all: it is tried with a short connection timeout (the task's), and what
cannot come back is a warning, never a failure: the others' results and the report still come. ``plan``: the
fact ``_ddp_job_plan``; the whole plan is read from its ``plan_path``.

    - ddp_job_collect:
        plan: "{{ _ddp_job_plan }}"
        lost: false
"""

from __future__ import annotations

import hashlib
import site
from pathlib import Path, PurePosixPath
from typing import Any

from ansible.errors import AnsibleError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job import results
from ddp_cluster.job.plan import whole


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("plan", "lost"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        if self._task.check_mode:  # the plan was checked; nothing starts
            return {**result, "skipped": True, "msg": "check mode: no job ran, nothing to bring back"}
        try:
            plan = whole(self._task.args["plan"])
        except (OSError, ValueError) as error:
            return {**result, "changed": False, "warnings": [f"the job's plan could not be read ({error})"]}
        lost = boolean(self._task.args.get("lost", False), strict=False)
        node = str((task_vars or {})["inventory_hostname"])
        host_dir = plan["host_dirs"][node]
        # the plan's host_dirs are <the node's workspace>/jobs/<job id>
        where: dict[str, Any] = {"job_dir": host_dir, "workspace": str(PurePosixPath(host_dir).parent.parent)}
        where["max_bytes"] = results.collect_share(plan, node)  # its part of the job's results_max_gb
        packed = self._execute_module("ddp_job_pack", module_args=where, task_vars=task_vars)
        if packed.get("failed"):
            return self._failed(result, node, lost, f"could not pack its results: {packed.get('msg', '')}")
        archive = str(packed["archive"])
        destination = Path(plan["run_dir"], ".incoming", f"{node}.tar.gz")
        try:
            destination.parent.mkdir(parents=True, exist_ok=True)
            self._connection.fetch_file(archive, str(destination))
        except (AnsibleError, OSError) as error:
            return self._failed(result, node, lost, f"could not fetch {archive}: {error}")
        finally:  # the archive's directory is the server's root's: nothing else removes it
            removal = {"archive": archive, "remove": True}
            self._execute_module("ddp_job_pack", module_args=removal, task_vars=task_vars)
        digest = hashlib.sha256()
        with destination.open("rb") as fetched:
            for block in iter(lambda: fetched.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != packed.get("sha256"):
            destination.unlink()
            return self._failed(result, node, lost, f"{archive} changed on the server after it was packed")
        warnings = (
            [f"{node}: left out of its results: {', '.join(packed['left_out'])}"]
            if packed.get("left_out")
            else []
        )
        done = {"changed": True, "archive": str(destination), "members": packed.get("members", 0)}
        return {**result, **done, **({"warnings": warnings} if warnings else {})}

    @staticmethod
    def _failed(result: dict[str, Any], node: str, lost: bool, message: str) -> dict[str, Any]:
        """Never a failure: the job's outcome is the job's; the report names the node whose results are
        missing."""
        why = " (the supervisor found it lost)" if lost else ""
        return {**result, "changed": False, "warnings": [f"{node}{why}: {message}"], "msg": message}
