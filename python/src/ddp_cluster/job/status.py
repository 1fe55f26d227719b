"""A job's status, typed: :class:`Status`, what the supervisor writes to ``JOB/status.json`` as the job goes.

One writer (:mod:`ddp_cluster.supervisor.loop`, rewriting the file whole and atomically at every change) and
every reader through :func:`read` / :meth:`Status.from_dict`: the controller's wait
(:mod:`ddp_cluster.job.control`), ``jobs.yml`` (:mod:`ddp_cluster.supervisor.jobs`), the report
(:mod:`ddp_cluster.job.report`), the doctor and the results' layout. A lost node is a field (``lost_nodes``),
never a sentence to search.

Standard library only: it runs in the node image's Python and on the controller.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.text import visible

FILE = "status.json"
# The most of a status.json that is read: a supervisor's is a few KiB (a log tail of 20 lines); a larger file
# is something else's (the job's directory is the job's to write), named, never read whole.
MAX_BYTES = 4 * 1024 * 1024
# The most of a wrong value an error quotes (a field of megabytes is named, not printed).
QUOTED = 120
STATES = ("starting", "running", "succeeded", "failed")
# Each field's type, checked when a file is read (one edited by hand is refused naming the field).
_KINDS: dict[str, tuple[type, ...]] = {
    "state": (str,),
    "elapsed": (int, float),
    "updated": (int, float),
    "pid": (int,),
    "rc": (int,),
    "reason": (str,),
    "failed_node": (str,),
    "failed_rank": (int,),
    "exit_code": (int,),
    "signal": (int,),
    "signal_name": (str,),
    "log_file": (str,),
    "ranks_running": (bool,),
    "max_restarts": (int,),
    "interrupted": (str,),
    "supervisor_node": (str,),
    "start_id": (str,),
    "standby": (str,),
    "stalled": (dict,),
    "checkpoint_steps": (dict,),
}
LISTS = ("nodes", "launcher", "lost_nodes", "log_tail", "launcher_tail", "ran_on")
NUMBER = (int, float)
# The fields of each list of records, by type: ``list`` is a list of strings; every field may be None (not
# known yet). A field not listed is kept as it is (a newer supervisor's).
RECORDS: dict[str, dict[str, tuple[type, ...]]] = {
    # ddp_cluster.supervisor.recovery.recover's, one per restart
    "restarts": {
        "restart": (int,),
        "cause": (str,),
        "lost": (list,),
        "nodes_before": (list,),
        "nodes_after": (list,),
        "spares_taken": (list,),
        "drained": (list,),
        "lost_at": NUMBER,
        "restarted_at": NUMBER,
        "training_again_s": NUMBER,
        "checkpoint": (str,),
        "resume_step": (int,),
        "last_step": (int,),
        "steps_redone": (int,),
        "checkpoints_skipped": (list,),
        "supervisor_moved": (str,),
    },
    # ddp_cluster.supervisor.replicas.Place.summary's, one per place copies go
    "replicas": {
        "place": (str,),
        "kind": (str,),
        "checkpoint": (str,),
        "bytes": (int,),
        "seconds": NUMBER,
        "at": NUMBER,
        "copying": (str,),
        "failures": (int,),
        "error": (str,),
        "lost": (bool,),
    },
}


class StatusError(DdpClusterError):
    """A status.json that cannot be read as a :class:`Status`; the message names the field, its value and
    the type it must have."""


class TornStatus(StatusError):
    """A status.json that is no JSON (yet): a partial read, a file cut short; the next read may be whole."""


def _quoted(value: Any) -> str:
    said = repr(value)
    return said if len(said) <= QUOTED else f"{said[:QUOTED]}... ({len(said)} characters)"


def _kinds(kinds: tuple[type, ...]) -> str:
    return " or ".join("list of strings" if kind is list else kind.__name__ for kind in kinds)


def _fits(value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in kinds:
        return False  # True is an int to Python, not to a status
    if list in kinds and isinstance(value, list | tuple):
        return all(isinstance(item, str) for item in value)
    return isinstance(value, tuple(kind for kind in kinds if kind is not list))


def _records(name: str, value: Any) -> tuple[dict[str, Any], ...]:
    """A list of records (:data:`RECORDS`), each field checked by type."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise StatusError(f"{name}={_quoted(value)} must be a list of records")
    records = []
    for index, record in enumerate(value):
        if not isinstance(record, Mapping):
            raise StatusError(f"{name}[{index}]={_quoted(record)} must be a record (a mapping of fields)")
        for field_name, kinds in RECORDS[name].items():
            item = record.get(field_name)
            if item is not None and not _fits(item, kinds):
                raise StatusError(f"{name}[{index}].{field_name}={_quoted(item)} must be {_kinds(kinds)}")
        records.append(dict(record))
    return tuple(records)


