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

**Two starts of one id** (two train.yml with one job_id at once): the controller's claim carries its
start's mark (JobSpec.start_id), recorded in the claim; a live claim of the same id by another start refuses
the claim as another job's would (``twin`` in the answer, named as such by :func:`node_jobs.parse_claim`).
Taken in sorted order under each node's lock, exactly one of them takes the lowest node and goes on; the
other gives back only what its own start took (a release names its start).

**A job's end, where the next claim looks**: the supervisor's end releases its claims on every node the job
ran on (:func:`release_all`) and records there that the job ended (``<jobs_dir>/<id>/.ended``). A claim whose
job's end is recorded is stale at once, whatever of the job still runs: such a process (a rank that ignored
the stop, a watcher left behind) is a stray, listed by :func:`node_report` (``strays``, not ``busy``) and
ended by the next claim of the node (:func:`end_strays`: by pid, each pid's command line checked again).

**Every wait on the node's lock is bounded** (:func:`ddp_cluster.supervisor.drain.node_lock`): a process
that holds ``.claim.lock`` (a job's code can open it) makes the claim answer ``locked`` with the node, the
lock and the holder named, within ``drain.LOCK_WAIT`` seconds, never a start that hangs.

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
import shutil
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
from ddp_cluster.job.queue import STAGED
from ddp_cluster.supervisor import drain
from ddp_cluster.supervisor.remote import POOL, Mesh
from ddp_cluster.supervisor.standby import supervisor_alive

# A job's directory's name as it appears in a command line (the id's rule without its length: a longer name
# is read whole, never cut to a shorter job's id).
ANY_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
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
# The job's end, recorded in its directory on every node it ran on when its supervisor ends (release_all):
# where the next claim looks. A job ended here holds the node no more; what of it still runs is a stray, ended
# by the next claim (:func:`end_strays`).
ENDED = ".ended"
STRAY_GRACE = 3.0  # seconds between TERM and KILL of an ended job's strays (as remote.STOP_GRACE)


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
    supervisor = re.compile(rf"ddp_cluster[.]supervise --job-dir {re.escape(jobs_dir)}/({ANY_ID})\s*$")
    member = re.compile(rf"{re.escape(jobs_dir)}/({ANY_ID})")
    for pid, line in processes(jobs_dir).items():
        if match := supervisor.search(line):
            supervisors[match.group(1)] = pid
        for job in set(member.findall(line)):
            busy.setdefault(job, []).append(pid)
    return busy, supervisors


@dataclass(frozen=True)
class Claim:
    """A node's claim: the job that has it (its nodes, when and on which host it was taken, and the start
    that took it: JobSpec.start_id, '' when a supervisor took it); ``written`` is the claim file's time
    (what its grace counts from)."""

    job: str
    nodes: tuple[str, ...] = ()
    at: float = 0.0
    host: str = ""
    written: float = 0.0
    start: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "nodes": list(self.nodes),
            "at": self.at,
            "host": self.host,
            "start": self.start,
        }


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
        start=str(data.get("start") or ""),
    )


def read_status(path: Path) -> tuple[job_status.Status | None, str]:
    """The status in ``path`` and '' (None and '': none yet); None and what is wrong with a file the job's
    code may have written: JSON that is no status, or bytes that are no UTF-8 (never a traceback: the node's
    report, claim and stop go on without it)."""
    try:
        return job_status.read_checked(path)
    except ValueError as error:  # UnicodeDecodeError: a status.json that is not UTF-8
        return None, (
            f"{path} is not UTF-8 text ({error}): the job's supervisor never writes that, something else"
            " did (the job's code, a hand); its supervisor's next write replaces it"
        )


def ended_record(jobs_dir: str, job: str) -> dict[str, Any] | None:
    """The job's end as recorded here (:func:`record_end`); None when none is."""
    try:
        data = json.loads(Path(jobs_dir, job, ENDED).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"job": job}  # a torn or foreign record still says the job ended here
    return data if isinstance(data, dict) else {"job": job}


def record_end(jobs_dir: str, job: str) -> None:
    """Record here that ``job`` ended (its supervisor's end: :func:`release_all`)."""
    folder = Path(jobs_dir, job)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    record = {"job": job, "at": time.time(), "by": socket.gethostname()}
    write_atomic(folder / ENDED, (json.dumps(record) + "\n").encode())


