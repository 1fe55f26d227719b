"""Drained nodes: a node kept out of the next jobs (the plan's "first N undrained nodes", a restart's
spares), with why, since when and by whom. The list lives with the cluster, each node holding its own state,
so every controller sees the same.

**The file**: ``<jobs_dir>/.drained`` on the node (``/workspace/jobs/.drained``), JSON ``{"node", "reason",
"since": ISO-8601 UTC, "by"}``; absent: not drained. Written whole (temporary file and rename: a reader sees
the old record or the new one) under the node's lock (:func:`node_lock`, the lock of the node's claim too:
:mod:`ddp_cluster.supervisor.jobs` refuses a new job's claim of a drained node under it, so a drain and a
start that cross each other never both win). A record that cannot be read still drains the node (someone
wrote it): its reason says so, and an undrain removes it.

Draining a node that runs a job leaves the job running: a drain keeps the node out of the NEXT jobs only
(and out of a restart's spares); the job's own restarts keep their nodes.

**The command** (in the node's container, one JSON line)::

    python -m ddp_cluster.supervisor.drain --jobs-dir D --drain --reason R --by WHO  [--check] [--node N]
    python -m ddp_cluster.supervisor.drain --jobs-dir D --undrain                    [--check] [--node N]
    python -m ddp_cluster.supervisor.drain --jobs-dir D --show [--nodes N1,N2,...]
    python -m ddp_cluster.supervisor.drain --jobs-dir D --gate JOB_ID --by WHO      [--check]

answers ``{"node", "drained": record or null, "was": the record before or null, "changed": bool}``
(``--show --nodes``: ``{"drained": {node: record}, "unknown": [nodes that did not answer]}``, asked over the
mesh's ssh at once; ``--node N``: node N, over the mesh when it is another). ``--check`` changes nothing and
says what would change. ``jobs.yml -e drain=NODE -e reason=...`` / ``-e undrain=NODE`` run it on that node;
the plan reads every node's state with ``--show --nodes`` on one node.

**Automatic drains**:

* a failed health gate (check.yml, train.yml -e preflight=true): ``--gate JOB_ID`` on the gate's first node
  (:func:`drain_gate`, the controller's ddp_job role runs it once the gate ended) reads the verdict of its
  ``output/health.json`` (:func:`gate_drains`: the nodes whose rows of ``verdict.node_figures`` are
  ``slow``, never ``undetermined`` ones, nor any when every row is slow: that is the whole fabric) and
  drains each with the reason ``health gate ID: <the verdict's problem line>``;
* a device fault: the supervisor (:mod:`ddp_cluster.supervisor.loop`) calls :func:`drain_remote` with the
  reason ``device-fault: NODE device D: <problem> (job ID)``.

**In Slurm too**: a drain (of any of the kinds above) drains the node in Slurm as well (``scontrol update
nodename=NODE state=drain reason=...``: ``sinfo -R`` shows why, and Slurm gives the node to no new job); an
undrain resumes it there. The node's own record stays the one this package reads (a Slurm that does not answer
changes nothing of the drain).

Standard library only: it runs in the node image's Python.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.files import write_atomic
from ddp_cluster.job import node_jobs, queue
from ddp_cluster.supervisor.remote import POOL, Mesh

MODULE = node_jobs.DRAIN_MODULE
DRAINED = ".drained"
# The node's lock: its claim's and its drain record's changes are made under it (one kernel, one file system).
NODE_LOCK = ".claim.lock"
# The gate's results in its job's directory (ddp_cluster.health.judge.HEALTH_FILE, under the job's output).
HEALTH = "output/health.json"
UNDRAIN_HINT = "ansible-playbook jobs.yml -e undrain=NODE"
# Seconds a claim, a release or a drain waits for the node's lock (node_lock): under the mesh's 30 s command
# bound, far above the moment a holder needs.
LOCK_WAIT = 15.0


class DrainError(DdpClusterError):
    """A drain that cannot be made as asked (no reason, a record that cannot be written); says how to fix."""


@dataclass(frozen=True)
class Drained:
    """A node's drain record: why, since when (ISO-8601 UTC) and by whom."""

    node: str
    reason: str
    since: str
    by: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"node": self.node, "reason": self.reason, "since": self.since, "by": self.by}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], node: str = "") -> Drained:
        return cls(
            node=str(data.get("node") or node),
            reason=str(data.get("reason") or "(no reason given)"),
            since=str(data.get("since") or "?"),
            by=str(data.get("by") or "?"),
        )

    def describe(self) -> str:
        """As the jobs list shows it: ``drained since TIME by WHO: REASON``."""
        return node_jobs.describe_drained(self.to_dict())


