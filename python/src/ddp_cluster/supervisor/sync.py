"""A running job's files as they are now, for ``jobs.yml -e sync=ID``: only what the controller lacks.

The controller sends what it holds of the job (its manifest: for each node, each file's path in the job's
directory -> the node's size and mtime when it was sent, and the SHA-256 of the :data:`TAIL_CHECK` bytes
before that size) on this command's standard input; the answer is one JSON line on its standard output.

    python -m ddp_cluster.supervisor.sync --jobs-dir /workspace/jobs --job ID [--nodes n0,n1] [--check]

runs on the entry node (the one the controller reaches). It finds the job
(:func:`ddp_cluster.supervisor.locate.locate`) and, when its supervisor runs on another node, asks that node
the same (``--first``) over the mesh's ssh. There, :func:`gather` asks every node of the job at once (this one
directly, the others over the mesh with ``--part``) for :func:`part`: that node's files that differ from the
manifest. A file that only grew (its size larger, the bytes before the old size unchanged: the logs,
metrics.jsonl, TensorBoard's event files, telemetry) is sent from the old size on; a changed one whole; an
unchanged one not at all, so a second sync of a job that wrote nothing moves no file.

What a node sends is what the final collect would pack (:mod:`ddp_cluster.server.pack`: found from the
workspace down without following a link, a link sent as the link, no ``secrets.json`` nor ``job.tar.gz``,
no ``*.tmp`` or ``__pycache__``, the values of the job's secrets masked in every file, a sparse file left out
and named), less what the collect alone brings: ``output/checkpoints/`` (large, and only used by a resume,
which reads the collected ones), ``workdir/`` (the project as sent, kept on the controller already) and
``heartbeat/`` (the watchdog's).
At most ``budget`` bytes of files per node and sync (the rest is ``pending``: the next sync goes on from
there), and never more than the controller says the job's ``results_max_gb`` has left (``left`` in its
request), split between the nodes.

A piece of a file never ends inside a secret's value: its end is held back to before any beginning of
one (the next sync sends it whole, masked).

Standard library only: it runs in the node image's Python.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import io
import json
import os
import shlex
import socket
import stat
import subprocess
import sys
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.job import node_jobs
from ddp_cluster.job import spec as jobspec
from ddp_cluster.job import status as job_status
from ddp_cluster.server import pack
from ddp_cluster.supervisor.locate import JobNotFound, Located, locate
from ddp_cluster.supervisor.remote import POOL, Mesh

MODULE = "ddp_cluster.supervisor.sync"
# The bytes before a file's old size whose digest says the file only grew since it was sent.
TAIL_CHECK = 4096
# Bytes of files all nodes send in one sync at most (split between them): the answer is held in memory on the
# node and the controller. What is left goes with the next sync.
BUDGET = 128 << 20
MIN_NODE_BUDGET = 1 << 20
# What only the final collect brings (see the module's text); heartbeat/: the ranks' empty files whose times
# the watchdog reads, touched at every step (each sync would bring them again, and say nothing).
COLLECT_ONLY = (pack.CHECKPOINTS, "workdir", "heartbeat")
# Of the files a node leaves out (a fifo, a socket), the first few are named.
SHOWN = 5
JOB_FILE_LIMIT = 4 << 20  # a job.json is a few kB: more is not one
# A node asked over the mesh answers within this (a first sync of a large output takes a while).
PART_TIMEOUT = 600


class SyncError(DdpClusterError):
    """The job's files cannot be read for a sync; the message says why."""


@dataclass(frozen=True)
class Held:
    """What the controller holds of one file of a node: the node's size and mtime (ns) when it was sent and
    the SHA-256 of the :data:`TAIL_CHECK` bytes before that size; a link's ``tail`` is ``link:TARGET``."""

    size: int
    mtime: int
    tail: str


def read_held(raw: Any) -> dict[str, Held]:
    """A node's part of the manifest (path -> [size, mtime, tail]); what is not in that shape is left out
    (the file is then sent whole)."""
    held: dict[str, Held] = {}
    if not isinstance(raw, Mapping):
        return held
    for path, value in raw.items():
        if (
            isinstance(path, str)
            and isinstance(value, list)
            and len(value) == 3
            and all(isinstance(item, int) and not isinstance(item, bool) for item in value[:2])
            and isinstance(value[2], str)
        ):
            held[path] = Held(value[0], value[1], value[2])
    return held


