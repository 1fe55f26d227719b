"""A job's lifecycle, seen from the controller: start, wait, detach, attach, stop; the first node gone, the
bound passed, Ctrl-C. One owner, behind a :class:`~ddp_cluster.job.transport.Transport` to the job's first
node's server (the ``ddp_job_wait`` action hands in one on Ansible's connection; the tests a fake).

:meth:`JobControl.run`: the job's files (job.tar.gz, and the checkpoint to resume from) go into the job's
directory on the first node's server; the supervisor starts detached in the node container (``python -m
ddp_cluster.supervise``: it gives every other node the files, runs the launcher, watches every node); then its
status.json (:class:`ddp_cluster.job.status.Status`) is read every ``poll`` seconds and a line said whenever
the progress changes. The supervisor enforces job_timeout itself; when the controller's own bound (job_timeout
+ ``GRACE``) passes, the job is stopped (the supervisor stops every rank) and its last word waited for. The
last status read is written to runs/<id>/status.json on the controller and returned.

``detach``: return once every rank runs (the status says ``ranks_running``), saying the job's id and the
commands that follow, list and stop it; the job goes on without the controller. ``attach`` (the plan of an
earlier run, :func:`attach_plan`): start nothing, follow the job's status to its end (a job that already ended
is just collected). A restart the supervisor made is said as it happens.

Ctrl-C: the ``ddp_job_interrupt`` callback (in the playbook's own process, where Ansible receives SIGINT)
leaves :func:`interrupt_file` (in the user's own ``~/.ddp-cluster``, never the shared /tmp); the wait sees
it at its next poll, stops the job on every node (with the reason), waits for the supervisor's last word and
returns it, so the results are collected and the report says the job was interrupted.

A stop is the node's own (:mod:`ddp_cluster.job.node_jobs`: the same command as ``jobs.yml -e stop=ID``).
The first node is taken for gone when its supervisor said nothing new for ``SILENT`` seconds and docker says
its container does not run, or its server has not answered for the takeover bound (the job's
``liveness_timeout`` plus ``TAKEOVER_WAIT``): a call that gets no answer is said and asked again, never taken
as the node's loss at once (the controller's own network may have blinked; ssh's keepalives, ansible.cfg's
``ServerAliveInterval``, bound each call).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import shlex
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.files import write_atomic
from ddp_cluster.job import node_jobs, queue
from ddp_cluster.job import plan as planning
from ddp_cluster.job import secrets as job_secrets
from ddp_cluster.job import status as job_status
from ddp_cluster.job.spec import BUNDLE_FILE
from ddp_cluster.job.status import Status
from ddp_cluster.job.transport import Transport, Unreachable, in_container
from ddp_cluster.runtime import checkpoint_names
from ddp_cluster.text import visible

# Seconds past job_timeout before the controller stops a job whose supervisor did not end it; and to wait for
# the supervisor's last word after a stop.
GRACE = 90
STOP_WAIT = 90
# How long detach waits for every rank to run.
DETACH_WAIT = 120
# Seconds without a new word from the supervisor before the wait checks that the first node still runs.
SILENT = 20.0
# Seconds without a new status before the wait checks that the supervisor still lives (it writes every poll).
QUIET = 6.0
# Seconds, beyond the job's liveness_timeout, that the wait gives the standby to take a lost first node's job
# over and write its first status.
TAKEOVER_WAIT = 90.0
SUPERVISOR_LOG = "supervisor.log"
# Seconds between two claims of nodes another job holds, with wait_for_nodes.
CLAIM_POLL = 5.0
LAST_WORDS = "last-words"
# A stop asked with jobs.yml (report.STOPPED_BY_JOBS): the report takes it as asked, not as a failure.
STOPPED_BY_JOBS = "stopped with jobs.yml"
# Seconds a job Slurm said it is about to schedule (reason None) is given to start, before detach=true
# returns with it queued.
SCHEDULING = 10.0
# Seconds between two looks at Slurm's queue in the first SCHEDULING seconds.
QUEUE_POLL_FIRST = 0.25


class AttachError(DdpClusterError):
    """``attach=ID`` names no job this controller planned; the message says what to do."""


class PrivateDirError(DdpClusterError):
    """The controller's private folder for the Ctrl-C marker is not this user's alone; says how to fix."""


def private_dir(home: Path | None = None) -> Path:
    """This user's own folder on the controller (``~/.ddp-cluster``, mode 0700, owned by the user), made
    when missing: what only this user may write or remove goes there, never the shared temporary folder,
    where another local user could plant or remove it by its predictable name. PrivateDirError when it is a
    link, not a folder, or another user's."""
    folder = (home or Path.home()) / ".ddp-cluster"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    try:
        found = os.lstat(folder)
    except OSError as error:
        raise PrivateDirError(
            f"{folder} cannot be made or read ({error}): make it a folder of yours"
        ) from None
    if not stat.S_ISDIR(found.st_mode):
        raise PrivateDirError(
            f"{folder} is not a folder (a link or a file): remove it (rm {folder}) and run again; it is made"
            " as this user's own folder, mode 0700"
        )
    if found.st_uid != os.getuid():
        raise PrivateDirError(
            f"{folder} belongs to uid {found.st_uid}, not to this user (uid {os.getuid()}): remove it and"
            " run again; it is made as this user's own folder, mode 0700"
        )
    if stat.S_IMODE(found.st_mode) & 0o077:
        os.chmod(folder, 0o700)  # ours, but open to others: closed before anything is put in it
    return folder


