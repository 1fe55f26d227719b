"""Action ``ddp_job_wait``: start a planned job on its first node and wait for it, printing its progress,
within a bound.

On the first node's server (its own connection; no module): the job's files (job.tar.gz, and the checkpoint
to resume from) go into the job's directory; the supervisor starts detached in the node container (``python
-m ddp_cluster.supervise``: it gives every other node the files, runs the launcher, watches every node); then
its status.json (:class:`ddp_cluster.job.status.Status`) is read every ``poll`` seconds and a line printed
whenever the progress changes. The supervisor enforces job_timeout itself; when this action's own bound
(job_timeout + 90 s) passes, it stops the supervisor (which stops every rank) and waits for its last word.
The last status read is returned and written to runs/<id>/status.json on the controller.

``detach`` (train.yml -e detach=true): return once every rank runs (the status says ``ranks_running``),
printing the job's id and the commands that follow it, list it and stop it; the job goes on without the
controller. ``attach`` (the plan of an earlier run, train.yml -e attach=ID): start nothing, follow the job's
status to its end (a job that already ended is just collected). A restart the supervisor made is printed as it
happens.

Ctrl-C: the ``ddp_job_interrupt`` callback (in the playbook's own process, where Ansible receives SIGINT)
leaves a file named after that process (:func:`ddp_cluster.supervisor.jobs.interrupt_file`); the wait sees
it at its
next poll, asks the supervisor to stop the job on every node (SIGUSR1, with the reason), waits for its last
word and returns it, so the results are collected and the report says the job was interrupted. A second
Ctrl-C is Ansible's own (it leaves at once; the supervisor still stops the job it was told to stop).

    - ddp_job_wait:
        plan: "{{ _ddp_job_plan }}"
"""

from __future__ import annotations

import contextlib
import os
import shlex
import site
import time
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.files import write_atomic
from ddp_cluster.job import status as job_status
from ddp_cluster.job.spec import BUNDLE_FILE
from ddp_cluster.supervisor.jobs import interrupt_file

display = Display()
# Seconds past job_timeout before the controller stops a job whose supervisor did not end it; and to wait for
# the supervisor's last word after a stop.
GRACE = 90
STOP_WAIT = 90
# How long detach waits for every rank to run.
DETACH_WAIT = 120
# Seconds without a new word from the supervisor before the wait checks that the first node still runs.
SILENT = 20.0


def follow_commands(job_id: str) -> list[str]:
    return [
        f"  follow it:  ansible-playbook train.yml -e attach={job_id}",
        "  list jobs:  ansible-playbook jobs.yml",
        f"  stop it:    ansible-playbook jobs.yml -e stop={job_id}",
    ]