def digest_before(descriptor: int, end: int) -> str:
    """The SHA-256 of the :data:`TAIL_CHECK` bytes (fewer at a file's start) before ``end``."""
    start = max(0, end - TAIL_CHECK)
    return hashlib.sha256(os.pread(descriptor, end - start, start)).hexdigest()


def start_of(held: Held | None, size: int, mtime: int, descriptor: int) -> int | None:
    """Where the bytes to send of a file start: None when the controller has it as it is, the old size
    when it only grew since, else 0 (whole)."""
    if held is None:
        return 0
    if size == held.size and mtime == held.mtime:
        return None
    if 0 < held.size < size and digest_before(descriptor, held.size) == held.tail:
        return held.size
    return 0


def held_back(data: bytes, secrets: Sequence[bytes]) -> int:
    """How many bytes at the end of ``data`` may be the beginning of a secret's value (kept for the next
    sync, when the value is whole and masked)."""
    keep = 0
    for secret in secrets:
        for length in range(min(len(secret) - 1, len(data)), keep, -1):
            if data.endswith(secret[:length]):
                keep = length
                break
    return keep


def masked(data: bytes, secrets: Sequence[bytes]) -> tuple[bytes, int]:
    """``data`` with each secret (longest first, as :func:`ddp_cluster.server.pack.read_secrets` orders them)
    replaced by ``***``; how many were."""
    count = 0
    for secret in secrets:
        count += data.count(secret)
        data = data.replace(secret, pack.MASK)
    return data, count


@dataclass(frozen=True)
class Entry:
    """One entry of a node's job directory: its path there, ``file``/``link``/``dir`` or ``skipped: why``,
    and the descriptor of its directory (valid while the walk is in it)."""

    path: str
    kind: str
    parent: int
    name: str


def collect_only(path: str) -> bool:
    return any(path == top or path.startswith(top + "/") for top in COLLECT_ONLY)


def walk(job: int) -> Iterator[Entry]:
    """The job directory opened as ``job``, as :func:`ddp_cluster.server.pack.walk` sees it (no link
    followed) but without what only the collect brings (its directories not even entered)."""
    yield from _walk(job, "", 1)


def _walk(directory: int, relative: str, depth: int) -> Iterator[Entry]:
    with os.scandir(directory) as listing:
        entries = sorted(listing, key=lambda entry: entry.name)
    for entry in entries:
        name = entry.name
        path = f"{relative}/{name}" if relative else name
        if pack.skipped(name) or (not relative and name in (pack.BUNDLE, pack.SECRETS)) or collect_only(path):
            continue
        if entry.is_symlink():
            yield Entry(path, "link", directory, name)
        elif entry.is_dir(follow_symlinks=False):
            if depth > pack.MAX_DEPTH:
                yield Entry(
                    path, f"skipped: nested deeper than {pack.MAX_DEPTH} directories", directory, name
                )
                continue
            try:
                inner = os.open(name, pack.DIRECTORY, dir_fd=directory)
            except OSError as error:  # swapped for a link since the listing, or removed
                yield Entry(path, f"skipped: {error.strerror}", directory, name)
                continue
            try:
                yield from _walk(inner, path, depth + 1)
            finally:
                os.close(inner)
        elif entry.is_file(follow_symlinks=False):
            yield Entry(path, "file", directory, name)
        else:
            yield Entry(path, "skipped: not a file, directory or link", directory, name)


