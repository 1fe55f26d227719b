"""Where a job's logs are, on the node and in its results, in one place; the results laid out there.

On a node, mpirun (``--output-filename JOB/logs``, OpenMPI 4.x) writes each of its processes' output to
``JOB/logs/1/rank.N/stdout`` ("1": the first, and only, job of that mpirun); with torchrun those processes are
the nodes' agents and each worker's own output is torchrun's ``JOB/logs/torchrun/<run>/attempt_A/<local rank>/
stdout.log`` (then ``stderr.log``). The supervisor reads them there (:func:`mpirun_log`), and
``python -m ddp_cluster.job.results`` lays the nodes' archives out under ``runs/<job-id>/`` (:func:`lay_out`):

    runs/<job-id>/output/...                  the first node's output/: metrics.jsonl, summary.json,
                                              health.json, checkpoints/, loss.png (drawn by the report)
    runs/<job-id>/nodes/<node>/...            every node's job directory
    runs/<job-id>/logs/rank.R.log             each rank's log (R: the global rank)
    runs/<job-id>/logs/agent.N.log            torchrun / torch_npu_run: node N's agent
    runs/<job-id>/telemetry/NODE.jsonl        the supervisor's samples of each node (the first node's
                                              telemetry/; regular files NODE.jsonl only)
    runs/<job-id>/status.json                 the supervisor's last status
    runs/<job-id>/plan.json                   the plan (the controller's own, as are status.json and logs/)

An archive is what a job's code could write: each member is checked before it is unpacked (:func:`unsafe`).
A path outside the node's directory, a link to an absolute path or out of the node's directory (out of the
output, for a member of ``output/``), a link with ``..`` after a name, a hard link, a device or a fifo is left
out and named in a warning; then every link laid out is resolved, and one that ends outside is removed and
named too, before anything is read through the tree (:func:`escaping_links`). An archive cut short is laid out
as far as it reads, one of more than :data:`MAX_MEMBERS` members up to there, each said. Nothing of it can
replace the controller's own files: the output goes under ``output/``, the rest under ``nodes/<node>/``.

What the nodes send is bounded by the job's ``results_max_gb`` (:func:`limit`): each node packs at most its
share (:func:`shares`: the first node, whose output is the run's, at least three quarters; every other node an
equal part of the rest), and the layout, whatever the archives say, writes at most the job's limit in all, the
first node's first: a member over what is left is left out and named.

Standard library only: the supervisor runs it in the node image, the controller without torch.

    python -m ddp_cluster.job.results RUN_DIR FIRST_NODE NODE,NODE,... [PROCESSES_PER_NODE (torchrun only)]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tarfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

LOGS = "logs"
# A job's output (the first node's JOB/output/) is laid out in runs/<job-id>/output/, never over the
# controller's own files (plan.json, status.json, logs/, nodes/).
OUTPUT = "output"
NODES = "nodes"
# The supervisor's samples of every node (JOB/telemetry/NODE.jsonl on the first node), laid out in
# runs/<job-id>/telemetry/.
TELEMETRY = "telemetry"
TELEMETRY_FILE = re.compile(r"^[A-Za-z0-9_.-]+\.jsonl$")
# How many of the members left out a warning names.
SHOWN = 5
# The members read from one node's archive at most: each costs a file, and a name held while it unpacks, and
# a job's code could write an archive of many millions of empty ones.
MAX_MEMBERS = 1_000_000
# tarfile's filters came with Python 3.8.17, 3.9.17, 3.10.12, 3.11.4: a node image's Python may be older. The
# member checks here cover what the data filter refuses; without it, :func:`_plain` strips what it would.
DATA_FILTER = hasattr(tarfile, "data_filter")
# What one member's unpacking may raise, the archive being whole: it is left out, the rest laid out.
MEMBER_ERRORS: tuple[type[Exception], ...] = (
    (tarfile.FilterError, OSError) if hasattr(tarfile, "FilterError") else (OSError,)
)
# The job's results_max_gb when its plan states none (the setting's default: roles/ddp_job's argument_specs,
# held equal by python/tests/test_results_bounds.py), and a GiB.
RESULTS_MAX_GB = 256
GIB = 1 << 30
PLAN_FILE = "plan.json"  # ddp_cluster.job.bundle.PLAN_FILE: the controller's own plan of the run
# OpenMPI's first job of an mpirun is number 1: its per-process files are logs/1/rank.N/stdout.
MPIRUN_LOG = re.compile(r"^logs/[^/]+/rank\.(\d+)/stdout$")
WORKER_LOG = re.compile(r"^logs/torchrun/[^/]+/attempt_(\d+)/(\d+)/stdout\.log$")


def mpirun_log(job_dir: Path | str, process: int) -> Path:
    """The output file of mpirun's process ``process`` (a rank, or with torchrun a node's agent), on the node
    where it ran."""
    return Path(job_dir) / LOGS / "1" / f"rank.{process}" / "stdout"


def find_mpirun_log(job_dir: Path, process: int) -> Path | None:
    """The output file of mpirun's process ``process`` if it is on this node, whatever mpirun's job number and
    however Open MPI padded the number (``rank.03`` among 10 or more processes)."""
    matches = sorted(
        path
        for path in (job_dir / LOGS).glob("*/rank.*/stdout")
        if (found := MPIRUN_LOG.match(path.relative_to(job_dir).as_posix()))
        and int(found.group(1)) == process
    )
    return matches[0] if matches else None


def rank_log_name(rank: int) -> str:
    return f"rank.{rank}.log"


def agent_log_name(node_index: int) -> str:
    return f"agent.{node_index}.log"


def worker_logs(node_dir: Path, node_index: int, nproc: int, logs: Path) -> None:
    """Each torchrun worker's log of its last attempt (stdout, then stderr) as logs/rank.R.log,
    R = node index x processes per node + local rank."""
    latest: dict[int, tuple[int, Path]] = {}
    for path in node_dir.glob(f"{LOGS}/torchrun/*/attempt_*/*/stdout.log"):
        if match := WORKER_LOG.match(path.relative_to(node_dir).as_posix()):
            attempt, local = int(match.group(1)), int(match.group(2))
            if attempt >= latest.get(local, (-1, path))[0]:
                latest[local] = (attempt, path)
    for local, (_, stdout) in sorted(latest.items()):
        stderr = stdout.with_name("stderr.log")
        if not _regular(stdout):
            continue
        text = stdout.read_bytes() + (stderr.read_bytes() if _regular(stderr) else b"")
        (logs / rank_log_name(node_index * nproc + local)).write_bytes(text)


def limit(spec: Mapping[str, object]) -> int:
    """The bytes a job's results may bring (its spec's ``results_max_gb``; the default when it states
    none)."""
    value = spec.get("results_max_gb", RESULTS_MAX_GB)
    gib = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else RESULTS_MAX_GB
    return max(int(gib * GIB), 0)


def run_limit(run_dir: Path) -> int:
    """The bytes the job of ``run_dir`` may bring, from its plan.json (the controller's own); the default
    when there is none to read."""
    try:
        planned = json.loads((run_dir / PLAN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        planned = {}
    spec = planned.get("spec") if isinstance(planned, Mapping) else None
    return limit(spec if isinstance(spec, Mapping) else {})


def shares(total: int, nodes: Sequence[str], first: str) -> dict[str, int]:
    """Each node's part of ``total`` bytes: every node but ``first`` ``total // (4 * len(nodes))`` (its logs,
    and a replica of the checkpoint where that fits), ``first`` the rest (the run's output and checkpoint: at
    least three quarters); their sum is never over ``total``."""
    each = total // (4 * len(nodes)) if nodes else 0
    others = sum(1 for node in nodes if node != first)
    return {node: total - each * others if node == first else each for node in nodes}


def collect_share(plan: Mapping[str, object], node: str) -> int:
    """What the collect lets ``node`` pack (``ddp_job_pack``'s ``max_bytes``), from the whole plan: its share
    of the job's limit among every node that may hold its results (the job's and its spares), the first being
    the node whose supervisor ended the job (a standby that took it over), as the report has it."""
    spec, host_dirs = plan.get("spec"), plan.get("host_dirs")
    nodes = [str(name) for name in host_dirs] if isinstance(host_dirs, Mapping) else []
    first = str(plan.get("first") or (nodes[0] if nodes else node))
    try:
        ended = json.loads((Path(str(plan.get("run_dir"))) / "status.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        ended = None
    ended_on = ended.get("supervisor_node") if isinstance(ended, Mapping) else None
    if isinstance(ended_on, str) and ended_on:
        first = ended_on
    if node not in nodes:
        nodes.append(node)
    return shares(limit(spec if isinstance(spec, Mapping) else {}), nodes, first)[node]


@dataclass
class LaidOut:
    """What :func:`lay_out` did: the nodes whose archive did not come back, and what the report warns of (the
    members left out as unsafe, an archive that was cut short)."""

    missing: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def unsafe(member: tarfile.TarInfo, name: str) -> str:
    """Why a member of a node's archive may not be laid out ('' when it may): ``name`` is its normalised
    path. A link must stay where it is laid out: inside the output for a member of ``output/`` (moved to
    runs/<id>/output/), inside the node's directory otherwise."""
    parts = PurePosixPath(name).parts
    if member.name.startswith("/") or not parts or ".." in parts:
        return "a path outside the node's directory"
    if member.isdir() or member.isreg():
        return ""
    if member.islnk():
        return f"hard link to {member.linkname}"
    if not member.issym():
        return "a device, fifo or special file"
    if member.linkname.startswith("/"):
        return f"link to {member.linkname}"
    root = 1 if parts[0] == OUTPUT else 0
    depth = len(parts) - 1 - root
    named = False
    for part in PurePosixPath(member.linkname).parts:
        if part == ".." and named:
            # A name before '..' may itself be a link (laid out before or after this one): counting it as a
            # directory one level down would let x/up/../plan.json, with x/up -> .., out.
            return f"link to {member.linkname}, with '..' after a name: a link may only climb first"
        named = named or part != ".."
        depth += -1 if part == ".." else 1
        if depth < 0:
            return f"link to {member.linkname}, outside {'the output' if root else 'the node directory'}"
    return ""


