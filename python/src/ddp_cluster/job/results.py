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
    runs/<job-id>/status.json                 the supervisor's last status
    runs/<job-id>/plan.json                   the plan (the controller's own, as are status.json and logs/)

An archive is what a job's code could write: each member is checked before it is unpacked (:func:`unsafe`).
A path outside the node's directory, a link to an absolute path or out of the node's directory (out of the
output, for a member of ``output/``), a hard link, a device or a fifo is left out and named in a warning; an
archive cut short is laid out as far as it reads, and said. Nothing of it can replace the controller's own
files: the output goes under ``output/``, the rest under ``nodes/<node>/``.

Standard library only: the supervisor runs it in the node image, the controller without torch.

    python -m ddp_cluster.job.results RUN_DIR FIRST_NODE NODE,NODE,... [PROCESSES_PER_NODE (torchrun only)]
"""

from __future__ import annotations

import re
import shutil
import sys
import tarfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

LOGS = "logs"
# A job's output (the first node's JOB/output/) is laid out in runs/<job-id>/output/, never over the
# controller's own files (plan.json, status.json, logs/, nodes/).
OUTPUT = "output"
NODES = "nodes"
# How many of the members left out a warning names.
SHOWN = 5
# OpenMPI's first job of an mpirun is number 1: its per-process files are logs/1/rank.N/stdout.
MPIRUN_LOG = re.compile(r"^logs/[^/]+/rank\.(\d+)/stdout$")
WORKER_LOG = re.compile(r"^logs/torchrun/[^/]+/attempt_(\d+)/(\d+)/stdout\.log$")


def mpirun_log(job_dir: Path | str, process: int) -> Path:
    """The output file of mpirun's process ``process`` (a rank, or with torchrun a node's agent), on the node
    where it ran."""
    return Path(job_dir) / LOGS / "1" / f"rank.{process}" / "stdout"


def find_mpirun_log(job_dir: Path, process: int) -> Path | None:
    """The output file of mpirun's process ``process`` if it is on this node, whatever mpirun's job number."""
    matches = sorted((job_dir / LOGS).glob(f"*/rank.{process}/stdout"))
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
    for part in PurePosixPath(member.linkname).parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return f"link to {member.linkname}, outside {'the output' if root else 'the node directory'}"
    return ""


def _normalised(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return str(PurePosixPath(name)) if name else "."


def extract(archive: Path, target: Path) -> tuple[list[str], str]:
    """The archive's members unpacked under ``target``, each checked first (:func:`unsafe`) and unpacked
    with tarfile's ``data`` filter; the members left out (``path (why)``), and what was wrong with the
    archive itself ('' when it read to its end)."""
    left_out: list[str] = []
    links: set[str] = set()  # a member under a link laid out before would be written through it
    try:
        with tarfile.open(archive) as tar:
            for member in tar:
                name = _normalised(member.name)
                if name == ".":
                    continue
                parents = {str(parent) for parent in PurePosixPath(name).parents}
                why = "a path through a link" if parents & links else unsafe(member, name)
                if why:
                    left_out.append(f"{name} ({why})")
                    continue
                member.name = name
                if member.isdir():  # set at once (not at the end, as extractall does): its members follow
                    member.mode |= 0o700
                try:
                    tar.extract(member, target, filter="data")
                except (tarfile.FilterError, OSError) as error:
                    left_out.append(f"{name} ({error})")
                    continue
                if member.issym():
                    links.add(name)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        return left_out, str(error) or type(error).__name__
    return left_out, ""


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


def lay_out(run_dir: Path, first: str, nodes: Sequence[str], torchrun_nproc: int | None = None) -> LaidOut:
    """Unpack each node's archive (``run_dir/.incoming/<node>.tar.gz``) under ``run_dir`` (see the module's
    text). Never raises on what a job left: unsafe members are left out and a cut archive laid out as far as
    it reads, each said in the warnings."""
    incoming = run_dir / ".incoming"
    logs = run_dir / LOGS
    logs.mkdir(parents=True, exist_ok=True)
    done = LaidOut()
    for index, node in enumerate(nodes):
        archive = incoming / f"{node}.tar.gz"
        if not archive.exists():
            done.missing.append(node)
            continue
        target = run_dir / NODES / node
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)  # a collection made again: this archive is the node's whole directory
        target.mkdir(parents=True, exist_ok=True)
        left_out, broken = extract(archive, target)
        if left_out:
            shown = ", ".join(left_out[:SHOWN]) + (
                f" and {len(left_out) - SHOWN} more" if len(left_out) > SHOWN else ""
            )
            done.warnings.append(f"results: skipped {len(left_out)} unsafe member(s) from {node}: {shown}")
        if broken:
            done.warnings.append(
                f"results: {node}'s archive is truncated or corrupt ({broken}): what could be read is laid"
                f" out under {target}"
            )
        for path in sorted(target.glob(f"{LOGS}/*/rank.*/stdout")):
            if (match := MPIRUN_LOG.match(path.relative_to(target).as_posix())) and _regular(path):
                process = int(match.group(1))
                name = agent_log_name(process) if torchrun_nproc else rank_log_name(process)
                shutil.copyfile(path, logs / name)
        if torchrun_nproc:
            worker_logs(target, index, torchrun_nproc, logs)
        output = target / OUTPUT
        if node == first and output.is_dir() and not output.is_symlink():
            _merge_output(output, run_dir / OUTPUT)
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
