"""Slurm's side of a job, as the controller sees it: the node selection a request asks for
(``nodelist``, ``exclude``) checked against the cluster before anything is submitted, the ``sbatch`` command
line of a job, and Slurm's queue (``squeue``) read back: each job's state, the reason a pending job waits
(``Resources``, ``Priority``, ...) in words a user acts on, and its place in the queue.

Slurm's hostlist notation (``node[0-3,7],gpu01``) is expanded here as Slurm expands it, so that a node Slurm
names is one the inventory names.

Standard library only.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.job.node_jobs import NODE_ENV

# squeue's fields, in this order, with a separator no field holds: id, name (our job id), state, reason,
# node count, nodes, priority, submit time, user, the node that runs the batch script, comment.
SQUEUE_FORMAT = "%i|%j|%T|%r|%D|%N|%Q|%V|%u|%B|%k"
SQUEUE_FIELDS = 11
# squeue's error for a job id it does not know (ended and purged); the start of its other errors.
UNKNOWN_ID = "Invalid job id specified"
SLURM_ERRORS = ("slurm_load_jobs error", "squeue: error", "squeue: fatal")
# The staged folder of a submitted job on the node that submitted it (<jobs>/.staged/<id>), until Slurm
# starts it; and where Slurm writes its batch script's output on the node that runs it.
STAGED = ".staged"
OUTPUT = "/tmp/ddp-cluster-slurm-%j.out"
# Slurm's reasons for a pending job, as a user reads them (the rest are shown as Slurm gives them).
REASONS = {
    "Resources": "waiting for nodes that other jobs hold",
    "Priority": "waiting behind jobs of higher priority",
    "ReqNodeNotAvail": "a node it asks for (nodelist) is down, drained or reserved",
    "PartitionNodeLimit": "it asks for more nodes than the partition has",
    "PartitionTimeLimit": "its time limit (job_timeout) is over the partition's",
    "BeginTime": "its start time has not come",
    "Dependency": "waiting for the jobs it depends on",
    "JobHeldUser": "held by its user (scontrol release ID)",
    "JobHeldAdmin": "held by an administrator",
    "QOSMaxJobsPerUserLimit": "its QOS allows no more running jobs for this user",
    "None": "about to be scheduled",
}
# A name Slurm and the inventory both take (no brackets, commas or spaces).
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SLURM_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class QueueError(DdpClusterError):
    """A selection or a Slurm answer this module cannot take; the message says what and how to fix it."""


def expand(hostlist: str) -> list[str]:
    """Slurm's hostlist notation expanded, in order: ``node[0-2,5]`` is node0, node1, node2, node5; a range
    keeps its zero padding (``n[08-10]``: n08, n09, n10). QueueError on a list Slurm would not write."""
    names: list[str] = []
    for part in _split(hostlist.strip()):
        found = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", part)
        if not found:
            if "[" in part or "]" in part or not part:
                raise QueueError(f"not a Slurm hostlist: {hostlist!r}")
            names.append(part)
            continue
        prefix, ranges, suffix = found.groups()
        for item in ranges.split(","):
            low, dash, high = item.partition("-")
            if not low.isdigit() or (dash and not high.isdigit()):
                raise QueueError(f"not a Slurm hostlist: {hostlist!r}")
            width = len(low) if low.startswith("0") else 0
            for number in range(int(low), int(high if dash else low) + 1):
                names.append(f"{prefix}{number:0{width}d}{suffix}")
    return names


def _split(text: str) -> list[str]:
    """TEXT split at the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part.strip() for part in parts if part.strip() or len(parts) == 1]


def names(given: str | Sequence[str] | None) -> list[str]:
    """A request's node names (``nodelist``, ``exclude``): comma-separated, a YAML list, or a hostlist."""
    if given is None or given == "":
        return []
    items = [given] if isinstance(given, str) else [str(item) for item in given]
    found: list[str] = []
    for item in items:
        for name in expand(item):
            if name not in found:
                found.append(name)
    return found


@dataclass(frozen=True)
class Selection:
    """The nodes a job may take: NODELIST it must have (all of them), EXCLUDE it must not."""

    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()


def select(
    nodes: int,
    nodelist: str | Sequence[str] | None,
    exclude: str | Sequence[str] | None,
    cluster: Sequence[str],
) -> Selection:
    """The request's selection checked against the CLUSTER's nodes (inventory order) for a job of NODES nodes:
    every problem named at once, with its fix (QueueError), before anything is submitted."""
    wanted, avoided = names(nodelist), names(exclude)
    known = set(cluster)
    problems = []
    for label, listed in (("nodelist", wanted), ("exclude", avoided)):
        unknown = [name for name in listed if name not in known]
        if unknown:
            problems.append(
                f"{label} names {', '.join(unknown)}, which the inventory does not have (its nodes: "
                f"{_short(cluster)})"
            )
    both = [name for name in wanted if name in avoided]
    if both:
        problems.append(f"{', '.join(both)} is in both nodelist and exclude: keep it in one")
    if len(wanted) > nodes:
        problems.append(
            f"nodelist names {len(wanted)} nodes for a job of nodes={nodes}: ask for nodes={len(wanted)}, "
            "or name fewer"
        )
    left = [name for name in cluster if name not in avoided]
    if nodes > len(left):
        problems.append(
            f"nodes={nodes} but the cluster has {len(left)} nodes"
            + (f" once {len(avoided)} are excluded" if avoided else "")
        )
    if problems:
        raise QueueError("; ".join(problems))
    return Selection(tuple(wanted), tuple(avoided))


