"""A user's project directory, shipped to every node of a job (train.yml ``-e workdir=DIR``).

The files are what a ``git add`` of the directory would take: ``.git``, ``__pycache__`` and compiled Python
are left out, and so is whatever the directory's top-level ``.gitignore`` excludes (git's pattern rules:
``*``, ``?``, ``[...]``, ``**``, a leading or inner ``/`` anchors to the directory, a trailing ``/`` matches
directories only, ``!`` re-includes, a file inside an excluded directory stays excluded). The total is
bounded: large data belongs on a volume every node mounts, not in a copy per job.

Links are followed, never shipped as links (a link the nodes would resolve against their own file system
would dangle there, or point at a node's file): a link to a file inside the directory ships that file's
content under the link's name, a link to a directory inside ships its files under the link's path. A link
that dangles, loops (to a directory it is inside), or points outside the directory is refused, naming it;
with ``follow_links`` (train.yml ``-e workdir_follow_links=true``) a link to outside is followed too, its
target's content packed (within the bound, like every other file); a dangling or looping link is refused
still.

    ddp-cluster workdir DIR --script PATH -o OUT.tar.gz [--max-mb N] [--follow-links]

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.files import write_atomic

ALWAYS_SKIPPED_DIRS = frozenset({".git", "__pycache__", ".hg", ".svn"})
ALWAYS_SKIPPED_SUFFIXES = (".pyc", ".pyo")
DEFAULT_MAX_MB = 64
# A walk that has seen this many times the bound stops there (a followed link to a large tree): the error
# names what it saw; under it, the error names the whole directory's total.
WALK_STOP = 8


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


def _link_problem(root: Path, relative: Path, target: Path, why: str, fix: str) -> WorkdirError:
    return WorkdirError(
        f"workdir={root}: {relative.as_posix()} is a link to {target}, {why}; {fix}, or list the link in"
        f" {root}/.gitignore"
    )


def project_sources(root: Path, follow_links: bool = False, max_bytes: int | None = None) -> dict[Path, Path]:
    """The files to ship in a stable order: their path relative to root (what the nodes get) -> the file
    whose content is packed (the link's target for a link, see the module's text). ``max_bytes``: the walk
    stops with check_size's error once the files hold WALK_STOP times more."""
    root = root.resolve()
    gitignore = root / ".gitignore"
    rules = (
        parse_gitignore(gitignore.read_text(encoding="utf-8", errors="replace"))
        if gitignore.is_file()
        else []
    )
    sources: dict[Path, Path] = {}
    total = 0

    def shipped_file(name: str, relative: Path) -> bool:
        return not name.endswith(ALWAYS_SKIPPED_SUFFIXES) and not ignored(relative.as_posix(), False, rules)

    def shipped_dir(name: str, relative: Path) -> bool:
        return name not in ALWAYS_SKIPPED_DIRS and not ignored(relative.as_posix(), True, rules)

    def add(relative: Path, source: Path) -> None:
        nonlocal total
        sources[relative] = source
        total += source.lstat().st_size
        if max_bytes is not None and total > WALK_STOP * max_bytes:
            check_size(root, sources, max_bytes, walked=False)

    def visit(directory: Path, here: Path, inside: tuple[Path, ...]) -> None:
        # Files first, then directories, each sorted by name (os.walk's order, top-down).
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        subdirs: list[tuple[Path, Path, Path]] = []  # (where, what is walked, its real path)
        for entry in entries:
            relative, path = here / entry.name, Path(entry.path)
            if not entry.is_symlink():
                if entry.is_dir():
                    if shipped_dir(entry.name, relative):
                        subdirs.append((relative, path, path.resolve()))
                elif shipped_file(entry.name, relative):
                    add(relative, path)
                continue
            target = Path(os.path.realpath(path))
            is_dir = target.is_dir()
            if not (shipped_dir if is_dir else shipped_file)(entry.name, relative):
                continue
            if not target.exists():
                raise _link_problem(
                    root, relative, Path(os.readlink(path)), "which does not exist", "remove it"
                )
            if target != root and root not in target.parents and not follow_links:
                raise _link_problem(
                    root,
                    relative,
                    target,
                    "outside the directory (the nodes get only what is inside it)",
                    "copy what it points to into the directory, or set -e workdir_follow_links=true to"
                    " pack its target's content",
                )
            if is_dir:
                if target in inside:
                    raise _link_problem(
                        root, relative, target, "a directory it is inside (a loop)", "remove it"
                    )
                subdirs.append((relative, target, target))
            elif target.is_file():
                add(relative, target)
            else:
                raise _link_problem(
                    root, relative, target, "which is neither a file nor a directory", "remove it"
                )
        for relative, path, real in subdirs:
            visit(path, relative, (*inside, real))

    visit(root, Path(), (root,))
    return sources