@dataclass(frozen=True)
class Status:
    """Where a job is: its state and progress; once it failed, why, where, and what was left running."""

    state: str = "starting"
    elapsed: float = 0.0  # seconds since the supervisor started
    updated: float = 0.0  # when this was written (epoch seconds)
    progress: Any = None  # the last metrics.jsonl record (a mapping), or the last log line, or None
    pid: int | None = None  # the supervisor's
    nodes: tuple[str, ...] = ()
    launcher: tuple[str, ...] = ()  # the launcher's argv
    rc: int | None = None  # the launcher's exit status
    reason: str = ""  # why it failed, a sentence for people
    lost_nodes: tuple[str, ...] = ()  # the nodes that stopped answering (their container or server is down)
    failed_node: str | None = None  # the node of the first failing rank (or the lost node)
    failed_rank: int | None = None  # the first failing rank, when known
    exit_code: int | None = None
    signal: int | None = None
    signal_name: str | None = None
    log_file: str = ""  # NODE:PATH of the log whose tail is log_tail
    log_tail: tuple[str, ...] = ()
    launcher_tail: tuple[str, ...] = ()
    leftover: Mapping[str, str] = field(
        default_factory=dict
    )  # node -> the job's processes still there after the stop
    ranks_running: bool = False  # every node runs its ranks (this attempt); what detach waits for
    ran_on: tuple[str, ...] = ()  # every node that ran the job, in any attempt (results come from each)
    max_restarts: int = 0
    # One record per restart (see ddp_cluster.supervisor.recovery.recover): restart, cause, lost,
    # nodes_before, nodes_after, spares_taken, lost_at, restarted_at, training_again_s, checkpoint,
    # resume_step, last_step, steps_redone.
    restarts: tuple[Mapping[str, Any], ...] = ()
    interrupted: str = ""  # who stopped the job from the controller (Ctrl-C, jobs.yml -e stop=ID), if any
    # Where the supervisor runs (the first node, or the node that took the job over when the first was lost),
    # and its standby (the node that takes over then); this start's own mark (JobSpec.start_id).
    supervisor_node: str = ""
    standby: str = ""
    start_id: str = ""
    # After a stall: which ranks were outside a collective, where the stacks are (supervisor.stall.capture).
    stalled: Mapping[str, Any] = field(default_factory=dict)
    # The checkpoint copies made off the first node (supervisor.replicas): one record per place; and the step
    # of each of rank 0's newest checkpoints (an epoch's checkpoint names no step: a node that takes the job
    # over, without the first node's metrics.jsonl, reads it here).
    replicas: tuple[Mapping[str, Any], ...] = ()
    checkpoint_steps: Mapping[str, int] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed")

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"

    def update(self, **fields: Any) -> Status:
        """This status with ``fields`` replaced (checked as :meth:`from_dict` checks them)."""
        return Status.from_dict({**self.to_dict(), **fields})

    # --- the file ----------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Status:
        """The status of ``data``; fields it does not know are ignored, a known field of the wrong type is a
        StatusError naming it."""
        if not isinstance(data, Mapping):
            raise StatusError(f"a status is a mapping of fields, not {type(data).__name__}")
        values: dict[str, Any] = {}
        for name in (item.name for item in dataclasses.fields(cls)):
            if name not in data or data[name] is None:
                continue
            value = data[name]
            if name in _KINDS and not _fits(value, _KINDS[name]):
                raise StatusError(f"{name}={_quoted(value)} must be {_kinds(_KINDS[name])}")
            if name in LISTS:
                if isinstance(value, str) or not isinstance(value, list | tuple):
                    raise StatusError(f"{name}={_quoted(value)} must be a list of strings")
                value = tuple(str(item) for item in value)
            elif name == "leftover":
                if not isinstance(value, Mapping):
                    raise StatusError(f"leftover={_quoted(value)} must map nodes to text")
                value = {str(node): str(text) for node, text in value.items()}
            elif name in RECORDS:
                value = _records(name, value)
            elif name == "checkpoint_steps":
                for checkpoint, step in value.items():
                    if not _fits(step, (int,)):
                        raise StatusError(
                            f"checkpoint_steps[{_quoted(checkpoint)}]={_quoted(step)} must be int"
                        )
            values[name] = value
        status = cls(**values)
        if status.state not in STATES:
            raise StatusError(f"state={_quoted(status.state)} is unknown: one of {', '.join(STATES)}")
        return status

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["leftover"] = dict(self.leftover)
        for name in LISTS:
            data[name] = list(data[name])
        data["restarts"] = [dict(item) for item in self.restarts]
        data["replicas"] = [dict(item) for item in self.replicas]
        data["stalled"] = dict(self.stalled)
        data["checkpoint_steps"] = dict(self.checkpoint_steps)
        return data

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"


