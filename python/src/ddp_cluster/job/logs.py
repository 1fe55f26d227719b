"""``ansible-playbook jobs.yml -e logs=ID``: a running job's logs, as the controller asks and shows them.

The controller speaks to one node (the entry node: the inventory's first, or ``-e via=NODE``), in its
container, with one command (:func:`node_command`: ``python -m ddp_cluster.supervisor.logs``, which finds the
job's supervisor through the mesh and reads every rank's log there, each line prefixed ``[NODE rank R]``). Its
answer (:func:`parse_answer`) is the lines, then one JSON line: where each log was read to (its offsets), the
job's state, the node that runs its supervisor, and notes (a log not written yet, a node that did not
answer). ``-e follow=true`` (:func:`show`) asks again and again with those offsets; each ask waits on the
nodes up to :data:`WAIT` seconds for a new line, so a line shows within a poll's round trip of being
written, and the follow ends by itself once the job's status says it ended (after its last lines), or when
the controller is interrupted (the ``interrupted`` check: Ctrl-C), which stops the following, never the job.

The request's values are checked here, before anything runs (:meth:`LogsRequest.from_vars`); those that
need the job (a rank below its world size, a node of its nodes) on the node, against its job.json
(:func:`check_selection`).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.job import node_jobs
from ddp_cluster.job.transport import Transport, Unreachable, in_container
from ddp_cluster.text import visible

MODULE = "ddp_cluster.supervisor.logs"
TAIL = 20
# Seconds one ask of a follow waits on the nodes for a new line before it answers with none: a Ctrl-C is
# seen within that, and an idle follow costs one command per WAIT.
WAIT = 3.0
TRUE = ("true", "yes", "on", "1")
FALSE = ("false", "no", "off", "0", "")


class LogsError(DdpClusterError, ValueError):
    """A logs request that cannot be answered as asked; the message names the value and what it may be."""


def _whole(name: str, value: Any, minimum: int) -> int:
    """A whole number of at least ``minimum`` from an extra variable (``-e tail=5`` gives the text '5')."""
    text = str(value).strip()
    if isinstance(value, bool) or not (isinstance(value, int) or text.isdigit()) or int(text) < minimum:
        least = "a positive whole number" if minimum > 0 else "a whole number of 0 or more"
        raise LogsError(f"{name}={value!r} must be {least}")
    return int(text)


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE or text in FALSE:
        return text in TRUE
    raise LogsError(f"{name}={value!r} must be true or false")


@dataclass(frozen=True)
class LogsRequest:
    """What ``jobs.yml -e logs=ID`` asks: the job, how many of each log's last lines, one rank's or one
    node's only, whether to follow, and the entry node ('' : the inventory's first)."""

    job: str
    tail: int = TAIL
    rank: int | None = None
    node: str = ""
    follow: bool = False
    via: str = ""

    @classmethod
    def from_vars(
        cls,
        job: Any,
        tail: Any = None,
        rank: Any = None,
        node: Any = None,
        follow: Any = None,
        via: Any = None,
        nodes: Sequence[str] = (),
    ) -> LogsRequest:
        """The request of the playbook's variables (None or '': not given); ``nodes``: the inventory's, which
        ``via`` must be one of. LogsError naming the first value that is wrong."""
        job_id = str(job or "").strip()
        if not node_jobs.JOB_ID.fullmatch(job_id):
            raise LogsError(
                f"logs={job!r} is not a job id (letters, digits, '.', '_', '-'):"
                " jobs.yml lists the cluster's jobs"
            )
        via_node = str(via).strip() if _given(via) else ""
        if via_node and nodes and via_node not in nodes:
            raise LogsError(f"via={via_node} is not a node of the inventory ({', '.join(nodes)})")
        both = _given(rank) and _given(node)
        if both:
            raise LogsError(f"rank={rank} and node={node}: give one of them (a rank runs on one node)")
        return cls(
            job=job_id,
            tail=_whole("tail", tail, 1) if _given(tail) else TAIL,
            rank=_whole("rank", rank, 0) if _given(rank) else None,
            node=str(node).strip() if _given(node) else "",
            follow=_flag("follow", follow) if _given(follow) else False,
            via=via_node,
        )


def _given(value: Any) -> bool:
    """An extra variable that was given: not None, not '' (jobs.yml passes '' for what the user left out)."""
    return value is not None and str(value).strip() != ""


def check_selection(job: str, rank: int | None, node: str, world_size: int, nodes: Sequence[str]) -> None:
    """LogsError when ``rank`` is not one of the job's ranks or ``node`` not one of its nodes (now: after a
    restart, the nodes it runs on)."""
    if rank is not None and not 0 <= rank < world_size:
        raise LogsError(f"rank={rank}: job {job} has ranks 0 to {world_size - 1}")
    if node and node not in nodes:
        raise LogsError(f"node={node} is not one of job {job}'s nodes ({', '.join(nodes)})")


def node_command(
    request: LogsRequest,
    jobs_dir: str,
    offsets: Mapping[str, Any] | None = None,
    wait: float = 0.0,
    first: str = "",
    nodes: Sequence[str] = (),
) -> str:
    """The entry node's shell command (in its container): the last lines, or with ``offsets`` what came
    after them (waiting up to ``wait`` seconds for it); ``first``: the node that runs the job's supervisor
    when an earlier answer said; ``nodes``: the cluster's, asked where the job is otherwise."""
    argv = ["python", "-m", MODULE, request.job, "--jobs-dir", jobs_dir, "--tail", str(request.tail)]
    if request.rank is not None:
        argv += ["--rank", str(request.rank)]
    if request.node:
        argv += ["--node", request.node]
    if offsets is not None:
        argv += ["--follow-from", json.dumps(offsets, separators=(",", ":"), sort_keys=True)]
    if wait > 0:
        argv += ["--wait", f"{wait:g}"]
    if first:
        argv += ["--first", first]
    if nodes:
        argv += ["--nodes", ",".join(nodes)]
    return f". {node_jobs.NODE_ENV} && " + " ".join(shlex.quote(arg) for arg in argv)