def interrupt_file(playbook_pid: int, home: Path | None = None) -> Path:
    """The file the ddp_job_interrupt callback leaves when the playbook (process ``playbook_pid``) gets
    Ctrl-C while a job is waited for; the ddp_job_wait action, a child of that process, looks for it. In
    this user's :func:`private_dir`: no other local user can stop the job or break the wait through it."""
    return private_dir(home) / f"interrupt.{playbook_pid}"


def follow_commands(job_id: str) -> list[str]:
    return [
        f"  follow it:  ansible-playbook train.yml -e attach={job_id}",
        "  list jobs:  ansible-playbook jobs.yml",
        f"  stop it:    ansible-playbook jobs.yml -e stop={job_id}",
    ]


def attach_plan(runs: Path, job_id: str) -> dict[str, Any]:
    """The plan of an earlier run (``runs``/<id>/plan.json), to follow the job without starting it. Only a
    run directory under ``runs`` is taken: the id is one name, and the plan's own run_dir must be that
    directory (the collect and the report write there)."""
    if problem := node_jobs.id_problem(job_id, "attach"):
        raise AttachError(
            f"{problem} (the directory runs/<id>/): `ansible-playbook jobs.yml` lists the cluster's jobs"
        )
    try:
        facts = planning.load(runs / job_id)
    except (OSError, ValueError) as error:
        raise AttachError(
            f"attach={job_id}: this controller has no plan of that job"
            f" ({runs / job_id}/{planning.PLAN_FILE}: {error});"
            " `ansible-playbook jobs.yml` lists the cluster's jobs"
        ) from error
    if facts.get("kind") != "train":
        raise AttachError(f"attach={job_id} is a {facts.get('label')}, not a job")
    named, expected = str(facts.get("run_dir") or ""), (runs / job_id).resolve()
    if not named or Path(named).resolve() != expected:
        raise AttachError(
            f"attach={job_id}: {runs / job_id}/{planning.PLAN_FILE} names another run directory"
            f" ({named or 'none'}), not {expected}: it was not written by this controller's plan (a job's"
            " output may not replace it); nothing was collected there. Plan the job again, or restore the"
            " plan.json that train.yml wrote"
        )
    return {**facts, "attach": True, "detach": False}


def supervisor_check(job_dir: str) -> str:
    """The node command that says ``alive`` while the job's supervisor runs there, else ``dead`` and its
    last words (the last-words file it leaves when it cannot write its status, the end of its log)."""
    where = shlex.quote(job_dir.rstrip("/"))
    spare = shlex.quote(f"/tmp/ddp-cluster/{job_dir.rstrip('/').rsplit('/', 1)[-1]}.{LAST_WORDS}")
    pattern = shlex.quote(
        f"[d]dp_cluster[.]supervise .*--job-dir {node_jobs.ere_escape(job_dir.rstrip('/'))}$"
    )
    return (
        f"if pgrep -f {pattern} >/dev/null; then echo alive; else echo dead;"
        f" cat {where}/{LAST_WORDS} {spare} 2>/dev/null | head -n 3; echo;"
        f" tail -n 5 {where}/{SUPERVISOR_LOG} 2>/dev/null; true; fi"
    )


# Reads the file argv[2] (relative) of the directory argv[1] as the server's root without following a link
# (the job's directory is in the workspace a job's code can write: a status.json planted as a link to a
# host file would be read from the host): each component opened from the workspace down with O_NOFOLLOW, a
# regular file only (not a fifo that would hang, not /dev/zero), at most 4 MiB; rc 1 otherwise.
READ_NOFOLLOW = (
    "import functools,os,stat,sys;"
    'D=os.O_RDONLY|os.O_DIRECTORY|os.O_NOFOLLOW;p=sys.argv[2].split("/");'
    "d=functools.reduce(lambda d,n:os.open(n,D,dir_fd=d),p[:-1],"
    "os.open(sys.argv[1],os.O_RDONLY|os.O_DIRECTORY));"
    "f=os.open(p[-1],os.O_RDONLY|os.O_NOFOLLOW|os.O_NONBLOCK,dir_fd=d);"
    "stat.S_ISREG(os.fstat(f).st_mode) or sys.exit(1);"
    'sys.stdout.buffer.write(os.fdopen(f,"rb").read(1<<22))'
)


def read_command(host_dir: str, name: str) -> str:
    """The server's command that prints the file ``name`` of the job directory ``host_dir`` (the plan's
    ``host_dirs``: <the node's workspace>/jobs/<job id>), never through a link (:data:`READ_NOFOLLOW`);
    rc 1, and nothing printed, when it is missing, a link or not a regular file."""
    job = Path(host_dir.rstrip("/"))
    relative = f"{job.parent.name}/{job.name}/{name}"
    workspace = shlex.quote(str(job.parent.parent))
    return f"python3 -c {shlex.quote(READ_NOFOLLOW)} {workspace} {shlex.quote(relative)}"


def last_words_of(output: str) -> str:
    """What a dead supervisor said last, from :func:`supervisor_check`'s output."""
    lines = [line.strip() for line in output.splitlines()[1:] if line.strip()]
    return " / ".join(lines[-3:])[-600:] if lines else "it said nothing (killed, or it crashed at start)"


def fed(container: str, command: str, source: str) -> str:
    """``command`` run in the node container with the server's file ``source`` on its standard input."""
    return (
        f"docker exec -i {shlex.quote(container)} /bin/sh -c {shlex.quote(command)} < {shlex.quote(source)}"
    )


def link_check(path: str, node: str) -> str:
    """The node's shell test that refuses ``path`` when it is a symbolic link, naming it and the fix."""
    where = shlex.quote(path)
    before = f"{path} in node {node} is a symbolic link (to "
    after = (
        "), not a directory: something in the node container made it (a job's code can); nothing was"
        f" written through it. Remove it (docker exec {node} rm {path}) and run the job again"
    )
    said = f'{shlex.quote(before)}"$(readlink {where})"{shlex.quote(after)}'
    return f"if [ -L {where} ]; then echo {said} >&2; exit 3; fi"