@dataclass
class _Packer:
    """One node's answer being made (see :func:`part`)."""

    held: dict[str, Held]
    secrets: list[bytes]
    budget: int
    check: bool
    files: list[dict[str, Any]]
    left_out: list[str]
    tar: tarfile.TarFile | None
    sent: int = 0
    pending: int = 0

    def link(self, entry: Entry) -> None:
        try:
            target = os.readlink(entry.name, dir_fd=entry.parent)
        except OSError:
            return  # removed since the listing
        tail = f"link:{target}"
        known = self.held.get(entry.path)
        if known is not None and known.tail == tail:
            return
        self.files.append(
            {"path": entry.path, "link": target, "start": 0, "size": 0, "mtime": 0, "tail": tail}
        )
        if self.tar is not None:
            info = tarfile.TarInfo(entry.path)
            info.type, info.linkname = tarfile.SYMTYPE, target
            self.tar.addfile(info)

    def file(self, entry: Entry) -> None:
        try:
            descriptor = os.open(entry.name, pack.FILE, dir_fd=entry.parent)
        except FileNotFoundError:
            return  # removed since the listing
        except OSError as error:
            self.left_out.append(f"{entry.path} ({error.strerror})")
            return
        try:
            found = os.fstat(descriptor)
            if not stat.S_ISREG(found.st_mode):
                self.left_out.append(f"{entry.path} (not a regular file)")
                return
            why = pack.sparse(descriptor, found)
            if why:
                self.left_out.append(f"{entry.path} ({why})")
                return
            self._piece(entry.path, descriptor, found)
        finally:
            os.close(descriptor)

    def _piece(self, path: str, descriptor: int, found: os.stat_result) -> None:
        size, mtime = found.st_size, found.st_mtime_ns
        start = start_of(self.held.get(path), size, mtime, descriptor)
        if start is None:
            return
        length = min(size - start, max(self.budget - self.sent, 0))
        if length < size - start:
            self.pending += size - start - length
        if length <= 0 and size > 0:
            return
        text = bool(self.secrets)  # every file: a value in a pickle or an event file is as plain as in a log
        if self.check:
            self.sent += length
            self.files.append({"path": path, "start": start, "bytes": length})
            return
        data = os.pread(descriptor, length, start)
        if text:
            data = data[: len(data) - held_back(data, self.secrets)]
            if not data and size > 0:
                return
        end = start + len(data)
        sent, count = masked(data, self.secrets) if text else (data, 0)
        self.sent += len(data)
        self.files.append(
            {
                "path": path,
                "start": start,
                "size": end,
                # The mtime only when the whole file went: a file sent in part is read again next time.
                "mtime": mtime if end == size else -1,
                "tail": digest_before(descriptor, end),
                "bytes": len(sent),
                "masked": count,
            }
        )
        if self.tar is not None:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(sent), found.st_mode & 0o777, int(found.st_mtime)
            self.tar.addfile(info, io.BytesIO(sent))


def part(
    job_dir: str, workspace: str, held: Mapping[str, Held], budget: int, check: bool = False
) -> dict[str, Any]:
    """This node's files of the job that differ from ``held`` (see the module's text): ``files`` (each:
    path, start, size, mtime, tail, bytes, masked; a link's target as ``link``), ``archive`` (a tar.gz of
    the pieces, base64; '' when nothing changed or in check mode), ``bytes`` (of files sent), ``wire`` (the
    archive's), ``pending`` (bytes left for a next sync), ``left_out``."""
    try:
        job = pack.open_job_dir(workspace, job_dir)
    except pack.PackError as error:
        raise SyncError(str(error)) from None
    buffer = io.BytesIO()
    try:
        try:
            secrets = pack.read_secrets(job)
        except pack.SecretsUnreadable as error:
            raise SyncError(
                f"job {os.path.basename(job_dir)}: {error} on {socket.gethostname()}, so its files could not"
                " be masked: nothing of it is sent from this node (what it would mask stays on the node at"
                " the final collect too)"
            ) from None
        if not secrets:
            _refuse_unmaskable(job, job_dir)
        with _archive(buffer, check) as tar:
            packer = _Packer(dict(held), secrets, budget, check, [], [], tar)
            for entry in walk(job):
                if entry.kind == "link":
                    packer.link(entry)
                elif entry.kind == "file":
                    packer.file(entry)
                elif entry.kind.startswith("skipped: "):
                    packer.left_out.append(f"{entry.path} ({entry.kind[len('skipped: ') :]})")
    finally:
        os.close(job)
    archive = buffer.getvalue() if packer.files and not check else b""
    return {
        "node": socket.gethostname(),
        "files": packer.files,
        "archive": base64.b64encode(archive).decode("ascii"),
        "bytes": packer.sent,
        "wire": len(archive),
        "pending": packer.pending,
        "left_out": packer.left_out[:SHOWN],
        "left_out_count": len(packer.left_out),
    }