def now_iso(now: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))


class NodeLockBusy(DrainError):
    """The node's lock did not come free within its bound; the message names the node, the lock and who
    holds it (when this node can see it) and how to free it."""


def lock_holders(path: Path) -> list[str]:
    """``pid N: COMMAND`` of each process that holds a flock on ``path`` (``/proc/locks``, matched by the
    file's inode); [] when none is visible here (a holder in another PID namespace shows no pid)."""
    try:
        inode = path.stat().st_ino
        table = Path("/proc/locks").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    found = []
    for line in table.splitlines():
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue  # a waiter's line ("->"), or a lock of another kind
        if fields[5].rsplit(":", 1)[-1] != str(inode) or not fields[4].isdigit() or fields[4] == "0":
            continue
        try:
            raw = Path("/proc", fields[4], "cmdline").read_bytes()
            command = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
        except OSError:
            command = "?"
        found.append(f"pid {fields[4]}: {command or '?'}")
    return found


@contextlib.contextmanager
def node_lock(jobs_dir: str, timeout: float | None = None) -> Iterator[None]:
    """The node's lock, held while its claim or its drain record is judged and changed (every holder opens
    the file anew: flock excludes open files, threads of one process too). Waited for at most ``timeout``
    seconds (:data:`LOCK_WAIT`): a holder is a short judgement of a file, so a lock held longer is held by
    something else (a job's process can open the file too); NodeLockBusy then names it. The bound is below
    the mesh's command bound (remote.COMMAND_TIMEOUT), so that a claim asked over ssh says why it gave up
    before its ssh is given up on."""
    Path(jobs_dir).mkdir(parents=True, exist_ok=True)
    path = Path(jobs_dir, NODE_LOCK)
    handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + (LOCK_WAIT if timeout is None else timeout)
        pause = 0.01
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    waited = LOCK_WAIT if timeout is None else timeout
                    raise NodeLockBusy(busy_lock_message(path, waited)) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.2)
        yield
    finally:
        os.close(handle)


def busy_lock_message(path: Path, waited: float) -> str:
    holders, node = lock_holders(path), socket.gethostname()
    who = (
        f"held by {'; '.join(holders)}"
        if holders
        else "held by a process this node cannot name (another PID namespace)"
    )
    return (
        f"{node}: the node's claim lock {path} did not come free within {waited:g} s ({who}):"
        " a claim, a release or a drain takes it for a moment, so a holder this long is stuck or no part"
        f" of the cluster (a job's process can open it). End that process (docker exec {node} kill PID),"
        " then run the command again"
    )


def read(jobs_dir: str) -> Drained | None:
    """This node's drain record; None when it is not drained (an unreadable record drains it: see above)."""
    path = Path(jobs_dir, DRAINED)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        data = {"reason": f"its drain record {path} cannot be read ({error}); undrain it to remove it"}
    if not isinstance(data, dict):
        data = {"reason": f"its drain record {path} holds no record; undrain it to remove it"}
    return Drained.from_dict(data, socket.gethostname())


def drain(
    jobs_dir: str, reason: str, by: str, check: bool = False, now: float | None = None
) -> tuple[Drained, Drained | None]:
    """Drain this node: (its record now, the record it had before or None). A node drained already with
    another reason gets the new reason and time (the record says the latest why); with the same reason it is
    kept as it is (drained again, e.g. by the supervisor and then the controller after a gate: one record,
    the first). ``check``: nothing written."""
    reason = " ".join(reason.split())
    if not reason:
        raise DrainError(
            "a drain needs a reason (what is wrong with the node, for whoever reads the list): give"
            ' -e reason="..." (jobs.yml) or --reason'
        )
    made = Drained(node=socket.gethostname(), reason=reason, since=now_iso(now), by=by or "?")
    with node_lock(jobs_dir):
        before = read(jobs_dir)
        if before is not None and before.reason == reason:
            if not check:  # a node drained before Slurm was: drained there too
                in_slurm(["state=drain", slurm_reason(before)])
            return before, before
        if not check:
            try:
                write_atomic(Path(jobs_dir, DRAINED), (json.dumps(made.to_dict()) + "\n").encode())
            except OSError as error:
                raise DrainError(f"the drain record in {jobs_dir} cannot be written: {error}") from error
    if not check:
        in_slurm(["state=drain", slurm_reason(made)])
    return made, before


def undrain(jobs_dir: str, check: bool = False) -> Drained | None:
    """Undrain this node: the record removed (None: it was not drained, nothing to do)."""
    with node_lock(jobs_dir):
        before = read(jobs_dir)
        if before is not None and not check:
            Path(jobs_dir, DRAINED).unlink(missing_ok=True)
    if before is not None and not check:
        in_slurm(["state=resume"])
    return before


