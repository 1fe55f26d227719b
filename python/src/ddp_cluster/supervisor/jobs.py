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

**A claim per node** (one job per node at a time): ``<jobs_dir>/.claim`` holds the job that has the node
(JSON: job, nodes, at, host). The busy check alone cannot keep two starts apart (both check, then both start);
the claim is the start's own step, taken on every node of the job before its supervisor starts and released
when it ends. ``--claim ID --nodes n0,n1,...`` (on the job's first node) takes the nodes all or nothing, in
sorted order, this one directly and the others over the mesh's ssh (each the single-node form, ``--here``);
the first refusal releases what was taken and names the node and the job that has it. Of two starts whose
nodes overlap, the one that takes the lowest node they share goes on and the other takes none of the rest:
exactly one of them starts. A node whose claim is its own job's already is claimed again, its time renewed
(the supervisor adopts the start's claim, and renews its nodes' at once before it launches:
:func:`renew_all`); a restart claims each spare it takes (:func:`claim_one`); the supervisor's end releases
them all (:func:`release_all`), as does a stop on a node once nothing of the job is left there.

Why a file and a lock, not either alone: a claim must outlive the short command that takes it (it is held
from the start until the supervisor ends, and read by anyone), so it is a file, not a held ``flock``; but the
decisions on it (is the claim there live? then replace it, or refuse) must not interleave, or two claimants
that both found a stale claim would both take the node. So every claim and release runs under a short
``flock`` of ``.claim.lock`` (the claimants of a node all run in its container: one kernel, one local file
system), and a new claim is linked into place (``os.link``: O_EXCL's answer, EEXIST when one is there; a
reader never sees half a file); a replaced one is renamed over it.

A claim is **stale**, and taken over, when no process of its job runs on the node (:func:`running`: the
supervisor, the liveness watcher, a standby supervisor, the ranks all name the job's directory) and the claim
file is older than ``CLAIM_GRACE`` (the window between the claim and the job's first process), or the job's
status here says it ended. A supervisor killed with SIGKILL, or a node that rebooted, leaves such a claim.
:func:`node_report` lists a node with a live claim as busy with its job (so the controller's check, the
supervisor's choice of spares and jobs.yml say so).

**A drained node** (:mod:`ddp_cluster.supervisor.drain`: its ``.drained`` record, changed under the same
lock) takes no new claim: the claim answers ``{"claimed": false, "drained": {...}}``, so neither a start nor a
restart's spare can take it, even one planned before the drain. A claim of the job that holds the node already
is renewed (a drain keeps a node out of the next jobs, never out of its running one). :func:`node_report`
carries the record as ``drained`` (null when the node is not drained).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_cluster.files import write_atomic
from ddp_cluster.job import node_jobs
from ddp_cluster.job import status as job_status
from ddp_cluster.supervisor import drain
from ddp_cluster.supervisor.remote import POOL, Mesh
from ddp_cluster.supervisor.standby import supervisor_alive

JOB_ID = node_jobs.JOB_ID.pattern
# The newest jobs listed per node (by their directory's time), besides those that run.
NEWEST = 20
STOP_WAIT = 60.0  # seconds for a supervisor to stop its job
RANKS_WAIT = 20.0  # seconds for a job's processes to end on a node whose supervisor stops them
# The file a stop asked from the controller leaves in the job's directory: why (the supervisor reads it).
STOP_REASON = "stop-reason"
# The node's claim (see the module's text), the lock its changes are made under, and the seconds a claim
# without any process of its job stays live (from the claim to the supervisor's and the ranks' start).
CLAIM = ".claim"
CLAIM_LOCK = drain.NODE_LOCK
CLAIM_GRACE = 120.0


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


@dataclass(frozen=True)
class Claim:
    """A node's claim: the job that has it (its nodes, when and on which host it was taken); ``written`` is
    the claim file's time (what its grace counts from)."""

    job: str
    nodes: tuple[str, ...] = ()
    at: float = 0.0
    host: str = ""
    written: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "nodes": list(self.nodes), "at": self.at, "host": self.host}


def read_claim(jobs_dir: str) -> Claim | None:
    """This node's claim; None when there is none (an unreadable one is nobody's: stale at once)."""
    path = Path(jobs_dir, CLAIM)
    try:
        written = path.stat().st_mtime
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return Claim(job="")
    if not isinstance(data, dict):
        return Claim(job="")
    nodes = data.get("nodes")
    return Claim(
        job=str(data.get("job") or ""),
        nodes=tuple(str(node) for node in nodes) if isinstance(nodes, list) else (),
        at=float(data.get("at") or 0.0),
        host=str(data.get("host") or ""),
        written=written,
    )


def _ended(jobs_dir: str, job: str) -> bool:
    """Whether the job's status here (on its first node) says it ended, or names a supervisor here that is
    gone (this node was lost and came back: the job ended, or went on elsewhere, without it)."""
    found = job_status.read(Path(jobs_dir, job, job_status.FILE))
    if found is None:
        return False
    if found.done:
        return True
    here = found.supervisor_node in ("", socket.gethostname())
    return here and found.pid is not None and not supervisor_alive(Path(jobs_dir, job), found.pid)


def claim_live(
    jobs_dir: str, found: Claim, busy: Mapping[str, Sequence[int]], now: float | None = None
) -> bool:
    """Whether ``found`` still holds the node (see the module's text: a stale claim is taken over)."""
    if not found.job:
        return False
    if busy.get(found.job):
        return True
    if _ended(jobs_dir, found.job):
        return False
    if found.written < node_started():  # the node (its container) started again since: nothing of it runs
        return False
    return (time.time() if now is None else now) - found.written < CLAIM_GRACE


def node_started() -> float:
    """When this node's container started (its first process's start), in epoch seconds; 0 when unknown."""
    try:
        fields = Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # starttime, field 22 of proc(5): clock ticks after the machine's boot
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0


def _place(jobs_dir: str, made: Claim, replace: bool) -> None:
    data = (json.dumps(made.to_dict()) + "\n").encode()
    path = Path(jobs_dir, CLAIM)
    if replace:
        write_atomic(path, data)
        return
    tmp = Path(jobs_dir, f"{CLAIM}.new-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.link(tmp, path)  # EEXIST when a claim is there: never two
    finally:
        tmp.unlink(missing_ok=True)


def claim(
    jobs_dir: str, job: str, nodes: Sequence[str] = (), now: float | None = None
) -> Claim | drain.Drained | None:
    """Claim this node for ``job`` (``nodes``: the job's, for whoever the claim refuses). None when the node
    is ``job``'s now: claimed, taken over from a stale claim, or claimed again (its time renewed); else the
    live claim of the other job that has it, or the node's drain record when it is drained (a drained node
    takes no new job; the job that holds it already keeps it)."""
    with drain.node_lock(jobs_dir):
        found = read_claim(jobs_dir)
        if found is not None and found.job != job and claim_live(jobs_dir, found, running(jobs_dir)[0], now):
            return found
        if (found is None or found.job != job) and (drained := drain.read(jobs_dir)) is not None:
            return drained
        kept = found.nodes if found is not None and found.job == job else ()
        made = Claim(job=job, nodes=tuple(nodes) or kept, at=time.time(), host=socket.gethostname())
        try:
            _place(jobs_dir, made, replace=found is not None)
        except FileExistsError:  # made outside the lock (by hand): judged as any claim, next time
            return read_claim(jobs_dir) or Claim(job="")
    return None


def release(jobs_dir: str, job: str) -> bool:
    """Remove this node's claim when it is ``job``'s; whether the node holds no claim of ``job`` now (False:
    another job's claim is there, and kept)."""
    with drain.node_lock(jobs_dir):
        found = read_claim(jobs_dir)
        if found is None:
            return True
        if found.job != job:
            return False
        Path(jobs_dir, CLAIM).unlink(missing_ok=True)
    return True


def _here_command(jobs_dir: str, action: str, job: str, nodes: Sequence[str]) -> str:
    """The single-node form, as the first node runs it on another node over the mesh."""
    line = (
        f". {node_jobs.NODE_ENV} && python -m {node_jobs.MODULE} --jobs-dir {shlex.quote(jobs_dir)}"
        f" --{action} {shlex.quote(job)} --here"
    )
    return line + (f" --nodes {shlex.quote(','.join(nodes))}" if nodes else "")


def claim_one(mesh: Mesh, node: str, job: str, jobs_dir: str, nodes: Sequence[str] = ()) -> dict[str, Any]:
    """Claim ``node`` for ``job`` (here when it is the mesh's own node, else over ssh): ``{"claimed": true,
    "node": N}``, or ``{"claimed": false, "node": N, "job": OTHER, "nodes": [...]}`` (``job`` '' and ``error``
    when the node did not answer). The supervisor takes a spare this way."""
    if node == mesh.me:
        refused = claim(jobs_dir, job, nodes)
    else:
        answer = node_jobs.parse(mesh.run(node, _here_command(jobs_dir, "claim", job, nodes)))
        if answer is None or "claimed" not in answer:
            return {"claimed": False, "node": node, "job": "", "nodes": [], "error": "no answer"}
        return {**answer, "node": node}
    if refused is None:
        return {"claimed": True, "node": node}
    if isinstance(refused, drain.Drained):
        return {"claimed": False, "node": node, "job": "", "nodes": [], "drained": refused.to_dict()}
    return {"claimed": False, "node": node, "job": refused.job, "nodes": list(refused.nodes)}


def release_one(mesh: Mesh, node: str, job: str, jobs_dir: str) -> bool:
    """Release ``job``'s claim on ``node``; False when the node did not answer or another job holds it."""
    if node == mesh.me:
        return release(jobs_dir, job)
    answer = node_jobs.parse(mesh.run(node, _here_command(jobs_dir, "release", job, ())))
    return bool(answer and answer.get("released"))


def release_all(
    mesh: Mesh, nodes: Sequence[str], job: str, jobs_dir: str, pool: ThreadPoolExecutor
) -> list[str]:
    """Release ``job``'s claim on every node of ``nodes`` at once; the nodes where it could not be (they did
    not answer: their claim goes stale once nothing of the job runs there)."""
    done = pool.map(lambda node: release_one(mesh, node, job, jobs_dir), nodes)
    return [node for node, released in zip(nodes, done, strict=True) if not released]


def renew_all(
    mesh: Mesh, nodes: Sequence[str], job: str, jobs_dir: str, pool: ThreadPoolExecutor
) -> dict[str, dict[str, Any]]:
    """Claim again, all at once, nodes that are ``job``'s already (their grace starts anew: the supervisor
    does it before it launches, when handing out the files may have taken a while); node -> the refusal of
    each node that is no longer the job's (its claim went stale and another job took it, or it did not
    answer)."""
    answers = pool.map(lambda node: claim_one(mesh, node, job, jobs_dir, nodes), nodes)
    return {node: answer for node, answer in zip(nodes, answers, strict=True) if not answer.get("claimed")}


def claim_all(
    mesh: Mesh, nodes: Sequence[str], job: str, jobs_dir: str, pool: ThreadPoolExecutor
) -> dict[str, Any]:
    """Claim every node of ``nodes`` for ``job``, all or nothing, in sorted order (see the module's text):
    ``{"claimed": true, "nodes": [...]}``, or the first refusal (as :func:`claim_one` says it) after what
    was taken is released."""
    taken: list[str] = []
    for node in sorted(nodes):
        answer = claim_one(mesh, node, job, jobs_dir, nodes)
        if not answer.get("claimed"):
            left = release_all(mesh, taken, job, jobs_dir, pool)
            return {**answer, "released": taken, "not_released": left}
        taken.append(node)
    return {"claimed": True, "nodes": sorted(nodes)}


def _job_file(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "job.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def node_report(jobs_dir: str, newest: int = NEWEST) -> dict[str, Any]:
    """What this node knows of the jobs (see the module's text), as a JSON-ready mapping."""
    busy, supervisors = running(jobs_dir)
    found_claim = read_claim(jobs_dir)
    claimed = found_claim if found_claim and claim_live(jobs_dir, found_claim, busy) else None
    if claimed is not None:  # claimed, its processes not started yet: the node is that job's
        busy.setdefault(claimed.job, [])
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
        found, problem = job_status.read_checked(folder / job_status.FILE)
        claim_nodes = list(claimed.nodes) if claimed and claimed.job == folder.name else []
        jobs[folder.name] = {
            "status": found.to_dict() if found else None,
            "status_problem": problem,  # JSON that is no status: what is wrong with it, for the table
            "nodes": spec.get("nodes") or claim_nodes,
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
        "claim": claimed.to_dict() if claimed else None,
        "drained": drained.to_dict() if (drained := drain.read(jobs_dir)) else None,
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
    done: dict[str, Any] = {
        "job": job,
        "supervisor": False,
        "left": False,
        "closed": False,
        "released": False,
    }
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
    held = read_claim(jobs_dir)
    if held is not None and held.job == job and not running(jobs_dir)[0].get(job):
        done["released"] = release(jobs_dir, job)  # nothing of it left here: the node is free at once
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ddp_cluster.supervisor.jobs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--jobs-dir", default="/workspace/jobs", help="the jobs' directory in the node")
    parser.add_argument("--stop", default="", help="stop this job here first")
    parser.add_argument("--reason", default="stopped with jobs.yml -e stop=ID", help="why (the status says)")
    parser.add_argument("--claim", default="", help="claim the nodes for this job (one JSON line says)")
    parser.add_argument("--release", default="", help="release this job's claim of the nodes")
    parser.add_argument("--nodes", default="", help="the job's nodes, comma-separated (claimed in order)")
    parser.add_argument("--here", action="store_true", help="claim or release this node only")
    args = parser.parse_args(argv)
    jobs_dir = args.jobs_dir.rstrip("/")
    for option in ("stop", "claim", "release"):
        value = getattr(args, option)
        if value and not node_jobs.JOB_ID.fullmatch(value):
            parser.error(f"--{option} {value!r} is not a job id")
    nodes = drain.node_list(args.nodes)
    if args.claim or args.release:
        me = socket.gethostname()
        with ThreadPoolExecutor(max_workers=POOL) as pool:
            if args.claim and (args.here or not nodes):
                answer = claim_one(Mesh(me), me, args.claim, jobs_dir, nodes)
            elif args.claim:
                answer = claim_all(Mesh(me), nodes, args.claim, jobs_dir, pool)
            elif args.here or not nodes:
                answer = {"released": release(jobs_dir, args.release), "node": me}
            else:
                left = release_all(Mesh(me), nodes, args.release, jobs_dir, pool)
                answer = {"released": not left, "not_released": left}
        print(json.dumps(answer))
        return 0 if answer.get("claimed", answer.get("released")) else 1
    stopped = stop_here(jobs_dir, args.stop, args.reason) if args.stop else None
    report = node_report(jobs_dir)
    if stopped is not None:
        report["stopped"] = stopped
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