def _ended(jobs_dir: str, job: str) -> bool:
    """Whether the job's status here (on its first node) says it ended, or names a supervisor here that is
    gone (this node was lost and came back: the job ended, or went on elsewhere, without it)."""
    found = read_status(Path(jobs_dir, job, job_status.FILE))[0]
    if found is None:
        return False
    if found.done:
        return True
    here = found.supervisor_node in ("", socket.gethostname())
    return here and found.pid is not None and not supervisor_alive(Path(jobs_dir, job), found.pid)


def claim_live(
    jobs_dir: str, found: Claim, busy: Mapping[str, Sequence[int]], now: float | None = None
) -> bool:
    """Whether ``found`` still holds the node (see the module's text: a stale claim is taken over). A job
    whose end is recorded here holds it no more, whatever of it still runs (its strays)."""
    if not found.job or ended_record(jobs_dir, found.job) is not None:
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
    jobs_dir: str, job: str, nodes: Sequence[str] = (), now: float | None = None, start: str = ""
) -> Claim | drain.Drained | None:
    """Claim this node for ``job`` (``nodes``: the job's, for whoever the claim refuses). None when the node
    is ``job``'s now: claimed, taken over from a stale claim, or claimed again (its time renewed); else the
    live claim of the other job that has it, or the node's drain record when it is drained (a drained node
    takes no new job; the job that holds it already keeps it).

    ``start`` (the controller's start: JobSpec.start_id): a live claim of the same id by another start is
    refused like another job's (returned; its ``job`` is ``job``), so that of two starts of one id exactly one
    goes on; a claim without one (the supervisor's renewal, a restart's spare) is the job's own. A start that
    takes the node clears an end recorded here by an earlier run of the id. What still runs here of jobs whose
    end is recorded here is ended once the node is taken (:func:`end_strays`). NodeLockBusy when the node's
    lock does not come free (:func:`ddp_cluster.supervisor.drain.node_lock`)."""
    with drain.node_lock(jobs_dir):
        found = read_claim(jobs_dir)
        busy = running(jobs_dir)[0]
        if found is not None and found.job != job and claim_live(jobs_dir, found, busy, now):
            return found
        twin = found is not None and found.job == job and bool(start and found.start) and found.start != start
        if twin and found is not None and claim_live(jobs_dir, found, busy, now):
            return found
        if (found is None or found.job != job) and (drained := drain.read(jobs_dir)) is not None:
            return drained
        same = found is not None and found.job == job
        kept = found.nodes if found is not None and same else ()
        made = Claim(
            job=job,
            nodes=tuple(nodes) or kept,
            at=time.time(),
            host=socket.gethostname(),
            start=start or (found.start if found is not None and same else ""),
        )
        if start and not (same and found is not None and found.start == start):
            Path(jobs_dir, job, ENDED).unlink(missing_ok=True)  # a new start of the id: its earlier end
        try:
            _place(jobs_dir, made, replace=found is not None)
        except FileExistsError:  # made outside the lock (by hand): judged as any claim, next time
            return read_claim(jobs_dir) or Claim(job="")
    end_strays(jobs_dir, {other: pids for other, pids in busy.items() if other != job})
    return None


def end_strays(jobs_dir: str, busy: Mapping[str, Sequence[int]], grace: float = STRAY_GRACE) -> list[int]:
    """End the processes here of the jobs in ``busy`` (job -> pids, as :func:`running` found them) whose end
    is recorded here: TERM, up to ``grace`` seconds, then KILL. Each pid is checked again first (its command
    line still names that job's directory), so a pid reused since is left alone. The pids signalled."""
    strays = [
        pid
        for job, pids in busy.items()
        if ended_record(jobs_dir, job) is not None
        for pid in pids
        if pid != os.getpid() and _names(pid, f"{jobs_dir}/{job}")
    ]
    for pid in strays:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    if strays and not _wait_gone(strays, grace):
        for pid in strays:
            if _names(pid, jobs_dir):  # still the stray (a pid reused since names no job's directory)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
    return strays