SLURM_CONF = "/etc/slurm/slurm.conf"


def in_slurm(settings: Sequence[str]) -> bool:
    """This node's state in Slurm updated with SETTINGS (``state=drain reason=...``, ``state=resume``);
    whether Slurm took it (False too where the node has no Slurm)."""
    if not Path(SLURM_CONF).is_file():  # no Slurm node (site.yml writes it on every one)
        return False
    return queue.run_slurm(["scontrol", "update", f"nodename={socket.gethostname()}", *settings])


def slurm_reason(record: Drained) -> str:
    """The drain's reason as Slurm keeps it: ours, then who drained it (Slurm records its own time)."""
    return f"reason={record.reason[:200]} (by {record.by})"


def _answer(node: str, now: Drained | None, was: Drained | None, changed: bool) -> dict[str, Any]:
    return {
        "node": node,
        "drained": now.to_dict() if now else None,
        "was": was.to_dict() if was else None,
        "changed": changed,
    }


def command(
    jobs_dir: str,
    action: str,
    reason: str = "",
    by: str = "",
    check: bool = False,
    node: str = "",
    nodes: Sequence[str] = (),
    gate: str = "",
) -> str:
    """The node's shell command (in its container) for ``action``: drain, undrain, show or gate."""
    line = f". {node_jobs.NODE_ENV} && python -m {MODULE} --jobs-dir {shlex.quote(jobs_dir)} --{action}"
    if action == "gate":
        line += f" {shlex.quote(gate)}"
    if action == "drain":
        line += f" --reason {shlex.quote(reason)}"
    if action in ("drain", "gate"):
        line += f" --by {shlex.quote(by)}"
    if node:
        line += f" --node {shlex.quote(node)}"
    if nodes:
        line += f" --nodes {shlex.quote(','.join(nodes))}"
    return line + (" --check" if check else "")


def parse(output: str) -> dict[str, Any] | None:
    """The command's answer (its last JSON line); None when it gave none."""
    return node_jobs.parse(output)


def drain_on(
    mesh: Mesh, node: str, jobs_dir: str, reason: str, by: str, check: bool = False
) -> dict[str, Any]:
    """Drain ``node`` (here when it is the mesh's own node, else over ssh); the command's answer, or
    ``{"node": N, "error": ...}`` when the node did not answer."""
    if node == mesh.me:
        made, before = drain(jobs_dir, reason, by, check)
        return _answer(node, made, before, made != before and not check)
    answer = parse(mesh.run(node, command(jobs_dir, "drain", reason, by, check)))
    if answer is None or not ("drained" in answer or "error" in answer):
        return {"node": node, "error": "it did not answer over the cluster's ssh"}
    return {**answer, "node": node}


def undrain_on(mesh: Mesh, node: str, jobs_dir: str, check: bool = False) -> dict[str, Any]:
    """Undrain ``node`` (as :func:`drain_on`)."""
    if node == mesh.me:
        before = undrain(jobs_dir, check)
        return _answer(node, None, before, before is not None and not check)
    answer = parse(mesh.run(node, command(jobs_dir, "undrain", check=check)))
    if answer is None or not ("drained" in answer or "error" in answer):
        return {"node": node, "error": "it did not answer over the cluster's ssh"}
    return {**answer, "node": node}


def drain_remote(mesh: Mesh, node: str, jobs_dir: str, reason: str, by: str) -> bool:
    """Drain ``node`` with ``reason`` (the supervisor's call: a device fault); whether it is drained now
    (False: it did not answer, or the record could not be written)."""
    try:
        answer = drain_on(mesh, node, jobs_dir, reason, by)
    except DrainError:
        return False
    return not answer.get("error") and answer.get("drained") is not None


