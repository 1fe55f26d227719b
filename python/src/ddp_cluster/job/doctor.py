"""Why a job failed, read from its logs: ``ddp-cluster doctor RUN_DIR``.

Reads every log under a results directory (``runs/<job-id>/`` as train.yml lays it out: the ranks' logs, the
launcher's and the supervisor's, CANN's plogs, ``status.json``, and the job's own ``output/``) and matches the
messages that the tools of this field print for the failures users ask about most: HCCL's error codes, NCCL
and gloo timeouts, ssh and mpirun start-up failures in containers, a rank killed for memory, a package that
does not import, a node that went down. Each cause comes with its evidence (file and line) and the fix, most
likely first: a cause that makes the other ranks fail (a rank that died, a node gone) ranks above the timeouts
its peers then report. The rules are data (``doctor_rules.json`` beside this module: pattern, cause, fix,
weight, the vendor document each comes from and a real-looking line it must name): a new rule is a JSON entry.

The logs are the job's bytes: each file is read a line at a time (at most :data:`MAX_FILE_BYTES` of it, a
line's first :data:`MAX_READ_LINE` bytes), and what the doctor quotes of them (the evidence, a node or module
it names, a file's name) is shown, never obeyed (:func:`ddp_cluster.text.visible`).

Exit status: 0 when nothing was found to report, 1 when a cause is named, 2 when RUN_DIR cannot be read.
Standard library only (the controller runs it without torch).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import textwrap
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddp_cluster import text
from ddp_cluster.job.status import read as read_status

# Files that are never logs, and the most of one file that is read (a plog rotates at about 20 MB).
# Sources a job shipped (-e script, -e workdir) are not logs: a comment can quote any message.
SKIPPED_SUFFIXES = (
    ".ckpt",
    ".pt",
    ".pth",
    ".png",
    ".gz",
    ".tar",
    ".npy",
    ".npz",
    ".so",
    ".py",
    ".pyc",
    ".ipynb",
)
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_LINE_CHARS = 300
# The most of one line that is matched (every message the signatures know is far shorter; a line longer is
# a progress bar's or a dump's, its rest skipped, never held).
MAX_READ_LINE = 64 * 1024
# A file with a NUL among its first bytes is no log (a binary the job left).
BINARY_PROBE = 4096


@dataclass(frozen=True)
class Signature:
    """A failure's message text, what it means and what to do. ``weight``: how likely it is the root cause
    when several signatures match (a rank that died makes its peers time out, not the other way round)."""

    id: str
    pattern: re.Pattern[str]
    cause: str
    fix: str
    weight: int
    restartable: bool = False  # a restart may cure it (a peer vanished, a collective or the store timed out)


# The rule base, kept as data: one rule per known failure (id, pattern, cause, fix, weight, the vendor's
# document it comes from, and a real-looking line it must name). {name} in the cause and fix is the pattern's
# group of that name.
RULES_FILE = Path(__file__).with_name("doctor_rules.json")
RULE_FIELDS = ("id", "weight", "pattern", "cause", "fix", "reference", "example")  # and "restartable" (false)


def load_rules(path: Path = RULES_FILE) -> tuple[Signature, ...]:
    """The rules of PATH as signatures, most likely cause first; ValueError naming a malformed rule."""
    rules = json.loads(path.read_text(encoding="utf-8"))["rules"]
    found = []
    for index, rule in enumerate(rules):
        missing = [name for name in RULE_FIELDS if name not in rule]
        if missing:
            raise ValueError(f"{path}: rule {index} ({rule.get('id', '?')}) lacks {', '.join(missing)}")
        found.append(
            Signature(
                str(rule["id"]),
                re.compile(str(rule["pattern"]), re.IGNORECASE),
                str(rule["cause"]),
                str(rule["fix"]),
                int(rule["weight"]),
                bool(rule.get("restartable", False)),
            )
        )
    return tuple(sorted(found, key=lambda signature: -signature.weight))


SIGNATURES: tuple[Signature, ...] = load_rules()

# When a line was written, as the tools of the field stamp it: an ISO-like date and time (Python's logging,
# torchelastic's "2026-11-20_10:00:05"), CANN's plog and HCCL's "2026-11-20-10:00:05.001.054", and glog's
# "E1120 10:00:05.123456" (torch's c10d: month and day, no year). A line without a stamp takes the last one
# before it in its file (a traceback follows its logged line).
STAMPS = (
    re.compile(
        r"(?<![0-9])(?P<year>20[0-9]{2})-(?P<month>[01][0-9])-(?P<day>[0-3][0-9])[-_T ]"
        r"(?P<hour>[0-2][0-9]):(?P<minute>[0-5][0-9]):(?P<second>[0-6][0-9])(?:[.,](?P<fraction>[0-9]{1,9}))?"
    ),
    re.compile(
        r"(?:^|[\[:\s])[IWEF](?P<month>[01][0-9])(?P<day>[0-3][0-9])"
        r" (?P<hour>[0-2][0-9]):(?P<minute>[0-5][0-9]):(?P<second>[0-6][0-9])(?:[.](?P<fraction>[0-9]{1,9}))?"
    ),
)


def stamp(line: str, year: int) -> datetime.datetime | None:
    """When ``line`` says it was written (``year`` where its stamp has none), or None."""
    for pattern in STAMPS:
        match = pattern.search(line)
        if match is None:
            continue
        parts = match.groupdict()
        fraction = (parts["fraction"] or "0")[:6].ljust(6, "0")
        try:
            return datetime.datetime(
                int(parts.get("year") or year),
                int(parts["month"]),
                int(parts["day"]),
                int(parts["hour"]),
                int(parts["minute"]),
                min(59, int(parts["second"])),
                int(fraction),
            )
        except ValueError:
            continue
    return None


@dataclass(frozen=True)
class Evidence:
    path: str
    line: int
    text: str
    when: datetime.datetime | None = None  # the line's own stamp, or the last one before it in its file

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


@dataclass
class Finding:
    signature: Signature
    cause: str
    fix: str
    evidence: list[Evidence] = field(default_factory=list)

    @property
    def first(self) -> Evidence | None:
        """Its earliest stamped evidence (None when no line of it says when)."""
        stamped = [item for item in self.evidence if item.when is not None]
        return min(stamped, key=lambda item: (item.when, item.path, item.line)) if stamped else None

    def as_dict(self) -> dict[str, object]:
        first = self.first
        return {
            "id": self.signature.id,
            "cause": self.cause,
            "fix": self.fix,
            "first_seen": first.when.isoformat() if first and first.when else None,
            "evidence": [
                {
                    "path": e.path,
                    "line": e.line,
                    "text": e.text,
                    "when": e.when.isoformat() if e.when else None,
                }
                for e in self.evidence
            ],
        }


@dataclass
class Timeline:
    """The failure first in time among the findings whose lines say when, and the others after it."""

    first: Finding
    after: list[tuple[Finding, float]]  # each later finding, seconds after the first

    def describe(self, findings: Sequence[Finding]) -> list[str]:
        number = {id(finding): index for index, finding in enumerate(findings, start=1)}
        first = self.first.first
        assert first is not None and first.when is not None
        lines = [
            f"first in time: #{number[id(self.first)]} {self.first.signature.id}, at"
            f" {first.when.isoformat(sep=' ', timespec='seconds')} ({first.path}:{first.line})"
        ]
        if self.after:
            following = ", ".join(
                f"#{number[id(finding)]} {finding.signature.id} (+{seconds:.0f} s)"
                for finding, seconds in self.after
            )
            lines.append(f"after it, and likely following from it: {following}")
        return lines


def timeline(findings: Sequence[Finding]) -> Timeline | None:
    """The order in time of the findings whose evidence is stamped; None when fewer than two are."""
    stamped: list[tuple[datetime.datetime, Finding]] = []
    for finding in findings:
        if (seen := finding.first) is not None and seen.when is not None:
            stamped.append((seen.when, finding))
    if len(stamped) < 2:
        return None
    stamped.sort(key=lambda pair: (pair[0], -pair[1].signature.weight))
    (start, first), rest = stamped[0], stamped[1:]
    after = [(finding, (when - start).total_seconds()) for when, finding in rest]
    return Timeline(first, after)


def log_files(run_dir: Path) -> Iterator[Path]:
    """Every file that may hold a log, in a stable order; checkpoints, images and archives are skipped, and so
    is a health gate's run before the job (``preflight/``: it passed, or the job would not have started)."""
    for path in sorted(run_dir.rglob("*")):
        parts = path.relative_to(run_dir).parts
        skipped = ".incoming" in parts or parts[0] == "preflight"
        # never through a link: a job's link would show what it points at
        if (
            path.is_file()
            and not path.is_symlink()
            and not path.name.endswith(SKIPPED_SUFFIXES)
            and not skipped
        ):
            yield path