def project_files(root: Path, follow_links: bool = False) -> list[Path]:
    """The files to ship, relative to root, in a stable order (see :func:`project_sources`)."""
    return list(project_sources(root, follow_links))


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


def check_size(root: Path, sources: Mapping[Path, Path], max_bytes: int, walked: bool = True) -> int:
    """The files' total size (``sources``: :func:`project_sources`'); over ``max_bytes``, an error naming
    the biggest (``walked`` False: the walk stopped there, the directory holds at least that)."""
    sizes = {path: source.lstat().st_size for path, source in sources.items()}
    total = sum(sizes.values())
    if total > max_bytes:
        biggest = sorted(sizes.items(), key=lambda item: -item[1])[:3]
        listed = ", ".join(f"{path} ({human(size)})" for path, size in biggest)
        raise WorkdirError(
            f"workdir={root} holds {'' if walked else 'at least '}{human(total)} in {len(sources)} files,"
            f" more than the {human(max_bytes)} a "
            f"job copies to every node (ddp_job_workdir_max_mb); the biggest: {listed}. Put large data on a "
            "volume every node mounts (node_container_volumes) and read it from there, list it in the "
            "directory's .gitignore, or raise -e ddp_job_workdir_max_mb"
        )
    return total


def pack(
    root: Path, script: str, output: Path, max_bytes: int, *, follow_links: bool = False
) -> dict[str, object]:
    """Check the project and write its files to a gzipped tar; nothing is written when a check fails.
    ``follow_links``: a link to outside the directory is packed as its target's content (else refused)."""
    if not root.is_dir():
        raise WorkdirError(f"workdir={root} is not a directory on the controller")
    sources = project_sources(root, follow_links, max_bytes)
    entry = check_script(root, script, list(sources))
    total = check_size(root, sources, max_bytes)
    # In memory (the project is bounded), then one atomic write: no half archive is ever left behind.
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, source in sources.items():
            tar.add(source, arcname=path.as_posix(), recursive=False)
    write_atomic(output, buffer.getvalue())
    return {"files": len(sources), "bytes": total, "script": entry}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ddp-cluster workdir", description="Pack a project directory for every node of a job."
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument("--script", required=True, help="the entry script, a path inside the directory")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the .tar.gz to write")
    parser.add_argument("--max-mb", type=float, default=DEFAULT_MAX_MB, help="bound on the files' total size")
    parser.add_argument(
        "--follow-links", action="store_true", help="pack what a link to outside the directory points to"
    )
    args = parser.parse_args(argv)
    try:
        if args.output.is_dir():
            raise WorkdirError(
                f"-o {args.output} is a directory: give the .tar.gz file to write"
                f" (e.g. {args.output / 'job.tar.gz'})"
            )
        summary = pack(
            args.directory.resolve(),
            args.script,
            args.output,
            int(args.max_mb * 2**20),
            follow_links=args.follow_links,
        )
    except WorkdirError as error:
        print(f"ddp-cluster workdir: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # the output's folder missing or not writable
        print(
            f"ddp-cluster workdir: {args.output} cannot be written ({error.strerror or error}):"
            " give -o a path you can write",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(summary))
    return 0