def _normalised(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return str(PurePosixPath(name)) if name else "."


@dataclass
class Extracted:
    """What :func:`extract` did with one archive: how many members it left out and the first :data:`SHOWN`
    of them (``path (why)``), what was wrong with the archive itself ('' when it read to its end), and whether
    it stopped at :data:`MAX_MEMBERS`."""

    left_out: int = 0
    shown: list[str] = field(default_factory=list)
    broken: str = ""
    cut: bool = False
    written: int = 0  # the bytes of the files laid out
    over: list[str] = field(default_factory=list)  # the files left out over the limit, ``path (bytes)``

    def leave_out(self, name: str, why: str) -> None:
        self.left_out += 1
        if len(self.shown) < SHOWN:
            self.shown.append(f"{name} ({why})")


def _plain(member: tarfile.TarInfo) -> None:
    """What tarfile's data filter does to a member that passed :func:`unsafe`, for a Python without it: no
    set-id, sticky or group/other write bits, and the owner of the one who lays it out (-1 and no names:
    tarfile's chown, as root, then changes nothing)."""
    member.mode &= 0o755
    if member.isreg():
        member.mode = (member.mode if member.mode & 0o100 else member.mode & ~0o111) | 0o600
    member.uid = member.gid = -1
    member.uname = member.gname = ""


def escaping_links(target: Path) -> list[tuple[str, str]]:
    """Every link under ``target`` (not followed) that resolves outside it, or, under ``target/output``,
    outside the output, removed: ``(path, why)`` for each. The member checks refuse such links already; this
    holds whatever order or chain of links an archive found around them, before anything reads the tree."""
    node_root = os.path.realpath(target)
    output_root = os.path.join(node_root, OUTPUT)
    removed: list[tuple[str, str]] = []
    for directory, dirs, files in os.walk(node_root):
        dirs.sort()
        for entry in sorted(dirs + files):
            path = os.path.join(directory, entry)
            if not os.path.islink(path):
                continue
            name = PurePosixPath(os.path.relpath(path, node_root)).as_posix()
            in_output = name.startswith(f"{OUTPUT}/")
            root = output_root if in_output else node_root
            resolved = os.path.realpath(path)
            if os.path.commonpath([resolved, root]) != root:
                where = "the output" if in_output else "the node directory"
                removed.append((name, f"link to {os.readlink(path)}, resolving outside {where}"))
                os.unlink(path)  # fails loudly (the layout reported failed) rather than leave it
                if entry in dirs:
                    dirs.remove(entry)
    return removed


def extract(archive: Path, target: Path, max_bytes: int | None = None) -> Extracted:
    """The archive's members unpacked under ``target``, each checked first (:func:`unsafe`) and unpacked
    with tarfile's ``data`` filter where there is one; then every link resolved (:func:`escaping_links`).
    With ``max_bytes``, files of more bytes in all are left out, named, whatever the archive holds (tarfile
    writes a member's declared size, never more)."""
    done = Extracted()
    links: set[str] = set()  # a member under a link laid out before would be written through it
    read = 0
    try:
        with tarfile.open(archive) as tar:
            while (member := tar.next()) is not None:
                # tarfile keeps every member it read (millions of them, in memory): not needed here.
                tar.members.clear()  # type: ignore[attr-defined]
                if read == MAX_MEMBERS:
                    done.cut = True
                    break
                read += 1
                name = _normalised(member.name)
                if name == ".":
                    continue
                parents = {str(parent) for parent in PurePosixPath(name).parents}
                why = "a path through a link" if parents & links else unsafe(member, name)
                if not why and max_bytes is not None and member.size > max_bytes - done.written:
                    done.over.append(f"{name} ({member.size} bytes)")
                    continue
                if why:
                    done.leave_out(name, why)
                    continue
                member.name = name
                if member.isdir():  # set at once (not at the end, as extractall does): its members follow
                    member.mode |= 0o700
                try:
                    if DATA_FILTER:
                        tar.extract(member, target, filter="data")
                    else:
                        _plain(member)
                        tar.extract(member, target)
                except MEMBER_ERRORS as error:
                    done.leave_out(name, str(error))
                    continue
                if member.issym():
                    links.add(name)
                if member.isreg():
                    done.written += member.size
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        done.broken = str(error) or type(error).__name__
    for name, why in escaping_links(target):
        done.leave_out(name, why)
    return done


def _regular(path: Path) -> bool:
    """A file laid out from an archive that may be read: a regular file, not a link."""
    return path.is_file() and not path.is_symlink()


def _merge_output(source: Path, output: Path) -> None:
    """The first node's output moved to runs/<id>/output/, over what is there by the same name (a gate's
    health.json kept there by the job's own)."""
    output.mkdir(exist_ok=True)
    for item in sorted(source.iterdir()):
        destination = output / item.name
        if destination.is_dir() and not destination.is_symlink():
            shutil.rmtree(destination)
        elif destination.exists() or destination.is_symlink():
            destination.unlink()
        shutil.move(str(item), destination)
    source.rmdir()


def _merge_telemetry(source: Path, telemetry: Path) -> None:
    """The first node's telemetry files moved to runs/<id>/telemetry/: regular files named NODE.jsonl only
    (a link, a folder or another name is left in the node's directory: a link that was safe there could
    lead elsewhere from here)."""
    if not source.is_dir() or source.is_symlink():
        return
    for item in sorted(source.iterdir()):
        if TELEMETRY_FILE.match(item.name) and _regular(item):
            telemetry.mkdir(exist_ok=True)
            destination = telemetry / item.name
            if destination.is_symlink() or destination.is_dir():
                continue  # never written through, never over a folder
            shutil.move(str(item), destination)


def lay_out(
    run_dir: Path,
    first: str,
    nodes: Sequence[str],
    torchrun_nproc: int | None = None,
    max_bytes: int | None = None,
) -> LaidOut:
    """Unpack each node's archive (``run_dir/.incoming/<node>.tar.gz``) under ``run_dir`` (see the module's
    text), the first node's first, never more than ``max_bytes`` of files in all (the job's limit from its
    plan.json when not given). Never raises on what a job left: unsafe members and those over the limit are
    left out and a cut archive laid out as far as it reads, each said in the warnings."""
    incoming = run_dir / ".incoming"
    logs = run_dir / LOGS
    logs.mkdir(parents=True, exist_ok=True)
    done = LaidOut()
    left = run_limit(run_dir) if max_bytes is None else max_bytes
    order = sorted(enumerate(nodes), key=lambda indexed: indexed[1] != first)  # the run's output first
    for index, node in order:
        archive = incoming / f"{node}.tar.gz"
        if not archive.exists():
            done.missing.append(node)
            continue
        target = run_dir / NODES / node
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)  # a collection made again: this archive is the node's whole directory
        target.mkdir(parents=True, exist_ok=True)
        # Nothing below reads the tree before extract() has removed the links that lead out of it.
        got = extract(archive, target, left)
        left -= got.written
        if got.left_out:
            shown = ", ".join(got.shown) + (
                f" and {got.left_out - len(got.shown)} more" if got.left_out > len(got.shown) else ""
            )
            done.warnings.append(f"results: skipped {got.left_out} unsafe member(s) from {node}: {shown}")
        if got.over:
            more = f" and {len(got.over) - SHOWN} more" if len(got.over) > SHOWN else ""
            done.warnings.append(
                f"results: {len(got.over)} file(s) of {node} left out, over the job's results_max_gb"
                f" ({', '.join(got.over[:SHOWN])}{more}): raise -e results_max_gb to bring them"
            )
        if got.cut:
            done.warnings.append(
                f"results: {node}'s archive has more than {MAX_MEMBERS} members: the first {MAX_MEMBERS} are"
                " read and laid out as they may be, the rest left out (a job that writes that many files"
                " should pack them itself)"
            )
        for path in sorted(target.glob(f"{LOGS}/*/rank.*/stdout")):
            if (match := MPIRUN_LOG.match(path.relative_to(target).as_posix())) and _regular(path):
                process = int(match.group(1))
                name = agent_log_name(process) if torchrun_nproc else rank_log_name(process)
                shutil.copyfile(path, logs / name)
        if torchrun_nproc:
            worker_logs(target, index, torchrun_nproc, logs)
        output = target / OUTPUT
        merged = node == first and output.is_dir() and not output.is_symlink()
        if merged:
            _merge_output(output, run_dir / OUTPUT)
        if node == first:
            _merge_telemetry(target / TELEMETRY, run_dir / TELEMETRY)
        if got.broken:
            where = f"{run_dir / OUTPUT} (its output) and {target}" if merged else str(target)
            done.warnings.append(
                f"results: {node}'s archive is truncated or corrupt ({got.broken}): what could be read is"
                f" laid out under {where}"
            )
        status = target / "status.json"
        if node == first and _regular(status):
            shutil.copyfile(status, run_dir / "status.json")
    shutil.rmtree(incoming, ignore_errors=True)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (3, 4):
        print(__doc__.rstrip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    nproc = int(args[3]) if len(args) == 4 else None
    done = lay_out(Path(args[0]), args[1], args[2].split(","), nproc)
    for node in done.missing:
        print(f"{node}: no archive came back", file=sys.stderr)
    for warning in done.warnings:
        print(warning, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