def read_lines(path: Path) -> Iterator[str]:
    """The lines of a log, read a line at a time (see the module's text); none of a binary file's."""
    with path.open("rb") as handle:
        if b"\0" in handle.peek(BINARY_PROBE)[:BINARY_PROBE]:
            return
        for line in text.lines(handle, MAX_READ_LINE, MAX_FILE_BYTES):
            yield line.data.decode("utf-8", errors="replace").rstrip("\r")


def status_lines(path: Path) -> list[str]:
    """status.json as lines to match: its reason and exit status (its log tail repeats the ranks' logs)."""
    status = read_status(path)
    if status is None:
        return []
    lines = [f"reason: {status.reason}"]
    rank, node, code = status.failed_rank, status.failed_node, status.exit_code
    if status.signal == 9 or code == 137:
        lines.append(f'"signal": 9 (rank {rank} on node {node})')
    elif rank is not None and code is not None and code != 0:
        lines.append(f"rank {rank} on node {node} exited with code {code} first")
    return lines


def match_lines(
    relative: str, lines: Iterable[str], found: dict[str, Finding], year: int | None = None
) -> None:
    year = year or datetime.date.today().year
    when: datetime.datetime | None = None
    for number, line in enumerate(lines, start=1):
        when = stamp(line, year) or when
        for signature in SIGNATURES:
            match = signature.pattern.search(line)
            if match is None:
                continue
            # what the log says is quoted, shown never obeyed (its own control characters written out)
            values = {
                name: text.visible(value[:MAX_LINE_CHARS], newlines=False) if value else "?"
                for name, value in match.groupdict().items()
            }
            cause = signature.cause.format(**values)
            key = f"{signature.id}:{cause}"
            finding = found.setdefault(key, Finding(signature, cause, signature.fix.format(**values)))
            quoted = text.visible(line.strip()[:MAX_LINE_CHARS], newlines=False)
            finding.evidence.append(Evidence(text.visible(relative, newlines=False), number, quoted, when))