def _refuse_unmaskable(job: int, job_dir: str) -> None:
    """Raise :class:`SyncError` when the job has secrets (job.json's ``secret_env``) but none of their values
    was read (secrets.json gone, unreadable, invalid or too large): what this node would send could not be
    masked. A job.json that cannot be read counts as one with secrets: nothing is sent unmasked on a guess."""
    declared: object = None
    try:
        descriptor = os.open(jobspec.JOB_FILE, pack.FILE, dir_fd=job)
        with os.fdopen(descriptor, "rb") as handle:
            found = json.loads(handle.read(JOB_FILE_LIMIT + 1)[:JOB_FILE_LIMIT].decode("utf-8"))
        declared = found.get("secret_env") if isinstance(found, dict) else None
        readable = isinstance(found, dict)
    except (OSError, ValueError):
        readable = False
    if readable and not declared:
        return
    if readable and _secrets_present(job):
        return  # read, every value shorter than what is masked: nothing to hide
    why = "its secrets.json is missing" if readable else "its job.json cannot be read"
    raise SyncError(
        f"job {os.path.basename(job_dir)} has secrets (secret_env) but {why} on {socket.gethostname()}, so"
        " its files could not be masked: nothing of it is sent from this node (its results, masked, come"
        " with the final collect: train.yml -e attach=ID)"
    )


def _secrets_present(job: int) -> bool:
    """Whether secrets.json is there (:func:`pack.read_secrets` read it: it raises on one it cannot)."""
    try:
        os.stat(pack.SECRETS, dir_fd=job, follow_symlinks=False)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _archive(buffer: io.BytesIO, check: bool) -> Iterator[tarfile.TarFile | None]:
    """A gzipped tar written into ``buffer``; none in check mode."""
    if check:
        yield None
        return
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        yield tar


def part_command(jobs_dir: str, job_id: str, budget: int, check: bool) -> str:
    """The shell command (over the mesh) that prints another node's :func:`part`."""
    line = (
        f". {node_jobs.NODE_ENV} && python -m {MODULE} --jobs-dir {shlex.quote(jobs_dir)}"
        f" --job {shlex.quote(job_id)} --part --budget {budget}"
    )
    return line + (" --check" if check else "")