@dataclass
class Answer:
    """One answer of the node: the prefixed lines; where each log was read to; the job's state and whether
    it ended; the node that runs its supervisor; notes for the user (a log not written yet, a node that did
    not answer)."""

    lines: list[str] = field(default_factory=list)
    offsets: dict[str, Any] = field(default_factory=dict)
    state: str = ""
    done: bool = False
    first: str = ""
    notes: list[str] = field(default_factory=list)


def parse_answer(output: str) -> Answer:
    """The node's answer: every line but the last is a log's (prefixed), the last the JSON summary.
    LogsError when there is no summary (the command did not finish)."""
    lines = output.split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    summary: Any = None
    if lines and lines[-1].startswith("{"):
        try:
            summary = json.loads(lines[-1])
        except ValueError:
            summary = None
    if not isinstance(summary, dict):
        said = visible(lines[-1][:200], newlines=False) if lines else "no output"
        raise LogsError(f"the node's logs command gave no summary (its last line: {said})")
    offsets = summary.get("offsets")
    notes = summary.get("notes")
    return Answer(
        lines=lines[:-1],
        offsets=dict(offsets) if isinstance(offsets, dict) else {},
        state=str(summary.get("state") or ""),
        done=bool(summary.get("done")),
        first=str(summary.get("first") or ""),
        notes=[str(note) for note in notes] if isinstance(notes, list) else [],
    )


def ask(
    transport: Transport,
    container: str,
    request: LogsRequest,
    jobs_dir: str,
    offsets: Mapping[str, Any] | None = None,
    wait: float = 0.0,
    first: str = "",
    nodes: Sequence[str] = (),
) -> Answer:
    """One ask of the entry node through ``transport``; LogsError with the node's own words when it failed."""
    command = node_command(request, jobs_dir, offsets, wait, first, nodes)
    try:
        done = transport.run(in_container(container, command, shell="/bin/bash"))
    except Unreachable as error:
        raise LogsError(
            f"the entry node {container} does not answer ({error}):"
            " -e via=NODE reads the logs through another node"
        ) from error
    if done.rc != 0:
        raise LogsError(f"{container}: {visible(done.said(400))}")
    return parse_answer(done.stdout)


def show(
    transport: Transport,
    container: str,
    request: LogsRequest,
    jobs_dir: str,
    say: Callable[[str], None],
    interrupted: Callable[[], bool] = lambda: False,
    nodes: Sequence[str] = (),
    wait: float = WAIT,
) -> dict[str, Any]:
    """The last lines of the job's logs, said as they come; with ``request.follow`` the lines after them
    until the job ends or ``interrupted()``. The action's result: the job, its state, the node running its
    supervisor, how many lines were said and why the follow ended ('ended', 'interrupted' or '')."""
    started = time.monotonic()
    notes: list[str] = []
    answer = ask(transport, container, request, jobs_dir, nodes=nodes)
    said = _say(answer, say, notes)
    offsets, first, stopped = answer.offsets, answer.first, ""
    while request.follow and not answer.done:
        if interrupted():
            stopped = "interrupted"
            say(f"job {request.job}: stopped following (Ctrl-C); the job goes on (jobs.yml lists it)")
            break
        try:
            answer = ask(transport, container, request, jobs_dir, offsets, wait, first, nodes)
        except LogsError:
            # the node that ran the supervisor may be lost (another took the job over): find it again
            answer = ask(transport, container, request, jobs_dir, offsets, wait, "", nodes)
        said += _say(answer, say, notes)
        offsets, first = {**offsets, **answer.offsets}, answer.first or first
    if request.follow and answer.done:
        stopped = "ended"
        say(f"job {request.job} {answer.state}: nothing more to follow")
    return {
        "changed": False,
        "job": request.job,
        "state": answer.state,
        "first": first,
        "lines": said,
        "stopped": stopped,
        "seconds": round(time.monotonic() - started, 2),
    }


def _say(answer: Answer, say: Callable[[str], None], seen: list[str]) -> int:
    """Say the answer's lines, and each note once (a follow's asks repeat them); how many lines. Each shown,
    never obeyed (:func:`ddp_cluster.text.visible`): a rank's escape sequences reach no terminal, and a
    carriage return in a line cannot write over its ``[NODE rank R]`` prefix."""
    for line in answer.lines:
        say(visible(line, newlines=False))
    for note in answer.notes:
        if note not in seen:
            seen.append(note)
            say(visible(note, newlines=False))
    return len(answer.lines)