def diagnose(run_dir: Path) -> list[Finding]:
    """Every cause found under run_dir, most likely first (then the one seen first in time, then the one
    with more evidence)."""
    found: dict[str, Finding] = {}
    for path in log_files(run_dir):
        relative = str(path.relative_to(run_dir))
        lines = status_lines(path) if path.name == "status.json" else read_lines(path)
        # a stamp without its year (glog's) is of the year the file was last written
        year = datetime.date.fromtimestamp(path.stat().st_mtime).year
        match_lines(relative, lines, found, year)
    latest = datetime.datetime.max

    def order(finding: Finding) -> tuple[int, datetime.datetime, int, str]:
        first = finding.first
        return (
            -finding.signature.weight,
            first.when if first and first.when else latest,
            -len(finding.evidence),
            finding.cause,
        )

    return sorted(found.values(), key=order)


def render(run_dir: Path, findings: Sequence[Finding], width: int = 120) -> str:
    if not findings:
        return f"ddp-cluster doctor: {run_dir}: no known failure found in its logs"
    head = f"ddp-cluster doctor: {run_dir}: {len(findings)} likely cause(s), most likely first"
    if order := timeline(findings):
        head += "\n" + "\n".join(order.describe(findings))
    columns = (("#", 2), ("cause", 40), ("evidence (file:line)", 42), ("fix", max(30, width - 90)))
    rows = [tuple(name for name, _ in columns)]
    for index, finding in enumerate(findings, start=1):
        more = len(finding.evidence) - 1
        evidence = textwrap.shorten(str(finding.evidence[0]), 160, placeholder=" ...")
        evidence += f" (and {more} more)" if more else ""
        rows.append((str(index), finding.cause, evidence, finding.fix))
    out = [head, ""]
    for row in rows:
        cells = [
            textwrap.wrap(text, w, break_on_hyphens=False) or [""]
            for text, (_, w) in zip(row, columns, strict=True)
        ]
        for depth in range(max(len(cell) for cell in cells)):
            parts = [
                (cell[depth] if depth < len(cell) else "").ljust(w)
                for cell, (_, w) in zip(cells, columns, strict=True)
            ]
            out.append("  ".join(parts).rstrip())
        out.append("")
    return "\n".join(out).rstrip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ddp-cluster doctor",
        description="Name the likely cause of a failed job from its logs (exit 1 when one is named, else 0).",
    )
    parser.add_argument("run_dir", type=Path, help="a job's results directory, runs/<job-id>/")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--width", type=int, default=120, help="width of the table (default 120)")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"ddp-cluster doctor: {args.run_dir} is not a directory: give runs/<job-id>/", file=sys.stderr)
        return 2
    findings = diagnose(args.run_dir)
    if args.json:
        order = timeline(findings)
        report = {
            "run_dir": str(args.run_dir),
            "first_in_time": order.first.signature.id if order else None,
            "findings": [f.as_dict() for f in findings],
        }
        print(json.dumps(report, indent=2))
    else:
        print(render(args.run_dir, findings, args.width))
    return 1 if findings else 0