def _short(items: Sequence[str], most: int = 8) -> str:
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def staged_dir(job_dir: str | Path) -> Path:
    """Where train.yml stages a job's files on the node it submits from, until Slurm starts it there or on
    another node (:mod:`ddp_cluster.supervisor.allocation` moves or copies them into the job's directory)."""
    job = Path(str(job_dir).rstrip("/"))
    return job.parent / STAGED / job.name


# The batch script's word to the supervisor: the node whose staged folder holds the job's files (an
# environment variable, so that the supervisor's command line is the one every check of a running
# supervisor looks for: ``python -m ddp_cluster.supervise --job-dir JOB``).
SUBMITTED_ON = "DDP_SUBMITTED_ON"


def batch_script(job_dir: str, submitted_on: str) -> str:
    """The job's batch script: the supervisor, started in the allocation with the files staged on the node
    SUBMITTED_ON (:data:`SUBMITTED_ON`)."""
    job = shlex.quote(str(job_dir).rstrip("/"))
    return (
        "#!/bin/bash\n"
        "# ddp-cluster: the job's supervisor, in the nodes Slurm gave it\n"
        f". {NODE_ENV}\n"
        f"{SUBMITTED_ON}={shlex.quote(submitted_on)} exec python -m ddp_cluster.supervise --job-dir {job}\n"
    )


def time_limit(seconds: int) -> str:
    """A time limit of SECONDS (0: none) as sbatch's ``--time`` takes it, rounded up to whole minutes
    (Slurm's granularity): ``D-HH:MM:00``, or ``UNLIMITED``."""
    if seconds <= 0:
        return "UNLIMITED"
    minutes = -(-int(seconds) // 60)
    days, minutes = divmod(minutes, 24 * 60)
    return f"{days}-{minutes // 60:02d}:{minutes % 60:02d}:00"


def sbatch_argv(
    job: str,
    nodes: int,
    *,
    timeout_s: int,
    comment: str,
    selection: Selection = Selection(),
    partition: str = "",
    qos: str = "",
    grace_s: int = 60,
    spares: int = 0,
    script: str,
) -> list[str]:
    """sbatch's command line for our job JOB (its Slurm name) on NODES whole nodes: the time limit from
    job_timeout, who submitted it as its comment, USR1 to the batch shell GRACE_S seconds before the limit
    (the supervisor's checkpoint-on-signal), the selection, partition and QOS; up to SPARES nodes more when
    Slurm has them free at the start (``--nodes=MIN-MAX``: a restart's spares, held in the allocation);
    SCRIPT is the batch script's path on the node that submits it. ``--no-kill``: a node lost mid-job does
    not end the allocation (the supervisor restarts the job on the nodes left and its spares);
    ``--no-requeue``: Slurm does not run the batch script again after its node failed (the job's files were
    taken by its first start, and the standby takes the job over)."""
    for label, value in (("partition", partition), ("qos", qos)):
        if value and not SLURM_NAME.match(value):
            raise QueueError(f"{label}={value!r} is not a Slurm name (letters, digits, '_' and '-')")
    if not NAME.match(job):
        raise QueueError(f"job_id={job!r} cannot name a Slurm job")
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={job}",
        f"--nodes={nodes}-{nodes + spares}" if spares > 0 else f"--nodes={nodes}",
        "--exclusive",
        "--no-kill",
        "--no-requeue",
        f"--time={time_limit(timeout_s)}",
        f"--comment={comment}",
        f"--signal=B:USR1@{grace_s}",
        f"--output={OUTPUT}",
    ]
    if selection.nodelist:
        argv.append("--nodelist=" + ",".join(selection.nodelist))
    if selection.exclude:
        argv.append("--exclude=" + ",".join(selection.exclude))
    if partition:
        argv.append(f"--partition={partition}")
    if qos:
        argv.append(f"--qos={qos}")
    return [*argv, script]


@dataclass(frozen=True)
class Entry:
    """One job in Slurm's queue."""

    slurm_id: str
    name: str
    state: str
    reason: str
    nodes: int
    nodelist: tuple[str, ...]
    priority: int
    submitted: str
    user: str
    comment: str
    batch_host: str = ""  # the node that runs the batch script (the job's first node), once it runs

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"

    def waiting(self) -> str:
        """Why a pending job waits, in words (Slurm's reason kept in brackets), '' for another state."""
        if not self.pending:
            return ""
        said = REASONS.get(self.reason.split(",", 1)[0])  # "ReqNodeNotAvail, UnavailableNodes:node3"
        return f"{said} ({self.reason})" if said else self.reason