def files_steps(
    plan: Mapping[str, Any], node: str, target: str, bundle: str, checkpoint: str = "", secrets_file: str = ""
) -> list[str]:
    """The server's commands that put the job's files (``bundle``, ``checkpoint`` and ``secrets_file``, put
    on the server already) into the folder ``target`` of the node container: the job's directory, or the
    folder where a Slurm job's files wait for its start (:func:`ddp_cluster.job.queue.staged_dir`).

    The files are fed into the node container and written there by its own root: the job's directory is in
    the workspace a job's code can write, so nothing of it is touched by the server's root (a link planted
    there leads nowhere on the server). A link in place of the jobs' directory or the job's is refused,
    named. The folder is 0700, the secrets 0600; the copy of the secrets put on the server is removed once
    installed (its values are never on a command line)."""
    where = shlex.quote(target)
    folder = shlex.quote(f"{target}/output/{checkpoint_names.FOLDER}")
    jobs = node_jobs.jobs_dir(str(plan["job_dir"]))
    parent = str(Path(target).parent)
    unpack = "; ".join(
        [
            "set -e",
            "umask 077",
            link_check(jobs, node),
            f"mkdir -p {shlex.quote(jobs)}",
            *([link_check(parent, node), f"mkdir -p {shlex.quote(parent)}"] if parent != jobs else []),
            link_check(target, node),
            f"mkdir -p {where}",
            f"chmod 0700 {where}",
            f"mkdir -p {folder}",
            f"cat > {where}/{BUNDLE_FILE}",
            f"tar -xzf {where}/{BUNDLE_FILE} -C {where} --no-same-owner",
        ]
    )
    steps = [fed(node, unpack, bundle)]
    if checkpoint:
        name = shlex.quote(Path(checkpoint).name)
        install = f"umask 077 && cat > {folder}/.{name}.tmp && mv -f {folder}/.{name}.tmp {folder}/{name}"
        steps.append(fed(node, install, checkpoint))
    if secrets_file:
        into = f"{where}/{job_secrets.FILE}"
        install = f"umask 077 && cat > {into}.tmp && chmod 0600 {into}.tmp && mv -f {into}.tmp {into}"
        put = shlex.quote(secrets_file)
        steps.append(f"{{ {fed(node, install, secrets_file)}; done=$?; rm -f {put}; [ $done = 0 ]; }}")
    return steps


def start_command(
    plan: Mapping[str, Any], node: str, bundle: str, checkpoint: str = "", secrets_file: str = ""
) -> str:
    """The first node's server: the job's files into the job's directory (:func:`files_steps`), then the
    supervisor started detached in the node container."""
    job_dir = str(plan["job_dir"]).rstrip("/")
    where = shlex.quote(job_dir)
    steps = files_steps(plan, node, job_dir, bundle, checkpoint, secrets_file)
    supervise = (
        f". {node_jobs.NODE_ENV} && exec python -m ddp_cluster.supervise --job-dir {where}"
        f" > {where}/supervisor.log 2>&1"
    )
    steps.append(in_container(node, supervise, detach=True, shell="/bin/bash"))
    return " && ".join(steps)


# The submit command's line that names the Slurm job (sbatch --parsable: "ID" or "ID;cluster").
SUBMITTED = "slurm-job: "
BATCH_SCRIPT = "slurm-batch.sh"