def describe_restart(record: Mapping[str, Any]) -> str:
    """One line of a restart record, as the wait, the report and jobs.yml print it: shown, never obeyed
    (:func:`ddp_cluster.text.visible`: the job's directory, where the status is, is the job's to write)."""
    lost = ", ".join(record.get("lost") or []) or "no node"
    after = ", ".join(record.get("nodes_after") or [])
    spares = record.get("spares_taken") or []
    line = f"restart {record.get('restart')}: {record.get('cause')}; lost {lost}; on {after}" + (
        f" (spare {', '.join(spares)} taken)" if spares else ""
    )
    if record.get("drained"):
        line += f" (drained {', '.join(record['drained'])})"
    if record.get("checkpoint"):
        line += f", resumed from {record['checkpoint']} (step {record.get('resume_step')})"
    if record.get("steps_redone") is not None:
        line += f", {record['steps_redone']} step(s) redone"
    if record.get("training_again_s") is not None:
        line += f", training again {record['training_again_s']:.1f} s after the loss"
    return visible(line, newlines=False)


def loads(text: str) -> Status:
    """The status ``text`` holds: TornStatus when it is no JSON, StatusError when a field (or a record's)
    has the wrong type, naming it, or when it nests too deeply to be read."""
    try:
        data = json.loads(text)
    except ValueError as error:
        raise TornStatus(f"not JSON: {error}") from error
    except RecursionError:
        raise StatusError("its JSON nests deeper than any status: not read") from None
    return Status.from_dict(data)


def parse(data: bytes) -> Status:
    """The status the bytes of a status.json hold (:func:`loads`); StatusError, naming what is wrong, when
    they are more than :data:`MAX_BYTES` (only that much is read: give MAX_BYTES + 1) or no UTF-8."""
    if len(data) > MAX_BYTES:
        raise StatusError(f"it is larger than {MAX_BYTES // 2**20} MiB, which no status is: not read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise StatusError(
            f"it is not UTF-8: byte 0x{data[error.start]:02x} at offset {error.start}"
        ) from None
    return loads(text)


def unreadable(where: object, error: StatusError) -> str:
    """What the wait, the report and jobs.yml say of a status file whose JSON is no status."""
    return (
        f"{where} is not a status the job's supervisor wrote ({error}): something else wrote it (the job's"
        " code, a hand, another version of ddp_cluster)"
    )


def read_checked(path: Path, settled: bool = False) -> tuple[Status | None, str]:
    """The status in ``path`` and '' (None and '': none yet, or a torn copy); None and what is wrong
    (:func:`unreadable`) when it holds JSON that is no status, bytes that are no UTF-8, or more bytes than
    any status. ``settled``: the file is written no more (a run's, after the job), so one that is no JSON is
    no torn copy either, and is named too. Never an exception: whatever wrote the file."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError:
        return None, ""
    try:
        return parse(data), ""
    except TornStatus as error:
        return None, unreadable(path, error) if settled else ""
    except StatusError as error:
        return None, unreadable(path, error)


def read(path: Path) -> Status | None:
    """The status in ``path``; None when there is none (yet) or it cannot be read (:func:`read_checked`
    says why)."""
    return read_checked(path)[0]


def describe_progress(progress: Any) -> str:
    """One line of the latest progress (the wait prints it whenever it changes), shown, never obeyed (it may
    be a rank's last log line: :func:`ddp_cluster.text.visible`)."""
    return visible(_progress(progress)[:300], newlines=False)


def _progress(progress: Any) -> str:
    if isinstance(progress, Mapping):
        keys = ("epoch", "step", "loss", "test_accuracy", "samples_per_s")
        parts = [
            f"{key} {progress[key]:.4g}" if isinstance(progress[key], float) else f"{key} {progress[key]}"
            for key in keys
            if progress.get(key) is not None
        ]
        return ", ".join(parts) or json.dumps(dict(progress))[:200]
    return str(progress)[:200] if progress else "starting"