def ask(mesh: Mesh, node: str, command: str, request: bytes) -> dict[str, Any]:
    """Run ``command`` on ``node`` over the mesh with ``request`` as its input; its JSON answer, or
    ``{"error": why}``."""
    try:
        done = subprocess.run(
            [*mesh.ssh(node), command], input=request, capture_output=True, timeout=PART_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {PART_TIMEOUT} s"}
    except OSError as error:
        return {"error": f"ssh could not start: {error}"}
    answer = node_jobs.parse(done.stdout.decode("utf-8", errors="replace"))
    if answer is None:
        said = (done.stderr or done.stdout).decode("utf-8", errors="replace").strip().splitlines()
        return {"error": (said[-1][:300] if said else "") or f"ssh exited with status {done.returncode}"}
    return answer


def gather(
    job_id: str, jobs_dir: str, manifest: Mapping[str, Any], mesh: Mesh, nodes: Sequence[str], check: bool
) -> dict[str, Any]:
    """On the job's first node: every node's :func:`part` at once (this one's here, the others' over the
    mesh), with what the controller lays them out by (the job's launcher, processes per node, state)."""
    job_dir = f"{jobs_dir}/{job_id}"
    workspace = os.path.dirname(jobs_dir) or "/"
    try:
        spec = jobspec.load(Path(job_dir, jobspec.JOB_FILE))
    except (OSError, jobspec.JobSpecError) as error:
        raise SyncError(f"job {job_id} has no readable job.json on {mesh.me}: {error}") from None
    found = job_status.read(Path(job_dir, job_status.FILE))
    order = list(dict.fromkeys([mesh.me, *nodes]))
    answer: dict[str, Any] = {
        "job": job_id,
        "first": mesh.me,
        "state": found.state if found is not None else "",
        "over": bool(found is not None and found.done),
        "launcher": spec.launcher,
        "nproc_per_node": spec.nproc_per_node,
        "nodes": order,
    }
    if answer["over"]:  # its final collect brings it all (train.yml -e attach=ID): the controller says so
        return answer
    budget = max(MIN_NODE_BUDGET, BUDGET // len(order))
    left = manifest.get("left")
    if isinstance(left, int) and not isinstance(left, bool):  # what the job's results_max_gb has left
        budget = min(budget, max(left, 0) // len(order))
    every = manifest.get("nodes")
    every = every if isinstance(every, Mapping) else {}

    def one(node: str) -> dict[str, Any]:
        held = every.get(node)
        if node == mesh.me:
            try:
                return part(job_dir, workspace, read_held(held), budget, check)
            except SyncError as error:
                return {"error": str(error)}
        request = json.dumps({"held": held if isinstance(held, Mapping) else {}}).encode()
        return ask(mesh, node, part_command(jobs_dir, job_id, budget, check), request)

    with ThreadPoolExecutor(max_workers=min(POOL, len(order))) as pool:
        answers = list(pool.map(one, order))
    return {**answer, "parts": dict(zip(order, answers, strict=True))}


def _read_request() -> dict[str, Any]:
    text = sys.stdin.read() if not sys.stdin.isatty() else ""
    try:
        found = json.loads(text) if text.strip() else {}
    except ValueError:
        raise SyncError("the controller's manifest on standard input is not JSON") from None
    return found if isinstance(found, dict) else {}


def run(args: argparse.Namespace, request: dict[str, Any]) -> dict[str, Any]:
    """The answer of the command line's ``args`` (see the module's text)."""
    jobs_dir = str(args.jobs_dir).rstrip("/")
    mesh = Mesh(socket.gethostname())
    if args.part:
        held = read_held(request.get("held"))
        return part(f"{jobs_dir}/{args.job}", os.path.dirname(jobs_dir) or "/", held, args.budget, args.check)
    if args.first:
        return gather(args.job, jobs_dir, request, mesh, args.nodes_now or [], args.check)
    located: Located = locate(args.job, jobs_dir, mesh, args.nodes or None)
    if located.here:
        return gather(args.job, jobs_dir, request, mesh, located.nodes, args.check)
    # The job's supervisor runs on another node: the request goes on there (one more hop, over the mesh).
    command = (
        f". {node_jobs.NODE_ENV} && python -m {MODULE} --jobs-dir {shlex.quote(jobs_dir)}"
        f" --job {shlex.quote(args.job)} --first --nodes-now {shlex.quote(','.join(located.nodes))}"
        + (" --check" if args.check else "")
    )
    answer = ask(mesh, located.first, command, json.dumps(request).encode())
    if "error" in answer and "parts" not in answer:
        answer["error"] = f"{located.first} (the job's first node): {answer['error']}"
    return {**answer, "via": mesh.me}


def _nodes(text: str) -> list[str]:
    return [node for node in text.split(",") if node]


def parser() -> argparse.ArgumentParser:
    """The command line (see the module's text)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}", description="A running job's changed files, for jobs.yml -e sync=ID."
    )
    parser.add_argument("--jobs-dir", default="/workspace/jobs", help="the jobs' directory in the node")
    parser.add_argument("--job", required=True, help="the job's id")
    parser.add_argument(
        "--nodes", type=_nodes, default=[], help="the cluster's nodes to look in (default: the mesh's)"
    )
    parser.add_argument("--check", action="store_true", help="say what would be sent, send nothing")
    parser.add_argument("--part", action="store_true", help="this node's files only")
    parser.add_argument("--first", action="store_true", help="this node runs the job's supervisor")
    parser.add_argument("--nodes-now", type=_nodes, default=[], help="with --first: the job's nodes now")
    parser.add_argument("--budget", type=int, default=BUDGET, help="bytes of files to send at most")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if not node_jobs.JOB_ID.fullmatch(args.job):
            raise SyncError(f"{args.job!r} is not a job id: jobs.yml lists the cluster's jobs")
        answer = run(args, _read_request())
    except (SyncError, JobNotFound) as error:
        print(json.dumps({"error": str(error)}))
        return 1
    print(json.dumps(answer, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