def submitter() -> str:
    """Who submits, for Slurm's comment on the job: this controller's user and host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    said = f"{user}@{socket.gethostname()}"
    return re.sub(r"[^A-Za-z0-9._@-]", "_", said)[:120]


def submit_command(
    plan: Mapping[str, Any],
    node: str,
    bundle: str,
    checkpoint: str = "",
    secrets_file: str = "",
    comment: str = "",
) -> str:
    """The submitting node's server: the job's files staged in the node container
    (:func:`ddp_cluster.job.queue.staged_dir`), its batch script beside them, then ``sbatch``
    (:func:`ddp_cluster.job.queue.sbatch_argv`), which prints :data:`SUBMITTED` and Slurm's job id. A
    staged folder of the same id there already (a twin start) is refused; a refused sbatch removes what
    was staged."""
    slurm = plan["slurm"]
    staged = str(queue.staged_dir(str(plan["job_dir"])))
    script = f"{staged}/{BATCH_SCRIPT}"
    jobs = node_jobs.jobs_dir(str(plan["job_dir"]))
    parent = str(Path(staged).parent)
    # the staged folder is made here, alone (mkdir: of two starts of one id, exactly one makes it)
    twin = "; ".join(
        [
            link_check(jobs, node),
            link_check(parent, node),
            link_check(str(plan["job_dir"]).rstrip("/"), node),
            f"mkdir -p {shlex.quote(parent)}",
            f"mkdir -m 0700 {shlex.quote(staged)} 2>/dev/null || {{ echo 'job {plan['id']} is being submitted"
            f" already by another train.yml (its files are staged in {staged} on {node}): a job id names one"
            " job' >&2; exit 4; }",
        ]
    )
    argv = queue.sbatch_argv(
        str(plan["id"]),
        int(slurm["nodes"]),
        timeout_s=int(float(plan["timeout"])) + GRACE + STOP_WAIT,
        comment=comment,
        selection=queue.Selection(tuple(slurm.get("nodelist") or ()), tuple(slurm.get("exclude") or ())),
        partition=str(slurm.get("partition") or ""),
        qos=str(slurm.get("qos") or ""),
        spares=int(slurm.get("spares") or 0),
        script=script,
    )
    submit = "; ".join(
        [
            "set -e",
            f"printf %s {shlex.quote(queue.batch_script(str(plan['job_dir']), node))}"
            f" > {shlex.quote(script)}",
            f"chmod 0700 {shlex.quote(script)}",
            "cd /tmp",
            f'out=$({shlex.join(argv)} 2>&1) || {{ echo "sbatch: $out" >&2; rm -rf {shlex.quote(staged)};'
            " exit 5; }",
            f'echo "{SUBMITTED}$out"',
        ]
    )
    steps = [in_container(node, twin), *files_steps(plan, node, staged, bundle, checkpoint, secrets_file)]
    steps.append(in_container(node, submit, shell="/bin/bash"))
    # files that could not be staged are removed, so that the id may be submitted again
    unstage = in_container(node, f"rm -rf {shlex.quote(staged)}")
    return f"{{ {' && '.join(steps)}; }} || {{ rc=$?; [ $rc = 4 ] || {unstage}; exit $rc; }}"


def allocation(entry: queue.Entry, wanted: int) -> dict[str, Any]:
    """The nodes Slurm gave a job (its batch host first, as the job's first node, then Slurm's order): the
    first ``wanted`` run it, the rest are its spares."""
    first = entry.batch_host or (entry.nodelist[0] if entry.nodelist else "")
    nodes = [first, *(node for node in entry.nodelist if node != first)]
    return {"first": nodes[0], "nodes": nodes[:wanted], "spares": nodes[wanted:]}


@dataclass
class JobControl:
    """One job followed from the controller on its first node ``node`` (see the module's text)."""

    plan: Mapping[str, Any]
    node: str
    transport: Transport
    say: Callable[[str], None]
    interrupt: Path
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    # the job's secret_env: NAME -> value, read on the controller at the start; installed as JOB/secrets.json
    secrets: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # what the nodes reported (a status's cause, a restart's reason) reaches the terminal as text
        shown, self.say = self.say, lambda line: shown(visible(line))
        self.label = f"{self.plan['label']} {self.plan['id']}"
        self.status_file = f"{self.plan['host_dirs'][self.node]}/{job_status.FILE}"
        self.status_read = read_command(str(self.plan["host_dirs"][self.node]), job_status.FILE)
        self.first_lost = False
        self._unanswered_since: float | None = None  # since when the first node's server did not answer
        self.supervisor_dead = ""  # the dead supervisor's last words, once found dead
        self.nobody = (
            False  # followed to the standby: neither a standby nor a supervisor of the job runs there
        )
        self.start_id = str((self.plan.get("spec") or {}).get("start_id") or "")
        self._last_updated: float | None = None
        self._changed_at = self._probed_at = self._checked_at = self.clock()
        self._shown_restarts = 0
        self._status_problem = ""  # what the wait last said of a status.json that is no status

    @property
    def bound(self) -> float:
        return float(self.plan["timeout"]) + GRACE

    def run(self) -> dict[str, Any]:
        """Start (or attach to) the job and follow it; the action's result: ``failed`` and ``msg``, or
        ``changed``, ``state``, ``status`` (and ``detached``; ``moved``: the node that holds the job now;
        ``allocation``: the nodes Slurm gave it, which the later plays collect from)."""
        result = self.follow()
        if self.plan.get("allocated"):
            result["allocation"] = {"nodes": self.plan["nodes"], "spares": self.plan["spares"]}
        return result

    def slurm_start(self) -> dict[str, Any] | None:
        """A Slurm job: submitted (unless it was), waited for in the queue until Slurm gives it nodes; None
        when it runs on this node, else the action's result (``moved`` to its first node, queued, failed)."""
        if not self.plan.get("slurm_id") and self.plan.get("attach"):  # attach never submits
            return {
                "failed": True,
                "msg": f"{self.label}: it was never submitted to Slurm (its train.yml stopped before):"
                " nothing to attach to; run it again with train.yml",
            }
        if not self.plan.get("slurm_id") and (error := self.submit()):
            return {
                "failed": True,
                "msg": f"{self.label}: could not submit it to Slurm on {self.node}: {error}",
            }
        if not self.plan.get("allocated"):
            if (queued := self.through_queue()) is not None:
                return queued
            self.say(
                f"{self.label}: Slurm job {self.plan['slurm_id']} runs on {', '.join(self.plan['nodes'])}"
            )
        if self.plan["first"] != self.node:  # Slurm started it on another node: followed there
            return {"changed": True, "moved": self.plan["first"], "status": {}}
        return None

    def follow(self) -> dict[str, Any]:
        """:meth:`run`, without the allocation."""
        if not self.plan.get("follow"):  # a Ctrl-C from here on (the submit, the queue) is this run's
            self.interrupt.unlink(missing_ok=True)
        if self.plan.get("slurm") and not self.plan.get("follow") and not self.plan.get("allocated"):
            if (elsewhere := self.slurm_start()) is not None:
                return elsewhere
            self.plan = {**self.plan, "started": True}
            # the supervisor starts now, in the allocation: its silence is counted from here, not from the
            # submit (a queue wait is no silence of its)
            self._changed_at = self._probed_at = self._checked_at = self.clock()
        plan, node, label = self.plan, self.node, self.label
        if plan.get("follow"):
            first = self.await_takeover()
            if first is None:
                reason = (
                    f"no supervisor of the job runs on its first node {plan['first']} nor on its standby"
                    f" {node}: the job ended without its supervisor and no node took it over"
                    if self.nobody
                    else f"the job's first node was lost and {node}, its standby, did not take the job over"
                    f" within {self.takeover_bound:g} s (no status of its own in {self.status_file})"
                ) + "; `ansible-playbook jobs.yml` lists the cluster's jobs"
                if plan.get("slurm_id") and node == plan.get("first"):
                    reason = self.not_started_in_slurm()
                self.say(f"{label}: {reason}")
                lost = (str(plan["first"]),) if not plan.get("slurm_id") else ()
                # this node's results are the run's (the checkpoint copies): the report lays them out
                return self.written(
                    Status(state="failed", reason=reason, lost_nodes=lost, supervisor_node=node)
                )
            if plan.get("slurm_id") and node == plan.get("first"):
                self.say(f"{label}: following it on {node}, its first node, where Slurm started it")
            else:
                self.say(f"{label}: followed to {node}, which took the job over ({first.state})")
        elif plan.get("attach") and not plan.get("started"):
            first = self.read()
            standby = self.standby(first)
            if standby and (first is None or not first.done) and self.supervisor_not_here():
                # the first node is gone, or its supervisor: the job is its standby's (or ended there)
                self.say(
                    f"{label}: no supervisor of the job on {node}; following it to its standby {standby}"
                )
                return {"changed": False, "moved": standby, "status": first.to_dict() if first else {}}
            if first is None:
                return {
                    "failed": True,
                    "msg": f"{label}: no status on {node} ({self.status_file}): the job's first node lost it,"
                    " or the job never started there; `ansible-playbook jobs.yml` lists the cluster's jobs",
                }
            self.say(f"{label}: attached ({first.state}, nodes {', '.join(first.nodes)})")
        elif not plan.get("slurm") and (error := self.start()):
            return {"failed": True, "msg": f"{label}: could not start on {node}: {error}"}
        status = None
        if plan.get("detach") and not plan.get("attach"):
            status = self.wait(DETACH_WAIT, float(plan["poll"]), until_running=True)
            if status is not None and status.ranks_running and not status.done:
                self.say(f"{label}: detached: every rank runs; the job goes on without this controller")
                for line in follow_commands(str(plan["id"])):
                    self.say(line)
                return {"changed": True, "detached": True, "state": status.state, "status": status.to_dict()}
        if status is None or not (status.done or self.first_lost or self.interrupt.exists()):
            # attached; or detach=true while the ranks did not all run yet: follow it as attached
            status = self.wait(self.bound, float(plan["poll"]))
        if (moved := self.moved(status)) and not self.interrupt.exists():
            self.say(
                f"{label}: the job's supervisor on {node} stepped down; following the job to {moved}, which"
                f" holds it ({status.reason if status else ''})"
            )
            return {"changed": False, "moved": moved, "status": status.to_dict() if status else {}}
        if self.first_lost and self.standby(status) and not self.interrupt.exists():
            standby = self.standby(status)
            self.say(
                f"{label}: the first node {node} is gone; following the job to its standby {standby}, which"
                " takes it over"
            )
            return {"changed": False, "moved": standby, "status": status.to_dict() if status else {}}
        return self.written(self.finish(status))

    # --- Slurm ------------------------------------------------------------------------------------------
    def slurm(self, command: str) -> str:
        """A Slurm command's output, run in the node container; raises Unreachable."""
        done = self.transport.run(in_container(self.node, command))
        return done.stdout if done.rc == 0 else f"{done.stdout}\n{done.stderr}"

    def submit(self) -> str:
        """Put the job's files on this node, staged, and submit it to Slurm (its id kept in the plan); ''
        or what went wrong."""
        try:
            bundle = self.transport.put(str(self.plan["bundle"]))
            checkpoint = self.plan.get("resume_checkpoint") or ""
            put = self.transport.put(str(checkpoint)) if checkpoint else ""
            secrets_file = self.put_secrets()
            done = self.transport.run(
                submit_command(self.plan, self.node, bundle, put, secrets_file, submitter())
            )
        except Unreachable as error:
            return str(error)[-500:]
        finally:  # the files put for it are staged in the node now (a server lost later has none to clean)
            self.transport.close()
        if done.rc != 0:
            return done.said()
        said = [line for line in done.stdout.splitlines() if line.startswith(SUBMITTED)]
        slurm_id = said[-1].removeprefix(SUBMITTED).split(";")[0].strip() if said else ""
        if not slurm_id.isdigit():
            return f"sbatch said no job id ({done.stdout.strip()[-300:]})"
        self.remember(slurm_id=slurm_id, submitted_on=self.node)
        self.say(f"{self.label}: submitted to Slurm as job {slurm_id}")
        return ""

    def remember(self, **changes: Any) -> None:
        """The plan with CHANGES, here and in runs/<id>/plan.json (attach, the report and the later plays
        read it there)."""
        plan = dict(self.plan)
        plan.update(changes)
        path = str(plan.get("plan_path") or Path(plan["run_dir"], planning.PLAN_FILE))
        kept = {key: value for key, value in plan.items() if key not in (*planning.OVERRIDES, "plan_path")}
        with contextlib.suppress(OSError):
            write_atomic(Path(path), json.dumps(kept).encode())
        self.plan = plan

    def through_queue(self) -> dict[str, Any] | None:
        """Wait while Slurm holds the job in its queue, saying its place and why it waits; None once Slurm
        gave it nodes (the plan then names them), else the action's result: detached while queued, left
        queued after queue_timeout, cancelled (Ctrl-C, or in Slurm), or Slurm unreachable."""
        slurm_id, label = str(self.plan["slurm_id"]), self.label
        bound = float((self.plan.get("slurm") or {}).get("queue_timeout") or 0)
        started = self.clock()
        deadline = started + bound
        command = f"squeue -h -t all -j {slurm_id} -o {shlex.quote(queue.SQUEUE_FORMAT)} 2>&1; squeue -h -t"
        command += f" PENDING -o {shlex.quote(queue.SQUEUE_FORMAT)} 2>/dev/null"
        said, unanswered = "", 0
        while True:
            try:
                output = self.slurm(command)
                entries = list({entry.slurm_id: entry for entry in queue.parse_squeue(output)}.values())
                unanswered = 0
            except (Unreachable, queue.QueueError) as error:
                unanswered += 1
                if unanswered >= 10:
                    return {
                        "failed": True,
                        "msg": f"{label}: Slurm does not answer on {self.node} ({error}):"
                        f" the job stays submitted as Slurm job {slurm_id}; train.yml -e"
                        f" attach={self.plan['id']} follows it",
                    }
                self.sleep(2.0)
                continue
            mine = next((entry for entry in entries if entry.slurm_id == slurm_id), None)
            if mine is None or (not mine.pending and not mine.nodelist):
                state = mine.state if mine else "gone from Slurm's queue"
                self.unstage()
                if self.plan.get("stopped"):  # jobs.yml -e stop=ID cancelled it
                    said = (
                        f"{STOPPED_BY_JOBS} -e stop={self.plan['id']} while it waited in Slurm's queue"
                        f" (Slurm job {slurm_id} cancelled); nothing ran"
                    )
                    self.say(f"{label}: {said}")
                    return self.never_ran(Status(state="failed", reason=said, interrupted=said))
                reason = (
                    f"Slurm job {slurm_id} ended ({state}) before it was given nodes: scancel, or an"
                    " administrator, cancelled it"
                )
                self.say(f"{label}: {reason}")
                return self.never_ran(Status(state="failed", reason=reason))
            if not mine.pending:
                self.remember(allocated=True, **allocation(mine, len(self.plan["nodes"])))
                return None
            where = queue.place(entries, mine.name)
            line = f"{label}: queued as Slurm job {slurm_id}"
            line += f", {where[0]} of {where[1]} waiting" if where else ""
            line += f": {mine.waiting()}"
            if line != said:
                self.say(line)
                said = line
            if self.interrupt.exists():
                self.slurm(f"scancel {slurm_id}")
                self.unstage()
                reason = (
                    f"cancelled in Slurm's queue (Ctrl-C on the controller): Slurm job {slurm_id};"
                    " nothing ran"
                )
                self.say(f"{label}: {reason}")
                return self.never_ran(Status(state="failed", reason=reason, interrupted=reason))
            # detach returns once Slurm says why the job waits (its first answer may be before its first
            # scheduling pass: reason None, about to be scheduled)
            settled = mine.reason != "None" or self.clock() >= started + SCHEDULING
            if (self.plan.get("detach") and settled) or self.clock() >= deadline:
                why = "detached" if self.plan.get("detach") else f"still queued after {bound:g} s"
                self.say(
                    f"{label}: {why}: it stays queued as Slurm job {slurm_id} and starts by itself when Slurm"
                    " gives it nodes"
                )
                for line in follow_commands(str(self.plan["id"])):
                    self.say(line)
                return {"changed": True, "detached": True, "state": "queued", "status": {}}
            # often while Slurm may be about to start it (on free nodes, within a second), then every 1 s
            self.sleep(QUEUE_POLL_FIRST if self.clock() < started + SCHEDULING else 1.0)

    def never_ran(self, final: Status) -> dict[str, Any]:
        """The result of a job that ended in Slurm's queue: no node ran it (nothing to collect)."""
        return {**self.written(final), "started": False}

    def unstage(self) -> None:
        """What was staged for a job that will not start removed from the submitting node."""
        staged = shlex.quote(str(queue.staged_dir(str(self.plan["job_dir"]))))
        node = str(self.plan.get("submitted_on") or self.node)
        if node == self.node:
            with contextlib.suppress(Unreachable):
                self.transport.run(in_container(self.node, f"rm -rf {staged}"))

    def not_started_in_slurm(self) -> str:
        """Why the job's supervisor did not start on the node Slurm gave it: its last words there, or the
        batch script's output."""
        job = str(self.plan["job_dir"]).rstrip("/").rsplit("/", 1)[-1]
        output = queue.OUTPUT.replace("%j", str(self.plan["slurm_id"]))
        words = shlex.quote(f"/tmp/ddp-cluster/{job}.{LAST_WORDS}")
        command = f"cat {words} {shlex.quote(output)} 2>/dev/null | tail -n 5"
        try:
            said = " / ".join(line.strip() for line in self.slurm(command).splitlines() if line.strip())[
                -800:
            ]
        except Unreachable:
            said = ""
        return f"Slurm job {self.plan['slurm_id']} did not start the job on {self.node}: " + (
            said or "it said nothing (see scontrol show job and the node's slurmd log)"
        )

    def written(self, final: Status) -> dict[str, Any]:
        """The action's result for the job's last status, written to runs/<id>/status.json too."""
        run_dir = Path(self.plan["run_dir"])
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / job_status.FILE, final.dumps().encode())
        return {"changed": True, "state": final.state, "status": final.to_dict()}

    @property
    def takeover_bound(self) -> float:
        return float((self.plan.get("spec") or {}).get("liveness_timeout") or 25) + TAKEOVER_WAIT

    def standby(self, status: Status | None) -> str:
        """The node that takes the job over when its first node is lost (the status names it; the job's
        second node otherwise); '' for a one-node job."""
        if status is not None and status.standby:
            return status.standby
        nodes = [str(node) for node in self.plan.get("nodes") or []]
        return nodes[1] if len(nodes) > 1 and nodes[0] == self.node else ""

    def moved(self, status: Status | None) -> str:
        """The node that holds the job now, when this node's supervisor stepped down for it (its status
        names another node's supervisor: supervisor.fence); '' otherwise."""
        if status is None or status.done or status.supervisor_node in ("", self.node):
            return ""
        return status.supervisor_node

    def await_takeover(self) -> Status | None:
        """This node (the standby) took the job over: its own status, once it wrote one. None when the bound
        passed, or at once when neither a standby nor a supervisor of the job runs here (twice in a row: the
        job ended without its supervisor, and no node takes it over)."""
        deadline = self.clock() + self.takeover_bound
        where = node_jobs.ere_escape(str(self.plan["job_dir"]).rstrip("/"))
        pattern = shlex.quote(f"ddp_cluster[.]supervis(e|or[.]standby) .*--job-dir {where}( |$)")
        check = in_container(self.node, f"pgrep -f {pattern} >/dev/null && echo yes || echo no")
        idle = 0
        while self.clock() < deadline:
            if self.interrupt.exists():
                return None
            found = self.read()
            if found is not None and found.supervisor_node == self.node:
                return found
            try:
                here = self.transport.run(check).stdout.strip()
            except Unreachable:  # no answer is not "nothing runs here": asked again until the bound
                here = "unknown"
            idle = idle + 1 if here == "no" else 0
            if idle >= 2:
                self.nobody = True
                return None
            self.sleep(1.0)
        return None

    def finish(self, status: Status | None) -> Status:
        """The job's last status: the first node lost, the supervisor dead, Ctrl-C or the bound handled (a
        stop, then the supervisor's last word)."""
        label, node = self.label, self.node
        if self.supervisor_dead and not (status and status.done):
            pid = f"pid {status.pid} " if status and status.pid else ""
            reason = (
                f"the job's supervisor ({pid}on {node}) died: {self.supervisor_dead}; every rank was stopped"
            )
            self.say(f"{label}: {reason}")
            self.stop("")
            status = (status or Status()).update(state="failed", reason=reason, failed_node=node)
        elif self.first_lost:
            self.say(f"{label}: the first node {node} is gone, and the supervisor with it")
            lost = sorted({*(status.lost_nodes if status else ()), node})
            status = (status or Status()).update(
                state="failed",
                lost_nodes=lost,
                failed_node=node,
                reason=f"node {node}, the job's first node (its supervisor and rank 0's checkpoints), stopped"
                " answering; no restart can be made without it: bring it back with site.yml (or take it out"
                f" of group nodes), then train.yml -e resume=true -e resume_from={self.plan['id']}",
            )
        elif status is not None and not status.done and self.interrupt.exists():
            self.say(f"{label}: interrupted (Ctrl-C): stopping it on every node")
            self.stop("interrupted on the controller (Ctrl-C): stopped on every node")
            status = self.wait(STOP_WAIT, 1.0, stopping=True) or status
        elif status is None or not status.done:
            self.say(f"{label}: still running after the {self.bound:g} s bound: stopping it")
            self.stop("")
            status = self.wait(STOP_WAIT, 3.0, stopping=True) or status
        final = status or Status(state="failed", reason="no status from the supervisor")
        if not final.done:
            final = final.update(state="failed", reason=final.reason or "the supervisor did not end the job")
        return final

    def claim(self) -> str:
        """Claim every node of the job, all or nothing (the first node's container asks each over the mesh);
        with wait_for_nodes, again every CLAIM_POLL seconds within the job's bound while another job holds
        one, so that waiters start one at a time. '' or why not."""
        jobs = node_jobs.jobs_dir(str(self.plan["job_dir"]))
        nodes = [str(node) for node in self.plan.get("nodes") or [self.node]]
        command = in_container(
            self.node,
            node_jobs.claim_command(jobs, str(self.plan["id"]), nodes, self.start_id),
            shell="/bin/bash",
        )
        deadline = self.clock() + float(self.plan["timeout"])
        said = ""
        while True:
            done = self.transport.run(command)
            claimed, why = node_jobs.parse_claim(done.stdout)
            if claimed:
                return ""
            if (
                not self.plan.get("wait_for_nodes")
                or self.clock() >= deadline
                or "runs another job" not in why
            ):
                return why
            if why != said:
                self.say(f"{self.label}: waiting: {why.split('. One job', 1)[0]}")
                said = why
            if self.interrupt.exists():
                return "interrupted (Ctrl-C) while waiting for the nodes"
            self.sleep(CLAIM_POLL)

    def start(self) -> str:
        """Claim the nodes, put the job's files on the first and start its supervisor; '' or what went
        wrong."""
        claimed = False
        try:
            if refused := self.claim():
                return refused
            claimed = True
            bundle = self.transport.put(str(self.plan["bundle"]))
            checkpoint = self.plan.get("resume_checkpoint") or ""
            put = self.transport.put(str(checkpoint)) if checkpoint else ""
            secrets_file = self.put_secrets()
            done = self.transport.run(start_command(self.plan, self.node, bundle, put, secrets_file))
        except Unreachable as error:
            if claimed:
                self.release()
            return str(error)[-500:]
        finally:
            self.transport.close()
        if done.rc != 0:
            self.release()
        return "" if done.rc == 0 else done.said()

    def put_secrets(self) -> str:
        """The job's secrets put on the first node's server, from a 0600 file on the controller removed at
        once; '' when the job has none."""
        if not self.secrets:
            return ""
        descriptor, local = tempfile.mkstemp(prefix="ddp-secrets-", suffix=".json")
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(job_secrets.dumps(self.secrets))
            return self.transport.put(local)
        finally:
            Path(local).unlink(missing_ok=True)

    def release(self) -> None:
        """The job's claims released after a start that failed (else its nodes stay busy until stale)."""
        jobs = node_jobs.jobs_dir(str(self.plan["job_dir"]))
        nodes = [str(node) for node in self.plan.get("nodes") or [self.node]]
        command = node_jobs.release_command(jobs, str(self.plan["id"]), nodes, self.start_id)
        with contextlib.suppress(Unreachable):
            self.transport.run(in_container(self.node, command, shell="/bin/bash"))

    def stop(self, reason: str) -> None:
        """Stop the job on every node: its supervisor is told (with ``reason``; without one, as the job's
        own bound does) and waited for, what it left on the first node is killed."""
        jobs = node_jobs.jobs_dir(str(self.plan["job_dir"]))
        command = node_jobs.command(jobs, stop=str(self.plan["id"]), reason=reason)
        with contextlib.suppress(Unreachable):
            self.transport.run(in_container(self.node, command, shell="/bin/bash"))

    def read(self) -> Status | None:
        try:
            done = self.transport.run(f"{self.status_read} 2>/dev/null")
        except Unreachable:  # the first node's server does not answer (its loss is found by first_silent)
            return None
        if done.rc != 0:
            return None
        try:
            found = job_status.loads(done.stdout)
        except job_status.TornStatus:  # a partial read: the next poll sees the whole file
            return None
        except job_status.StatusError as error:
            # JSON that is no status (something else wrote it): said once; the supervisor's next write
            # replaces it, and the wait goes on meanwhile
            problem = job_status.unreadable(f"{self.node}:{self.status_file}", error)
            if problem != self._status_problem:
                self._status_problem = problem
                self.say(f"{self.label}: {problem}")
            return None
        if self.start_id and found.start_id and found.start_id != self.start_id:
            return None  # an earlier job's status under the same id: not this start's
        return found

    def supervisor_not_here(self) -> bool:
        """Whether no supervisor of the job runs on this node (its server or container gone, or it died)."""
        try:
            done = self.transport.run(in_container(self.node, supervisor_check(str(self.plan["job_dir"]))))
        except Unreachable:
            return True
        return done.rc != 0 or done.stdout.startswith("dead")

    def supervisor_gone(self, status: Status | None) -> bool:
        """Whether the supervisor died: no new status for QUIET seconds and no supervisor of the job runs on
        the node (its last words kept in supervisor_dead). A node that does not answer is first_silent's."""
        now = self.clock()
        if status is not None and status.done:
            return False
        if now - self._changed_at < QUIET or now - self._checked_at < QUIET / 2:
            return False
        self._checked_at = now
        command = supervisor_check(str(self.plan["job_dir"]))
        try:
            done = self.transport.run(in_container(self.node, command))
        except Unreachable:
            return False
        if not done.stdout.startswith("dead"):  # its status is its own (a missing log is no answer)
            return False
        again = self.read()  # it may have ended between the two reads
        if again is not None and again.done:
            return False
        self.supervisor_dead = last_words_of(done.stdout)
        return True

    def first_silent(self, status: Status | None) -> bool:
        """Whether the first node is gone: no new word from its supervisor for SILENT seconds and its
        container does not run (docker's answer), or its server has not answered for the takeover bound
        (unanswered is no evidence by itself: the controller's own network may have blinked). Sets
        first_lost."""
        now = self.clock()
        updated = status.updated if status else None
        if updated != self._last_updated:
            self._last_updated, self._changed_at = updated, now
            self._unanswered_since = None
            return False
        if now - self._changed_at < SILENT or now - self._probed_at < SILENT / 2:
            return False
        self._probed_at = now
        try:
            done = self.transport.run(f"docker inspect -f '{{{{.State.Running}}}}' {shlex.quote(self.node)}")
        except Unreachable as error:
            if self._unanswered_since is None:
                self._unanswered_since = now
                self.say(
                    f"{self.label}: the first node's server ({self.node}) does not answer"
                    f" ({str(error).strip()[:200]}); asking again: it is taken for gone after"
                    f" {self.takeover_bound:g} s without an answer"
                )
            self.first_lost = now - self._unanswered_since >= self.takeover_bound
            return self.first_lost
        if self._unanswered_since is not None:
            self._unanswered_since = None
            self.say(f"{self.label}: the first node's server ({self.node}) answers again")
        said = f"{done.stdout}\n{done.stderr}".lower()
        # gone: docker says the container stopped or is no more; any other answer (docker busy) is asked again
        self.first_lost = (done.rc == 0 and "false" in said) or "no such" in said
        return self.first_lost

    def wait(
        self, bound: float, poll: float, until_running: bool = False, stopping: bool = False
    ) -> Status | None:
        """Read status.json until the job is done (or, ``until_running``, every rank runs), ``bound``
        seconds passed, the first node is gone or Ctrl-C was pressed (unless already ``stopping``); say the
        progress and the restarts as they come."""
        deadline = self.clock() + bound
        shown = None
        status = None
        while True:
            status = self.read() or status
            if status is not None:
                for record in status.restarts[self._shown_restarts :]:
                    self.say(f"{self.label}: {job_status.describe_restart(record)}")
                self._shown_restarts = len(status.restarts)
            if until_running and status is not None and status.ranks_running:
                return status
            if self.moved(status):  # another node's supervisor holds the job: followed there
                return status
            if not stopping and (
                self.interrupt.exists() or self.first_silent(status) or self.supervisor_gone(status)
            ):
                return status
            progress = job_status.describe_progress(status.progress if status else None)
            state = status.state if status else "starting"
            elapsed = status.elapsed if status else 0.0
            if status is not None and status.done:
                self.say(f"{self.label}: {state} after {elapsed:.0f} s: {progress}")
                return status
            if progress != shown:
                self.say(f"{self.label}: {state} after {elapsed:.0f} s: {progress}")
                shown = progress
            if self.clock() >= deadline:
                return status
            self.sleep(poll)
