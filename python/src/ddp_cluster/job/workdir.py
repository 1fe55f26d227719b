"""A user's project directory, shipped to every node of a job (train.yml ``-e workdir=DIR``).

The files are what a ``git add`` of the directory would take: ``.git``, ``__pycache__`` and compiled Python
are left out, and so is whatever the directory's top-level ``.gitignore`` excludes (git's pattern rules:
``*``, ``?``, ``[...]``, ``**``, a leading or inner ``/`` anchors to the directory, a trailing ``/`` matches
directories only, ``!`` re-includes, a file inside an excluded directory stays excluded). The total is
bounded: large data belongs on a volume every node mounts, not in a copy per job.

    ddp-cluster workdir DIR --script PATH -o OUT.tar.gz [--max-mb N]

packs the files into OUT.tar.gz and prints ``{"files": N, "bytes": B, "script": "PATH"}``; a script that is
not a file inside DIR, or a project over the bound, is an error naming what to change (exit 2).
Standard library only (it runs on the controller).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.files import write_atomic

ALWAYS_SKIPPED_DIRS = frozenset({".git", "__pycache__", ".hg", ".svn"})
ALWAYS_SKIPPED_SUFFIXES = (".pyc", ".pyo")
DEFAULT_MAX_MB = 64


class WorkdirError(DdpClusterError, ValueError):
    """A project that cannot be shipped, with what to do about it."""


@dataclass(frozen=True)
class Rule:
    regex: re.Pattern[str]
    negated: bool
    directories_only: bool


def _translate(pattern: str) -> str:
    """One gitignore pattern (no '!', no trailing '/') as a regex over a path relative to the directory."""
    anchored = "/" in pattern
    body, index = pattern.lstrip("/"), 0
    out = []
    while index < len(body):
        if body.startswith("**/", index):
            out.append("(?:.*/)?")
            index += 3
        elif body.startswith("**", index):
            out.append(".*")
            index += 2
        elif body[index] == "*":
            out.append("[^/]*")
            index += 1
        elif body[index] == "?":
            out.append("[^/]")
            index += 1
        elif body[index] == "[" and (end := body.find("]", index + 2)) != -1:
            inner = body[index + 1 : end]
            out.append("[" + ("^" + inner[1:] if inner.startswith("!") else inner) + "]")
            index = end + 1
        else:
            out.append(re.escape(body[index]))
            index += 1
    return ("" if anchored else "(?:.*/)?") + "".join(out) + "$"


def parse_gitignore(text: str) -> list[Rule]:
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        line = line[1:] if negated else line.removeprefix("\\")
        directories_only = line.endswith("/")
        line = line.rstrip("/")
        if line:
            rules.append(Rule(re.compile(_translate(line)), negated, directories_only))
    return rules


def ignored(relative: str, is_dir: bool, rules: Sequence[Rule]) -> bool:
    """git's answer for one path: the last rule that matches it decides."""
    verdict = False
    for rule in rules:
        if rule.directories_only and not is_dir:
            continue
        if rule.regex.match(relative):
            verdict = not rule.negated
    return verdict


def project_files(root: Path) -> list[Path]:
    """The files to ship, relative to root, in a stable order."""
    gitignore = root / ".gitignore"
    rules = (
        parse_gitignore(gitignore.read_text(encoding="utf-8", errors="replace"))
        if gitignore.is_file()
        else []
    )
    files: list[Path] = []
    for directory, subdirs, names in os.walk(root):
        here = Path(directory).relative_to(root)
        subdirs[:] = sorted(
            name
            for name in subdirs
            if name not in ALWAYS_SKIPPED_DIRS and not ignored((here / name).as_posix(), True, rules)
        )
        for name in sorted(names):
            relative = here / name
            if not name.endswith(ALWAYS_SKIPPED_SUFFIXES) and not ignored(relative.as_posix(), False, rules):
                files.append(relative)
    return files


def check_script(root: Path, script: str, files: Sequence[Path]) -> str:
    """The entry script as a path inside root, which must be one of the files shipped."""
    relative = PurePosixPath(script)
    if relative.is_absolute() or ".." in relative.parts:
        raise WorkdirError(
            f"script={script} must be a path inside workdir={root} (relative to it: train.py, src/train.py)"
        )
    if not (root / relative).is_file():
        raise WorkdirError(f"script={script} is not a file in workdir={root}")
    if Path(relative) not in files:
        raise WorkdirError(f"script={script} is excluded by {root}/.gitignore: it would not reach the nodes")
    return relative.as_posix()


def human(count: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if count < 1024:
            return f"{count:.1f} {unit}" if unit != "B" else f"{count:.0f} B"
        count /= 1024
    return f"{count:.1f} GiB"


def check_size(root: Path, files: Sequence[Path], max_bytes: int) -> int:
    sizes = {path: (root / path).lstat().st_size for path in files}
    total = sum(sizes.values())
    if total > max_bytes:
        biggest = sorted(sizes.items(), key=lambda item: -item[1])[:3]
        listed = ", ".join(f"{path} ({human(size)})" for path, size in biggest)
        raise WorkdirError(
            f"workdir={root} holds {human(total)} in {len(files)} files, more than the {human(max_bytes)} a "
            f"job copies to every node (ddp_job_workdir_max_mb); the biggest: {listed}. Put large data on a "
            "volume every node mounts (node_container_volumes) and read it from there, list it in the "
            "directory's .gitignore, or raise -e ddp_job_workdir_max_mb"
        )
    return total


def pack(root: Path, script: str, output: Path, max_bytes: int) -> dict[str, object]:
    """Check the project and write its files to a gzipped tar; nothing is written when a check fails."""
    if not root.is_dir():
        raise WorkdirError(f"workdir={root} is not a directory on the controller")
    files = project_files(root)
    entry = check_script(root, script, files)
    total = check_size(root, files, max_bytes)
    # In memory (the project is bounded), then one atomic write: no half archive is ever left behind.
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in files:
            tar.add(root / path, arcname=path.as_posix(), recursive=False)
    write_atomic(output, buffer.getvalue())
    return {"files": len(files), "bytes": total, "script": entry}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ddp-cluster workdir", description="Pack a project directory for every node of a job."
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument("--script", required=True, help="the entry script, a path inside the directory")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the .tar.gz to write")
    parser.add_argument("--max-mb", type=float, default=DEFAULT_MAX_MB, help="bound on the files' total size")
    args = parser.parse_args(argv)
    try:
        summary = pack(args.directory.resolve(), args.script, args.output, int(args.max_mb * 2**20))
    except WorkdirError as error:
        print(f"ddp-cluster workdir: {error}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0