class ActionModule(ActionBase):
    TRANSFERS_FILES = True
    _VALID_ARGS = frozenset(("plan",))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        if self._task.check_mode:  # the plan was checked; nothing starts
            return {**result, "skipped": True, "msg": "check mode: the job would start here"}
        plan = self._task.args["plan"]
        node = str((task_vars or {})["inventory_hostname"])
        host_dir = plan["host_dirs"][node]
        label = f"{plan['label']} {plan['id']}"
        status_file = f"{host_dir}/{job_status.FILE}"
        self._interrupt = interrupt_file(os.getppid())
        self._node, self._first_lost = node, False
        self._last_updated: float | None = None
        self._changed_at = self._probed_at = time.monotonic()
        self._interrupt.unlink(missing_ok=True)
        self._shown_restarts = 0
        if plan.get("attach"):
            first = self._read(status_file)
            if first is None:
                return {
                    **result,
                    "failed": True,
                    "msg": f"{label}: no status on {node} ({status_file}): the job's first node lost it, or"
                    " the job never started there; `ansible-playbook jobs.yml` lists the cluster's jobs",
                }
            display.display(f"{label}: attached ({first.state}, nodes {', '.join(first.nodes)})")
        else:
            started = self._start(plan, node, host_dir)
            if started:
                return {**result, "failed": True, "msg": f"{label}: could not start on {node}: {started}"}
        status = None
        if plan.get("detach") and not plan.get("attach"):
            status = self._wait(status_file, DETACH_WAIT, float(plan["poll"]), label, until_running=True)
            if status is not None and status.ranks_running and not status.done:
                display.display(
                    f"{label}: detached: every rank runs; the job goes on without this controller"
                )
                for line in follow_commands(str(plan["id"])):
                    display.display(line)
                return {
                    **result,
                    "changed": True,
                    "detached": True,
                    "state": status.state,
                    "status": status.to_dict(),
                }
        if status is None or not (status.done or self._first_lost or self._interrupt.exists()):
            # attached; or detach=true while the ranks did not all run yet: follow it as attached
            status = self._wait(status_file, float(plan["timeout"]) + GRACE, float(plan["poll"]), label)
        if self._first_lost:
            display.display(f"{label}: the first node {node} is gone, and the supervisor with it")
            lost = sorted({*(status.lost_nodes if status else ()), node})
            status = (status or job_status.Status()).update(
                state="failed",
                lost_nodes=lost,
                failed_node=node,
                reason=f"node {node}, the job's first node (its supervisor and rank 0's checkpoints), stopped"
                " answering; no restart can be made without it: bring it back with site.yml (or take it out"
                f" of group nodes), then train.yml -e resume=true -e resume_from={plan['id']}",
            )
        elif status is not None and not status.done and self._interrupt.exists():
            display.display(f"{label}: interrupted (Ctrl-C): stopping it on every node")
            self._stop(node, plan, "interrupted on the controller (Ctrl-C): stopped on every node")
            status = self._wait(status_file, STOP_WAIT, 1.0, label, stopping=True) or status
        elif status is None or not status.done:
            display.display(
                f"{label}: still running after the {float(plan['timeout']) + GRACE:g} s bound: stopping it"
            )
            self._stop(node, plan, "")
            status = self._wait(status_file, STOP_WAIT, 3.0, label, stopping=True) or status
        final = status or job_status.Status(state="failed", reason="no status from the supervisor")
        if not final.done:
            final = final.update(state="failed", reason=final.reason or "the supervisor did not end the job")
        run_dir = Path(plan["run_dir"])
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / job_status.FILE, final.dumps().encode())
        return {**result, "changed": True, "state": final.state, "status": final.to_dict()}

    def _stop(self, node: str, plan: dict[str, Any], reason: str) -> None:
        """Ask the job's supervisor to stop every rank (SIGUSR1 with ``reason``; SIGTERM without)."""
        pattern = shlex.quote(supervisor_pattern(plan["job_dir"]))
        if reason:
            say = f"echo {shlex.quote(reason)} > {shlex.quote(plan['job_dir'])}/stop-reason"
            command = f"{say}; pkill -USR1 -f {pattern}"
            self._low_level_execute_command(
                f"docker exec {shlex.quote(node)} /bin/sh -c {shlex.quote(command)}"
            )
        else:
            self._low_level_execute_command(f"docker exec {shlex.quote(node)} pkill -TERM -f {pattern}")

    def _first_silent(self, status: job_status.Status | None) -> bool:
        """Whether the first node is gone: no new word from its supervisor for SILENT seconds and its
        container does not run (or its server does not answer). Sets self._first_lost."""
        now = time.monotonic()
        updated = status.updated if status else None
        if updated != self._last_updated:
            self._last_updated, self._changed_at = updated, now
            return False
        if now - self._changed_at < SILENT or now - self._probed_at < SILENT / 2:
            return False
        self._probed_at = now
        try:
            done = self._low_level_execute_command(
                f"docker inspect -f '{{{{.State.Running}}}}' {shlex.quote(self._node)}"
            )
            running = done["rc"] == 0 and "true" in str(done.get("stdout", ""))
        except AnsibleError:
            running = False
        self._first_lost = not running
        return self._first_lost

    def _read(self, status_file: str) -> job_status.Status | None:
        try:
            done = self._low_level_execute_command(f"cat {shlex.quote(status_file)} 2>/dev/null")
        except AnsibleError:  # the first node's server does not answer (its loss is found by _first_silent)
            return None
        if done["rc"] != 0:
            return None
        with contextlib.suppress(job_status.StatusError):  # a partial read: the next poll sees the whole file
            return job_status.loads(str(done["stdout"]))
        return None

    def _start(self, plan: dict[str, Any], node: str, host_dir: str) -> str:
        """Put the job's files on the node and start its supervisor; '' or what went wrong."""
        tmp = self._make_tmp_path()
        try:
            bundle = f"{tmp}{BUNDLE_FILE}"
            self._transfer_file(plan["bundle"], bundle)
            where = shlex.quote(host_dir)
            steps = [
                f"mkdir -p {where}/output/checkpoints",
                f"cp {shlex.quote(bundle)} {where}/{BUNDLE_FILE}",
            ]
            steps.append(f"tar -xzf {where}/{BUNDLE_FILE} -C {where}")
            if plan.get("resume_checkpoint"):
                name = Path(plan["resume_checkpoint"]).name
                self._transfer_file(plan["resume_checkpoint"], f"{tmp}{name}")
                steps.append(f"cp {shlex.quote(tmp + name)} {where}/output/checkpoints/{shlex.quote(name)}")
            job_dir = shlex.quote(plan["job_dir"])
            supervise = (
                f". /etc/ddp-cluster/env.sh && exec python -m ddp_cluster.supervise --job-dir {job_dir}"
                f" > {job_dir}/supervisor.log 2>&1"
            )
            steps.append(f"docker exec -d {shlex.quote(node)} /bin/bash -c {shlex.quote(supervise)}")
            done = self._low_level_execute_command(" && ".join(steps))
        finally:
            self._remove_tmp_path(tmp)
        if done["rc"] != 0:
            return (str(done.get("stderr", "")).strip() or str(done.get("stdout", "")).strip())[
                -500:
            ] or f"rc {done['rc']}"
        return ""

    def _wait(
        self,
        status_file: str,
        bound: float,
        poll: float,
        label: str,
        until_running: bool = False,
        stopping: bool = False,
    ) -> job_status.Status | None:
        """Read status.json until the job is done (or, ``until_running``, every rank runs), ``bound``
        seconds passed or Ctrl-C was pressed (unless already ``stopping``); print the progress and the
        restarts as they come."""
        deadline = time.monotonic() + bound
        shown = None
        status = None
        while True:
            status = self._read(status_file) or status
            if status is not None:
                for record in status.restarts[self._shown_restarts :]:
                    display.display(f"{label}: {job_status.describe_restart(record)}")
                self._shown_restarts = len(status.restarts)
            if until_running and status is not None and status.ranks_running:
                return status
            if not stopping and self._interrupt.exists():
                return status
            if not stopping and self._first_silent(status):
                return status
            progress = job_status.describe_progress(status.progress if status else None)
            state = status.state if status else "starting"
            elapsed = status.elapsed if status else 0.0
            if status is not None and status.done:
                display.display(f"{label}: {state} after {elapsed:.0f} s: {progress}")
                return status
            if progress != shown:
                display.display(f"{label}: {state} after {elapsed:.0f} s: {progress}")
                shown = progress
            if time.monotonic() >= deadline:
                return status
            time.sleep(poll)


def supervisor_pattern(job_dir: str) -> str:
    """pkill's pattern of the job's supervisor (its command line ends with --job-dir JOB)."""
    return f"ddp_cluster.supervisor.loop --job-dir {job_dir}$"