def parse_squeue(text: str) -> list[Entry]:
    """``squeue -h -o SQUEUE_FORMAT``'s lines (its standard error with them) as entries.

    Slurm's error that it does not know a job id (``squeue -j`` of a job purged from its memory) means no
    entry; any other error of Slurm's is a QueueError (it does not answer). Lines of other users' jobs that
    are none of ours to read are passed over: an array's or a heterogeneous job's id (``123_[1-4]``,
    ``123+0``) and a name or comment holding the separator (ours never do)."""
    found = []
    for line in text.splitlines():
        if not line.strip() or UNKNOWN_ID in line:
            continue
        if line.startswith(SLURM_ERRORS):
            raise QueueError(f"Slurm said: {line.strip()[:300]}")
        fields = line.split("|", SQUEUE_FIELDS - 1)
        if len(fields) != SQUEUE_FIELDS or not fields[0].strip().isdigit() or "|" in fields[-1]:
            continue
        slurm_id, name, state, reason, count, nodelist, priority, submitted, user, batch, comment = fields
        found.append(
            Entry(
                slurm_id.strip(),
                name,
                state,
                reason,
                int(count) if count.isdigit() else 0,
                tuple(expand(nodelist)) if nodelist and nodelist != "(null)" else (),
                int(priority) if priority.isdigit() else 0,
                submitted,
                user,
                "" if comment == "(null)" else comment,
                "" if batch in ("(null)", "n/a") else batch,
            )
        )
    return found


def place(entries: Iterable[Entry], name: str) -> tuple[int, int] | None:
    """Where the pending job NAME stands: (its place, from 1, the pending jobs in all), ordered as Slurm
    considers them (priority, then submit time); None when it is not pending."""
    pending = sorted(
        (e for e in entries if e.pending), key=lambda e: (-e.priority, e.submitted, int(e.slurm_id))
    )
    for index, entry in enumerate(pending):
        if entry.name == name:
            return index + 1, len(pending)
    return None


def by_name(entries: Iterable[Entry]) -> Mapping[str, Entry]:
    """The queue's entries by job name (the newest where a name is queued twice)."""
    found: dict[str, Entry] = {}
    for entry in entries:
        if entry.name not in found or int(entry.slurm_id) > int(found[entry.name].slurm_id):
            found[entry.name] = entry
    return found


def from_dicts(items: Iterable[Mapping[str, object]]) -> list[Entry]:
    """Entries as an action returned them (dataclasses.asdict)."""
    found = []
    for item in items:
        fields: dict[str, Any] = {name: item[name] for name in Entry.__dataclass_fields__ if name in item}
        fields["nodelist"] = tuple(str(node) for node in fields.get("nodelist") or ())
        found.append(Entry(**fields))
    return found


def lines(entries: Sequence[Entry], down: str = "") -> list[str]:
    """Slurm's queue as jobs.yml prints it: each job waiting (its place and why), running (where) or ended
    lately (as Slurm remembers it), with its Slurm id and who submitted it."""
    if down:
        return [f"Slurm's queue: unknown ({down}); `squeue` on a node shows it"]
    if not entries:
        return ["Slurm's queue: empty"]
    rows = [("job", "slurm id", "state", "nodes", "why / where", "submitted by")]
    order = sorted(
        entries, key=lambda entry: (not entry.pending, entry.state != "RUNNING", int(entry.slurm_id))
    )
    for entry in order:
        if entry.pending:
            where = place(entries, entry.name)
            said = (f"{where[0]} of {where[1]}: " if where else "") + entry.waiting()
        else:
            said = f"first node {entry.batch_host}" if entry.batch_host and entry.state == "RUNNING" else ""
        nodes = ",".join(entry.nodelist) if entry.nodelist else str(entry.nodes)
        rows.append((entry.name, entry.slurm_id, entry.state, nodes, said, entry.comment or entry.user))
    widths = [max(len(str(row[index])) for row in rows) for index in range(len(rows[0]))]
    return ["Slurm's queue (pending, running, ended lately):"] + [
        "  " + "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


# Seconds a Slurm command run by a node (scancel, scontrol) gets to answer.
SLURM_COMMAND_TIMEOUT = 10


def run_slurm(argv: Sequence[str], run: Any = None) -> bool:
    """Slurm's command ARGV run here, bounded by SLURM_COMMAND_TIMEOUT; whether Slurm took it (False too
    where it cannot run or does not answer: the callers go on without it)."""
    try:
        done = (run or subprocess.run)(
            list(argv), capture_output=True, timeout=SLURM_COMMAND_TIMEOUT, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(done.returncode == 0)
