"""The cluster's jobs, from the nodes themselves: what ``ansible-playbook jobs.yml`` lists and stops, and
the one answer to "which jobs run on this node" (:mod:`ddp_cluster.job.node_jobs` asks it, for the
controller's check before a job starts, jobs.yml, the controller's stop and the supervisor's spares).

On each node (in its container, one command: ``python -m ddp_cluster.supervisor.jobs --jobs-dir
/workspace/jobs``) :func:`node_report` reads the jobs' directories (a job's ``status.json`` is on its first
node, where its supervisor runs; ``job.json`` is on every node of it) and the processes
(``/proc/*/cmdline``): which jobs run here (busy), and whose supervisor lives here. It prints one JSON
document. With ``--stop ID`` it first stops job ID here: its supervisor, when it lives here, is asked to stop
every rank on every node (SIGUSR1 with the reason: train.yml's Ctrl-C, jobs.yml; without a reason SIGTERM,
as the controller's bound does) and waited for; the job's processes still here after that are stopped (the
supervisor's own sweep, :meth:`ddp_cluster.supervisor.remote.Mesh.sweep`); a status left ``running`` by a
supervisor that is gone is closed as failed, so that ``train.yml -e attach=ID`` collects it.

The controller asks it and reads its answer with :mod:`ddp_cluster.job.node_jobs` (which prints jobs.yml's
table). Standard library only: it runs in the node image's Python.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ddp_cluster.files import write_atomic
from ddp_cluster.job import node_jobs
from ddp_cluster.job import status as job_status
from ddp_cluster.supervisor.remote import Mesh

JOB_ID = node_jobs.JOB_ID.pattern
# The newest jobs listed per node (by their directory's time), besides those that run.
NEWEST = 20
STOP_WAIT = 60.0  # seconds for a supervisor to stop its job
RANKS_WAIT = 20.0  # seconds for a job's processes to end on a node whose supervisor stops them
# The file a stop asked from the controller leaves in the job's directory: why (the supervisor reads it).
STOP_REASON = "stop-reason"


def processes(jobs_dir: str) -> dict[int, str]:
    """pid -> command line of every process (but this one) whose command line names a job's directory."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
        if f"{jobs_dir}/" in line:
            found[int(entry.name)] = line
    return found


def running(jobs_dir: str) -> tuple[dict[str, list[int]], dict[str, int]]:
    """(job id -> its processes here, job id -> its supervisor's pid here)."""
    busy: dict[str, list[int]] = {}
    supervisors: dict[str, int] = {}
    supervisor = re.compile(rf"ddp_cluster[.]supervise --job-dir {re.escape(jobs_dir)}/({JOB_ID})\s*$")
    member = re.compile(rf"{re.escape(jobs_dir)}/({JOB_ID})")
    for pid, line in processes(jobs_dir).items():
        if match := supervisor.search(line):
            supervisors[match.group(1)] = pid
        for job in set(member.findall(line)):
            busy.setdefault(job, []).append(pid)
    return busy, supervisors


def _job_file(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "job.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def node_report(jobs_dir: str, newest: int = NEWEST) -> dict[str, Any]:
    """What this node knows of the jobs (see the module's text), as a JSON-ready mapping."""
    busy, supervisors = running(jobs_dir)
    root = Path(jobs_dir)
    folders = sorted(
        (folder for folder in root.iterdir() if folder.is_dir()) if root.is_dir() else [],
        key=lambda folder: folder.stat().st_mtime,
    )
    with_status = [folder for folder in folders if (folder / job_status.FILE).is_file()]
    listed = with_status[-newest:] if newest > 0 else []
    listed += [root / job for job in busy if root / job not in listed]
    jobs: dict[str, Any] = {}
    for folder in listed:
        spec = _job_file(folder)
        found = job_status.read(folder / job_status.FILE)
        jobs[folder.name] = {
            "status": found.to_dict() if found else None,
            "nodes": spec.get("nodes", []),
            "spares": spec.get("spares", []),
            "kind": spec.get("kind", "train"),
            "max_restarts": spec.get("max_restarts", 0),
            "supervisor": supervisors.get(folder.name),
        }
    return {
        "node": socket.gethostname(),
        "now": time.time(),
        "jobs": jobs,
        "busy": sorted(busy),
        "supervisors": supervisors,
    }


def _gone(pids: Sequence[int]) -> bool:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            return False
        return False
    return True


def _wait_gone(pids: Sequence[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not _gone(pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


def stop_here(jobs_dir: str, job: str, reason: str) -> dict[str, Any]:
    """Stop job ``job`` on this node (see the module's text); what was done. An empty ``reason`` stops it as
    its time bound does (SIGTERM: the supervisor's own words)."""
    busy, supervisors = running(jobs_dir)
    done: dict[str, Any] = {"job": job, "supervisor": False, "left": False, "closed": False}
    folder = Path(jobs_dir, job)
    if job in supervisors:
        if reason:
            write_atomic(folder / STOP_REASON, (reason + "\n").encode())
        with contextlib.suppress(ProcessLookupError):
            os.kill(supervisors[job], signal.SIGUSR1 if reason else signal.SIGTERM)
        done["supervisor"] = _wait_gone([supervisors[job]], STOP_WAIT)
    elif busy.get(job):
        _wait_gone(busy[job], RANKS_WAIT)  # the supervisor, on another node, stops them
    left, supervisors = running(jobs_dir)
    if left.get(job):
        done["left"] = True
        if job in supervisors:  # it did not stop within STOP_WAIT
            with contextlib.suppress(ProcessLookupError):
                os.kill(supervisors[job], signal.SIGKILL)
        with ThreadPoolExecutor(max_workers=1) as pool:
            me = socket.gethostname()
            Mesh(me).sweep([me], f"{jobs_dir}/{job}/", pool)
    found = job_status.read(folder / job_status.FILE)
    if found is not None and not found.done and job not in running(jobs_dir)[1]:
        # its supervisor is gone (killed with its node's processes, or before): close the status
        said = reason or "the job was stopped"
        closed = found.update(
            state="failed",
            reason=f"{said} (its supervisor was no longer running)",
            interrupted=reason,
            updated=time.time(),
        )
        write_atomic(folder / job_status.FILE, closed.dumps().encode())
        done["closed"] = True
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ddp_cluster.supervisor.jobs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--jobs-dir", default="/workspace/jobs", help="the jobs' directory in the node")
    parser.add_argument("--stop", default="", help="stop this job here first")
    parser.add_argument("--reason", default="stopped with jobs.yml -e stop=ID", help="why (the status says)")
    args = parser.parse_args(argv)
    jobs_dir = args.jobs_dir.rstrip("/")
    stopped = None
    if args.stop:
        if not node_jobs.JOB_ID.fullmatch(args.stop):
            parser.error(f"--stop {args.stop!r} is not a job id")
        stopped = stop_here(jobs_dir, args.stop, args.reason)
    report = node_report(jobs_dir)
    if stopped is not None:
        report["stopped"] = stopped
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