def show_on(
    mesh: Mesh, nodes: Sequence[str], jobs_dir: str, pool: ThreadPoolExecutor
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every node's drain record, asked at once: (node -> record, for the drained ones; the nodes that did
    not answer)."""

    def ask(node: str) -> dict[str, Any] | None:
        if node == mesh.me:
            found = read(jobs_dir)
            return {"node": node, "drained": found.to_dict() if found else None}
        return parse(mesh.run(node, command(jobs_dir, "show")))

    drained: dict[str, dict[str, Any]] = {}
    unknown: list[str] = []
    for node, answer in zip(nodes, pool.map(ask, nodes), strict=True):
        if answer is None or "drained" not in answer:
            unknown.append(node)
        elif isinstance(answer["drained"], Mapping):
            drained[node] = Drained.from_dict(answer["drained"], node).to_dict()
    return drained, unknown


def gate_drains(health: Mapping[str, Any]) -> dict[str, str]:
    """The nodes a health gate's verdict names slow, each with the verdict's problem line that names it:
    node -> that line. Nothing when the gate passed, when every row is slow (the whole fabric, or every
    node: no node to single out), for an ``undetermined`` row (a healthy unit between slow ones, or either
    end of a slow link), nor for a slow link between nodes."""
    verdict = health.get("verdict")
    if not isinstance(verdict, Mapping) or verdict.get("passed", True):
        return {}
    rows = [row for row in verdict.get("node_figures") or [] if isinstance(row, Mapping)]
    if not rows or all(row.get("verdict") == "slow" for row in rows):
        return {}
    problems = [str(problem) for problem in verdict.get("problems") or []]
    found: dict[str, str] = {}
    for row in rows:
        if row.get("verdict") != "slow":
            continue
        node = str(row.get("node"))
        named = [
            problem
            for problem in problems
            if problem.startswith(f"node {node} ") and "could not be judged" not in problem
        ]
        found[node] = "; ".join(named) or f"node {node} is slow (device {row.get('device')})"
    return found


def drain_gate(
    mesh: Mesh, job_dir: Path, jobs_dir: str, job_id: str, by: str, check: bool = False
) -> list[str]:
    """After health gate ``job_id`` (its directory ``job_dir`` here, on its first node), drain the nodes its
    verdict names slow (:func:`gate_drains`); one line per node, as the report says it: ``drained: NODE
    (reason)``, or why it could not be."""
    try:
        health = json.loads(Path(job_dir, HEALTH).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []  # no verdict (the gate did not finish): nothing names a node
    lines = []
    for node, problem in gate_drains(health if isinstance(health, Mapping) else {}).items():
        reason = f"health gate {job_id}: {problem}"
        try:
            answer = drain_on(mesh, node, jobs_dir, reason, by, check)
        except DrainError as error:
            answer = {"error": str(error)}
        if answer.get("error"):
            lines.append(f"not drained: {node} ({answer['error']}): {reason}")
        else:
            lines.append(f"{'would drain' if check else 'drained'}: {node} ({reason})")
    return lines


def node_list(text: str) -> list[str]:
    """The nodes of a comma-separated option (``--nodes a,b``), blanks left out."""
    return [node.strip() for node in text.split(",") if node.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs-dir", default="/workspace/jobs", help="the jobs' directory in the node")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--drain", action="store_true", help="drain the node (needs --reason)")
    action.add_argument("--undrain", action="store_true", help="undrain the node")
    action.add_argument("--show", action="store_true", help="say whether the node (--nodes: each) is drained")
    action.add_argument("--gate", default="", help="drain the nodes health gate JOB_ID's verdict names slow")
    parser.add_argument("--reason", default="", help="why the node is drained (required with --drain)")
    parser.add_argument("--by", default="", help="who drains it (the list says)")
    parser.add_argument("--node", default="", help="this node (default) or another, over the mesh's ssh")
    parser.add_argument("--nodes", default="", help="with --show: these nodes, comma-separated, at once")
    parser.add_argument("--check", action="store_true", help="change nothing; say what would change")
    args = parser.parse_args(argv)
    jobs_dir = args.jobs_dir.rstrip("/") or "/"
    me = socket.gethostname()
    mesh = Mesh(me)
    node = args.node or me
    if args.gate and (problem := node_jobs.id_problem(args.gate, "--gate")):
        parser.error(problem)
    try:
        if args.show and args.nodes:
            nodes = node_list(args.nodes)
            with ThreadPoolExecutor(max_workers=min(POOL, max(1, len(nodes)))) as pool:
                drained, unknown = show_on(mesh, nodes, jobs_dir, pool)
            answer: dict[str, Any] = {"drained": drained, "unknown": unknown}
        elif args.show:
            found = read(jobs_dir)
            answer = {"node": me, "drained": found.to_dict() if found else None}
        elif args.gate:
            lines = drain_gate(mesh, Path(jobs_dir, args.gate), jobs_dir, args.gate, args.by, args.check)
            answer = {"lines": lines, "changed": bool(lines) and not args.check}
        elif args.drain:
            answer = drain_on(mesh, node, jobs_dir, args.reason, args.by or "?", args.check)
        else:
            answer = undrain_on(mesh, node, jobs_dir, args.check)
    except DrainError as error:
        print(json.dumps({"node": node, "error": str(error)}))
        return 1
    print(json.dumps(answer))
    return 1 if answer.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
