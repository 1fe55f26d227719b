"""The cluster's job history, from Slurm's accounting (``sacct``, slurmdbd's database): ``jobs.yml -e
history=true`` lists every job Slurm ran or refused since a time (``-e since=...``, by default the last 7
days), newest first: Slurm's id, the job's name (our job id for a job train.yml submitted), who submitted it
(our ``user@host`` comment, else Slurm's user), its node count and nodes, its state, start and elapsed time.

Standard library only.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.text import visible

# sacct's fields, in this order (-P: separated by '|'); -X: the jobs only, not their steps.
FIELDS = ("JobID", "JobName", "User", "Comment", "NNodes", "NodeList", "State", "Start", "Elapsed")
DEFAULT_SINCE = "now-7days"
# What sacct's -S takes and we pass on: a date, a date and time, or now less some days, hours or minutes.
SINCE = re.compile(r"\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2})?)?|now(-\d+(days|hours|minutes))?")


class HistoryError(DdpClusterError):
    """A history that cannot be asked for as given; the message names the fix."""


@dataclass(frozen=True)
class Accounted:
    """One job in Slurm's accounting."""

    slurm_id: str
    name: str
    user: str
    comment: str
    nodes: str
    nodelist: str
    state: str
    start: str
    elapsed: str

    @property
    def who(self) -> str:
        return self.comment or self.user


def command(since: str = DEFAULT_SINCE) -> str:
    """The node's command: every user's jobs since SINCE, one line each."""
    since = since.strip() or DEFAULT_SINCE
    if not SINCE.fullmatch(since):
        raise HistoryError(
            f"since={since!r} is not a time sacct takes: give a date (2026-12-01), a date and time"
            " (2026-12-01T08:00) or now-Ndays, now-Nhours, now-Nminutes"
        )
    return f"sacct -X -n -P -a -S {shlex.quote(since)} -E now -o {','.join(FIELDS)}"


def parse(text: str) -> list[Accounted]:
    """sacct's lines as jobs; a line of another shape (a name holding '|', an array's or a heterogeneous
    job's id) is passed over."""
    found = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != len(FIELDS) or not fields[0].isdigit():
            continue
        found.append(Accounted(*(field.strip() for field in fields)))
    return found


def lines(jobs: Sequence[Accounted], since: str = DEFAULT_SINCE) -> list[str]:
    """The history as jobs.yml prints it: a header, then one aligned row per job, newest first."""
    if not jobs:
        return [f"Slurm's history since {since}: no job"]
    ordered = sorted(jobs, key=lambda job: (job.start, int(job.slurm_id)), reverse=True)
    rows = [("SLURM ID", "JOB", "SUBMITTED BY", "NODES", "STATE", "START", "ELAPSED")]
    rows += [
        (
            job.slurm_id,
            visible(job.name),
            visible(job.who),
            f"{job.nodes} {visible(job.nodelist)}"
            if job.nodelist not in ("", "None assigned")
            else job.nodes,
            job.state,
            job.start,
            job.elapsed,
        )
        for job in ordered
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    out = [f"Slurm's history since {since} ({len(jobs)} job(s), newest first):"]
    out += [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return out