def _names(pid: int, folder: str) -> bool:
    """Whether process ``pid``'s command line names ``folder`` exactly (the folder, not a longer name)."""
    try:
        line = Path("/proc", str(pid), "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return False
    return re.search(rf"{re.escape(folder)}(?![A-Za-z0-9_.-])", line) is not None


def release(jobs_dir: str, job: str, ended: bool = False, start: str = "") -> bool:
    """Remove this node's claim when it is ``job``'s (and, given ``start``, that start's: a start that lost
    to another start of its id never releases the winner's); whether the node holds no claim of ``job``
    now (False: another's claim is there, and kept). ``ended``: the job ended, recorded here
    (:func:`record_end`), whoever holds the node."""
    with drain.node_lock(jobs_dir):
        if ended:
            record_end(jobs_dir, job)
        found = read_claim(jobs_dir)
        if found is None:
            return True
        if found.job != job or (start and found.start and found.start != start):
            return False
        Path(jobs_dir, CLAIM).unlink(missing_ok=True)
    return True


def _here_command(
    jobs_dir: str, action: str, job: str, nodes: Sequence[str], start: str = "", ended: bool = False
) -> str:
    """The single-node form, as the first node runs it on another node over the mesh."""
    line = (
        f". {node_jobs.NODE_ENV} && python -m {node_jobs.MODULE} --jobs-dir {shlex.quote(jobs_dir)}"
        f" --{action} {shlex.quote(job)} --here"
    )
    line += f" --nodes {shlex.quote(','.join(nodes))}" if nodes else ""
    line += f" --start {shlex.quote(start)}" if start else ""
    return line + (" --ended" if ended else "")


def claim_one(
    mesh: Mesh, node: str, job: str, jobs_dir: str, nodes: Sequence[str] = (), start: str = ""
) -> dict[str, Any]:
    """Claim ``node`` for ``job`` (here when it is the mesh's own node, else over ssh): ``{"claimed": true,
    "node": N}``, or ``{"claimed": false, "node": N, "job": OTHER, "nodes": [...]}`` (``job`` '' and ``error``
    when the node did not answer; ``twin`` when another start of ``job`` holds it; ``locked`` and ``error``
    when the node's lock did not come free). The supervisor takes a spare this way."""
    if node == mesh.me:
        try:
            refused = claim(jobs_dir, job, nodes, start=start)
        except drain.NodeLockBusy as error:
            return {
                "claimed": False,
                "node": node,
                "job": "",
                "nodes": [],
                "locked": True,
                "error": str(error),
            }
    else:
        answer = node_jobs.parse(mesh.run(node, _here_command(jobs_dir, "claim", job, nodes, start)))
        if answer is None or "claimed" not in answer:
            return {"claimed": False, "node": node, "job": "", "nodes": [], "error": "no answer"}
        return {**answer, "node": node}
    if refused is None:
        return {"claimed": True, "node": node}
    if isinstance(refused, drain.Drained):
        return {"claimed": False, "node": node, "job": "", "nodes": [], "drained": refused.to_dict()}
    answer = {"claimed": False, "node": node, "job": refused.job, "nodes": list(refused.nodes)}
    return {**answer, "twin": True, "at": refused.at} if refused.job == job else answer


def release_one(mesh: Mesh, node: str, job: str, jobs_dir: str, ended: bool = False, start: str = "") -> bool:
    """Release ``job``'s claim on ``node`` (``ended``: its end recorded there; ``start``: only that
    start's claim); False when the node did not answer or another job (or start) holds it."""
    if node == mesh.me:
        try:
            return release(jobs_dir, job, ended, start)
        except drain.NodeLockBusy as error:
            print(f"the claim of job {job} was not released: {error}", file=sys.stderr, flush=True)
            return False
    answer = node_jobs.parse(mesh.run(node, _here_command(jobs_dir, "release", job, (), start, ended)))
    return bool(answer and answer.get("released"))


def release_all(
    mesh: Mesh,
    nodes: Sequence[str],
    job: str,
    jobs_dir: str,
    pool: ThreadPoolExecutor,
    ended: bool = True,
    start: str = "",
) -> list[str]:
    """Release ``job``'s claim on every node of ``nodes`` at once; the nodes where it could not be (they did
    not answer: their claim goes stale once nothing of the job runs there). ``ended`` (its supervisor's end,
    the default): the job's end is recorded on each node, so that the next claim there takes the node from
    whatever of the job is left (:func:`end_strays`); a start that gives back what it took passes False."""
    done = pool.map(lambda node: release_one(mesh, node, job, jobs_dir, ended, start), nodes)
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
    mesh: Mesh, nodes: Sequence[str], job: str, jobs_dir: str, pool: ThreadPoolExecutor, start: str = ""
) -> dict[str, Any]:
    """Claim every node of ``nodes`` for ``job``, all or nothing, in sorted order (see the module's text):
    ``{"claimed": true, "nodes": [...]}``, or the first refusal (as :func:`claim_one` says it) after what
    was taken is released; a node that gave no answer is asked to release too (its claim may have been
    taken after its answer was given up on). ``start``: this start's mark (:func:`claim`)."""
    taken: list[str] = []
    for node in sorted(nodes):
        answer = claim_one(mesh, node, job, jobs_dir, nodes, start)
        if not answer.get("claimed"):
            unsure = [node] if answer.get("error") == "no answer" else []
            left = release_all(mesh, taken + unsure, job, jobs_dir, pool, ended=False, start=start)
            return {**answer, "released": [n for n in taken if n not in left], "not_released": left}
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
    # an ended job's processes hold the node no more: listed as strays, ended by the next claim here
    strays = {job: pids for job, pids in busy.items() if ended_record(jobs_dir, job) is not None}
    busy = {job: pids for job, pids in busy.items() if job not in strays}
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
        found, problem = read_status(folder / job_status.FILE)
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
        "strays": {job: sorted(pids) for job, pids in sorted(strays.items())},
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
    staged = Path(jobs_dir, STAGED, job)  # a job Slurm had not started yet: its files, waiting here
    if staged.is_dir() and not staged.is_symlink():
        shutil.rmtree(staged, ignore_errors=True)
        done["unstaged"] = True
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
    found, problem = read_status(folder / job_status.FILE)
    if problem and found is None and job not in running(jobs_dir)[1]:
        found = job_status.Status(state="running")  # unreadable, its supervisor gone: closed as any
    if found is not None and not found.done and job not in running(jobs_dir)[1]:
        # its supervisor is gone (killed with its node's processes, or before): close the status
        said = reason or "the job was stopped"
        replaced = f"; its status.json could not be read and was replaced: {problem}" if problem else ""
        closed = found.update(
            state="failed",
            reason=f"{said} (its supervisor was no longer running){replaced}",
            interrupted=reason,
            updated=time.time(),
        )
        write_atomic(folder / job_status.FILE, closed.dumps().encode())
        done["closed"] = True
    held = read_claim(jobs_dir)
    if held is not None and held.job == job and not running(jobs_dir)[0].get(job):
        try:  # nothing of it left here: the node is free at once
            done["released"] = release(jobs_dir, job)
        except drain.NodeLockBusy as error:
            done["error"] = str(error)
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
    parser.add_argument(
        "--start", default="", help="the start's own mark (another start of the id is refused)"
    )
    parser.add_argument("--ended", action="store_true", help="with --release: record the job's end here")
    args = parser.parse_args(argv)
    jobs_dir = args.jobs_dir.rstrip("/")
    for option in ("stop", "claim", "release"):
        value = getattr(args, option)
        if value and (problem := node_jobs.id_problem(value, f"--{option}")):
            parser.error(problem)
    nodes = drain.node_list(args.nodes)
    if args.claim or args.release:
        me = socket.gethostname()
        with ThreadPoolExecutor(max_workers=POOL) as pool:
            if args.claim and (args.here or not nodes):
                answer = claim_one(Mesh(me), me, args.claim, jobs_dir, nodes, args.start)
            elif args.claim:
                answer = claim_all(Mesh(me), nodes, args.claim, jobs_dir, pool, args.start)
            elif args.here or not nodes:
                try:
                    released = release(jobs_dir, args.release, args.ended, args.start)
                    answer = {"released": released, "node": me}
                except drain.NodeLockBusy as error:
                    answer = {"released": False, "node": me, "locked": True, "error": str(error)}
            else:
                left = release_all(Mesh(me), nodes, args.release, jobs_dir, pool, args.ended, args.start)
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
