"""Pack a node's job directory into one archive for the controller to fetch: the job's results, whatever its
end.

One module for the ``ddp_job`` role's Ansible module ``ddp_job_pack`` (which ships this file to the servers
as module_utils, so it uses the standard library only and runs on Python 3.8, the oldest a server may have)
and for the package. It runs on the server, not in the node container, so a node whose container died with
the job still sends its logs back.

It runs as root on the server, in a directory the node container (and so a job's code) can write: it never
follows a link. :func:`open_job_dir` opens the job directory one component at a time from the node's
workspace down, each without following a link, and refuses (naming it) a component that is a link, or a job
directory outside the workspace; every file is then opened relative to its directory's descriptor, never by
a path that a link could redirect.

- :func:`walk`: everything under the job directory, parents before children, but the checkpoints under
  ``output/checkpoints/`` other than the newest complete one (:func:`newest_checkpoint`), files ending in
  ``.tmp``, ``__pycache__`` directories, the job's files as sent (``job.tar.gz``), its secrets
  (``secrets.json``, never packed); a link (to a dataset's directory, say) goes in as the link; what is
  neither a file, a directory nor a link (a device, a fifo, a socket) is left out and named, and so is a
  directory nested deeper than :data:`MAX_DEPTH` (with all under it);
- :func:`newest_checkpoint`: of the ``epoch-NNNNN.ckpt`` and ``epoch-NNNNN.step-SSSSSSSSS.ckpt`` there, the
  newest in training order (by the numbers, not the text: ``epoch-10.ckpt`` is newer than ``epoch-9.ckpt``)
  that is complete, whatever wrote it: one with the package's header by its length and SHA-256, a user's plain
  ``torch.save`` file by its record ``.NAME.sha256`` when it has one (packed with it), else by its zip
  structure; a file of another format has nothing to check and is taken. A newer one that is not complete is
  named and passed over;
- :func:`admit`: what fits in the bytes the controller allows this node (``max_bytes``, its share of the job's
  ``results_max_gb``): directories and links, then files from the smallest up, so that the logs, status and
  metrics always come and a runaway file is what stays behind; a file over what is left, and a sparse file
  (:func:`sparse`: a 20 GiB file of holes costs its node nothing, but 20 GiB unpacked on the controller) are
  left on the node and named;
- :func:`pack`: those into a gzipped tar ``results.tar.gz`` in a new directory of the server's own (mode
  0700, ``ddp-pack-*`` in its temporary directory), never in the workspace: the controller fetches it from
  there as root, where nothing of the node container can swap it for a link. The values of the job's
  secrets (4 characters or more) are masked as ``***`` in every file packed but the checkpoints (and their
  records), read as a stream, a value split between two reads masked whole; a ``secrets.json`` that cannot be
  read (not JSON, over :data:`SECRETS_MAX`) masks nothing, so every file it would mask is left on the node,
  named, and ``secrets.json`` with them;
- :func:`pack_job`: all of it, then ``secrets.json`` removed from the node (the job is over: its values are
  not left on the server), or in check mode only the count; :func:`remove_archive`: the archive and its
  directory removed once the controller has it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import struct
import tarfile
import tempfile
import time
import zipfile
from typing import IO, Any, Dict, Iterable, Iterator, List, NamedTuple, Tuple

CHECKPOINTS = os.path.join("output", "checkpoints")
# ddp_cluster.runtime.checkpoint_names.NAME, spelled out (this file ships alone: it imports nothing of the
# package): epoch-NNNNN.ckpt and epoch-NNNNN.step-SSSSSSSSS.ckpt, ordered by (epoch, step), the order of
# training: epoch-00003.ckpt < epoch-00003.step-000000150.ckpt < epoch-00004.ckpt.
CHECKPOINT = re.compile(r"^epoch-(\d+)(?:\.step-(\d+))?\.ckpt$")
# The package's checkpoint header (checkpoint_names.MAGIC, HEADER): magic, payload length, payload SHA-256.
MAGIC = b"DDPCKPT1"
HEADER = struct.Struct("<8sQ32s")
# A plain checkpoint's record (checkpoint_names' sidecar): hidden, beside it, its SHA-256 (and size).
RECORD = ".{}.sha256"
ZIP = b"PK\x03\x04"
# The job's files as the controller sent them (the project is kept in runs/<job-id>/workdir.tar.gz already):
# ddp_cluster.job.spec.BUNDLE_FILE, spelled out here because this file ships alone to the servers.
BUNDLE = "job.tar.gz"
# The job's secrets on the node (NAME -> value, mode 0600): read to mask the values, never packed.
SECRETS = "secrets.json"
ARCHIVE = "results.tar.gz"
# The archive's own directory (tempfile.mkdtemp: the server's root's, mode 0700) is named ddp-pack-*.
SCRATCH = "ddp-pack-"
# Deeper directories are left out (named): the walk keeps one descriptor per level open.
MAX_DEPTH = 256
# Values shorter than this are not masked: they would blank ordinary words and figures of every log.
MASK_MIN = 4
MASK = b"***"
CHUNK = 1 << 20
# secrets.json is read whole, up to this: a rank's environment holds a few MB at most (Linux caps one variable
# at 128 KiB and a process's arguments and environment at a quarter of its stack), so more is not one the
# start wrote: it masks nothing, and what it would mask is left on the node.
SECRETS_MAX = 64 << 20
# The bytes a job's results may bring when the controller says none (it always does: its share of the job's
# results_max_gb, 256 GiB by default; python/tests/test_pack.py holds them equal).
DEFAULT_MAX_BYTES = 256 << 30
# A file is sparse when its holes hold more than its data and at least this much: what it costs its node is
# far below what it would cost the server's /tmp as gzip and the controller unpacked.
SPARSE_HOLES = 16 << 20
# A tar member's header (and a long name's extra header and text), and the block its data is padded to; the
# tar's end, its last record, is kept out of what members may take.
BLOCK = 512
DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a fifo swapped in after the listing does not hang the open; it is then refused by its fstat.
FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class PackError(Exception):
    """The job directory cannot be packed; the message says why."""


class Member(NamedTuple):
    """One entry of the job directory: its path (relative to it), its kind (``dir``, ``file``, ``link``), the
    descriptor of the directory that holds it and its name there."""

    path: str
    kind: str
    parent: int
    name: str


def skipped(name: str) -> bool:
    return name == "__pycache__" or name.endswith(".tmp")


def _link_problem(path: str, parent: int, name: str) -> str | None:
    """Why the component ``name`` (``path``) of the directory ``parent`` cannot be entered, when it is a link
    or not a directory; None when it is missing."""
    try:
        found = os.lstat(name, dir_fd=parent)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(found.st_mode):
        target = os.readlink(name, dir_fd=parent)
        return (
            f"{path} on this server is a symbolic link (to {target}), not a directory: something in the node"
            " container made it (a job's code can); nothing was read or written through it. Remove the link"
            f" (rm {path}) and run the job again under another job_id"
        )
    return f"{path} on this server is not a directory: remove it (rm {path}) and run the job again"


def open_job_dir(workspace: str, job_dir: str) -> int:
    """A descriptor of ``job_dir``, opened from ``workspace`` (the node's workspace on the server) down, one
    component at a time without following a link. :class:`PackError` names a component that is a link or
    not a directory, a job directory outside the workspace, or one that is missing."""
    top, job = os.path.abspath(workspace), os.path.abspath(job_dir)
    relative = os.path.relpath(job, top)
    if relative == os.curdir or relative.split(os.sep)[0] == os.pardir:
        raise PackError(
            f"the job directory {job_dir} is not inside the node's workspace {workspace}: nothing is packed"
            " from outside it (the plan names <workspace>/jobs/<job id>)"
        )
    try:
        descriptor = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the server's own
    except OSError as error:
        raise PackError(
            f"the node's workspace {workspace} cannot be opened on this server: {error}"
        ) from error
    path = top
    for part in relative.split(os.sep):
        path = os.path.join(path, part)
        try:
            entered = os.open(part, DIRECTORY, dir_fd=descriptor)
        except OSError as error:
            problem = _link_problem(path, descriptor, part) if error.errno != errno.ENOENT else None
            os.close(descriptor)
            if problem:
                raise PackError(problem) from None
            raise PackError(
                f"the job directory {job_dir} is missing on this server: the job never reached it"
            ) from None
        os.close(descriptor)
        descriptor = entered
    return descriptor


Chosen = Dict[str, Tuple[str, List[Tuple[str, str]]]]


def walk(job: int, chosen: Chosen | None = None) -> Iterator[Member]:
    """The members of the job directory opened as ``job`` (see the module's text), parents before children.
    A directory's descriptor is valid until the walk leaves it. What cannot go in is yielded with the kind
    ``skipped: <why>``. ``chosen``: the checkpoint an earlier walk chose (:func:`newest_checkpoint` reads
    every byte of it), kept there for the next."""
    yield from _walk(job, "", 1, {} if chosen is None else chosen)


def _walk(directory: int, relative: str, depth: int, chosen: Chosen) -> Iterator[Member]:
    with os.scandir(directory) as listing:
        entries = sorted(listing, key=lambda entry: entry.name)
    if relative == CHECKPOINTS:
        if relative not in chosen:
            chosen[relative] = newest_checkpoint(directory, [entry.name for entry in entries])
        newest, passed_over = chosen[relative]
        for name, why in passed_over:
            yield Member(os.path.join(relative, name), f"skipped: {why}", directory, name)
        keep = {newest, RECORD.format(newest)} if newest else set()
        entries = [entry for entry in entries if entry.name in keep]
    for entry in entries:
        name, path = entry.name, os.path.join(relative, entry.name)
        if skipped(name) or (not relative and name in (BUNDLE, SECRETS)):
            continue
        if entry.is_symlink():
            yield Member(path, "link", directory, name)
        elif entry.is_dir(follow_symlinks=False):
            if depth > MAX_DEPTH:  # a recursion this deep would overflow Python's stack
                yield Member(path, f"skipped: nested deeper than {MAX_DEPTH} directories", directory, name)
                continue
            try:
                inner = os.open(name, DIRECTORY, dir_fd=directory)
            except OSError as error:  # swapped for a link since the listing, or removed
                yield Member(path, f"skipped: {error.strerror}", directory, name)
                continue
            try:
                yield Member(path, "dir", directory, name)
                yield from _walk(inner, path, depth + 1, chosen)
            finally:
                os.close(inner)
        elif entry.is_file(follow_symlinks=False):
            yield Member(path, "file", directory, name)
        else:
            kind = os.lstat(name, dir_fd=directory).st_mode
            what = "a fifo" if stat.S_ISFIFO(kind) else "a socket" if stat.S_ISSOCK(kind) else "a device"
            yield Member(path, f"skipped: {what}", directory, name)


def checkpoint_order(name: str) -> tuple[int, int] | None:
    """(epoch, step) of a checkpoint's name (step 0 at an epoch's end); None for any other name."""
    found = CHECKPOINT.match(name)
    return (int(found.group(1)), int(found.group(2) or 0)) if found else None


def _digest(handle: IO[bytes], length: int) -> bytes:
    """The SHA-256 of the next ``length`` bytes of ``handle`` (b'' when it has fewer)."""
    digest, left = hashlib.sha256(), length
    while left > 0:
        chunk = handle.read(min(CHUNK, left))
        if not chunk:
            return b""
        digest.update(chunk)
        left -= len(chunk)
    return digest.digest()


def _record(directory: int, name: str) -> tuple[str, int | None] | None:
    """The record ``.NAME.sha256`` beside a plain checkpoint: (its SHA-256 in hex, its size or None), None
    when there is none. JSON (``{"sha256": ..., "size": ...}``) or sha256sum's line (``HEX  NAME``)."""
    try:
        descriptor = os.open(RECORD.format(name), FILE, dir_fd=directory)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as handle:
        text = handle.read(4096).decode("utf-8", errors="replace").strip()
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if isinstance(found, dict):
        size = found.get("size")
        return str(found.get("sha256", "")).lower(), size if isinstance(size, int) else None
    return (text.split() or [""])[0].lower(), None


def checkpoint_problem(directory: int, name: str) -> str:
    """What makes the checkpoint ``name`` of ``directory`` incomplete ('' when nothing): with the package's
    header, its length and SHA-256; a plain file by its record's SHA-256 (and size) when it has one, else a
    zip (torch.save's format) by its central directory; another format has nothing to check."""
    try:
        descriptor = os.open(name, FILE, dir_fd=directory)
    except OSError as error:
        return f"cannot be read: {error.strerror or error}"
    with os.fdopen(descriptor, "rb") as handle:
        found = os.fstat(descriptor)
        if not stat.S_ISREG(found.st_mode):
            return "not a regular file"
        head = handle.read(HEADER.size)
        if head[: len(MAGIC)] == MAGIC:
            if len(head) < HEADER.size:
                return f"truncated: {found.st_size} bytes, shorter than its header"
            _, length, digest = HEADER.unpack(head)
            if found.st_size - HEADER.size != length:
                return f"truncated: its header says {length} bytes, it holds {found.st_size - HEADER.size}"
            return "" if _digest(handle, length) == digest else "corrupt: its SHA-256 is not its header's"
        record = _record(directory, name)
        if record is not None:
            digest_hex, size = record
            if size is not None and size != found.st_size:
                return f"truncated: {found.st_size} bytes, its record {RECORD.format(name)} says {size}"
            handle.seek(0)
            if _digest(handle, found.st_size).hex() != digest_hex:
                return f"corrupt: its SHA-256 is not the one its record {RECORD.format(name)} holds"
            return ""
        if head[: len(ZIP)] == ZIP:
            handle.seek(0)
            try:
                with zipfile.ZipFile(handle) as archive:
                    archive.infolist()
            except (zipfile.BadZipFile, OSError, ValueError, EOFError) as error:
                return f"an incomplete zip (torch.save's format): {error}"
    return ""


def newest_checkpoint(directory: int, names: Iterable[str]) -> tuple[str, list[tuple[str, str]]]:
    """Of ``names`` (a checkpoint folder's entries), the newest checkpoint in training order that is
    complete (:func:`checkpoint_problem`), '' when none; and the newer ones passed over, each with why."""
    ordered = sorted((order, name) for name in names if (order := checkpoint_order(name)) is not None)
    passed_over: list[tuple[str, str]] = []
    for _, name in reversed(ordered):
        problem = checkpoint_problem(directory, name)
        if not problem:
            return name, passed_over
        passed_over.append((name, f"a checkpoint that is not complete: {problem}; an older one packed"))
    return "", passed_over


def data_bytes(descriptor: int, size: int) -> int:
    """How many of a file's ``size`` bytes are data, not holes (SEEK_DATA / SEEK_HOLE; ``size`` where the
    file system cannot say)."""
    data, offset = 0, 0
    try:
        while offset < size:
            start = os.lseek(descriptor, offset, os.SEEK_DATA)
            end = os.lseek(descriptor, start, os.SEEK_HOLE)
            data += end - start
            offset = end
    except OSError as error:
        if error.errno != errno.ENXIO:  # ENXIO: no data after offset (the rest is a hole)
            return size
    return data


def sparse(descriptor: int, found: os.stat_result) -> str:
    """Why the open file ``descriptor`` (``found``: its fstat) is sparse ('' when it is not): its holes hold
    more than its data and at least :data:`SPARSE_HOLES` bytes. Blocks allocated for all its bytes: no
    hole to look for (a compressing file system allocates fewer, so the holes are asked for too)."""
    size = found.st_size
    if size < SPARSE_HOLES or found.st_blocks * 512 >= size:
        return ""
    data = data_bytes(descriptor, size)
    if size - data < SPARSE_HOLES or data * 2 > size:
        return ""
    return (
        f"sparse: {size} bytes, {data} of them data: it would fill the server's /tmp and the controller's"
        " disk with its holes; left on the node"
    )


def cost(path: str, size: int = 0) -> int:
    """The bytes a member takes in the (uncompressed) tar: its header, a long name's, and its data padded."""
    named = BLOCK + len(path.encode()) + BLOCK if len(path.encode()) >= 100 else 0
    return BLOCK + named + -(-size // BLOCK) * BLOCK


class SecretsUnreadable(PackError):
    """The job's secrets.json is there but cannot be read as the start writes it: nothing can be masked."""


def read_secrets(job: int) -> list[bytes]:
    """The byte strings to mask, as :func:`ddp_cluster.job.secrets.forms` gives them (this file ships alone):
    each secret value of MASK_MIN characters or more (and each line of one of several), and its JSON-escaped
    form (status.json quotes the ranks' last lines); longest first. None when there is no secrets.json;
    :class:`SecretsUnreadable` saying why when it is there but cannot be read whole (over
    :data:`SECRETS_MAX`, not a JSON object of strings): its values would go unmasked."""
    try:
        descriptor = os.open(SECRETS, FILE, dir_fd=job)
    except FileNotFoundError:
        return []
    except OSError as error:
        raise SecretsUnreadable(f"{SECRETS} cannot be opened: {error.strerror or error}") from None
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise SecretsUnreadable(f"{SECRETS} is not a regular file")
        data = handle.read(SECRETS_MAX + 1)
    if len(data) > SECRETS_MAX:
        raise SecretsUnreadable(f"{SECRETS} is over {SECRETS_MAX} bytes: not one the job's start wrote")
    try:
        found = json.loads(data.decode("utf-8"))
    except ValueError as error:
        raise SecretsUnreadable(f"{SECRETS} is not JSON ({error})") from None
    if not isinstance(found, dict):
        raise SecretsUnreadable(f"{SECRETS} holds no object of NAME: value")
    values = [str(value) for value in found.values()]
    # A value of several lines also line by line, as ddp_cluster.job.secrets.forms has it (a log shows it so).
    values += [line for value in values if "\n" in value or "\r" in value for line in value.splitlines()]
    forms = {
        form.encode()
        for value in values
        if len(value) >= MASK_MIN
        for form in (value, json.dumps(value)[1:-1])
    }
    return sorted(forms, key=len, reverse=True)


def _mask(source: IO[bytes], secrets: list[bytes], target: IO[bytes], limit: int) -> int:
    """Copy at most ``limit`` bytes of ``source`` to ``target`` with every secret replaced by MASK; how many
    were. A value split across two reads is kept back until it is whole."""
    keep = max(len(secret) for secret in secrets) - 1
    masked, pending, left = 0, b"", limit
    while True:
        chunk = source.read(min(CHUNK, left))
        left -= len(chunk)
        pending += chunk
        for secret in secrets:
            masked += pending.count(secret)
            pending = pending.replace(secret, MASK)
        if not chunk:
            target.write(pending)
            return masked
        cut = max(len(pending) - keep, 0)
        target.write(pending[:cut])
        pending = pending[cut:]


class _Hashing:
    """A writable file that keeps the SHA-256 of what went through it (the archive's, from this process's
    own bytes: what the controller fetches is checked against it)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


def in_checkpoints(path: str) -> bool:
    """Whether ``path`` is in the checkpoint folder: a checkpoint or its record, never masked."""
    return path.startswith(CHECKPOINTS + os.sep)


class Admitted(NamedTuple):
    """What :func:`admit` lets into the archive: the files (path -> the bytes they cost there), and what it
    leaves out, each as ``path (why)``."""

    files: dict[str, int]
    left_out: list[str]
    chosen: Chosen


def admit(job: int, max_bytes: int, unmaskable: str = "") -> Admitted:
    """Walk the job directory opened as ``job`` and choose what fits in ``max_bytes`` of tar (see the module's
    text): directories and links first, in the walk's order, then files from the smallest up; a sparse file
    and one over what is left are left out, named. ``unmaskable``: why the secrets could not be read, so
    every file outside the checkpoint folder is left out (one line names how many)."""
    left_out: list[str] = []
    files: list[tuple[int, str, int]] = []
    spent, unmasked = tarfile.RECORDSIZE, 0
    chosen: Chosen = {}
    for member in walk(job, chosen):
        if member.kind.startswith("skipped: "):
            left_out.append(f"{member.path} ({member.kind[len('skipped: ') :]})")
            continue
        if member.kind != "file":
            if spent + cost(member.path) <= max_bytes:
                spent += cost(member.path)
            else:
                left_out.append(f"{member.path} (over the {max_bytes} bytes this node's results may bring)")
            continue
        if unmaskable and not in_checkpoints(member.path):
            unmasked += 1
            continue
        try:
            descriptor = os.open(member.name, FILE, dir_fd=member.parent)
        except OSError:
            continue  # removed since the listing (or not a file): the pack names what it cannot read
        try:
            found = os.fstat(descriptor)
            why = sparse(descriptor, found) if stat.S_ISREG(found.st_mode) else ""
        finally:
            os.close(descriptor)
        if why:
            left_out.append(f"{member.path} ({why})")
        else:
            files.append((cost(member.path, found.st_size), member.path, found.st_size))
    admitted: dict[str, int] = {}
    for taken, path, size in sorted(files):
        if spent + taken <= max_bytes:
            admitted[path] = taken
            spent += taken
        else:
            left_out.append(
                f"{path} ({size} bytes: over the {max(max_bytes - spent, 0)} bytes left of the {max_bytes}"
                " this node's results may bring (train.yml -e results_max_gb); left on the node)"
            )
    if unmasked:
        left_out.append(
            f"{unmasked} file(s) outside {CHECKPOINTS} ({unmaskable}: their secrets could not be masked, so"
            f" they are left on the node, with {SECRETS})"
        )
    return Admitted(admitted, left_out, chosen)


class _Budget:
    """What the archive may still take while it is written: the files :func:`admit` chose, within
    ``max_bytes`` however they changed since."""

    def __init__(self, admitted: Admitted, max_bytes: int) -> None:
        self.files = admitted.files
        self.left = max_bytes - tarfile.RECORDSIZE

    def take(self, path: str, size: int = 0) -> bool:
        taken = cost(path, size)
        if taken > self.left:
            return False
        self.left -= taken
        return True


def _add_file(tar: tarfile.TarFile, member: Member, secrets: list[bytes], budget: _Budget) -> str:
    """Add a regular file, opened without following a link; '' or why it was left out ("chosen": left out
    by :func:`admit`, which named it)."""
    if member.path not in budget.files:
        return "chosen"
    try:
        descriptor = os.open(member.name, FILE, dir_fd=member.parent)
    except FileNotFoundError:  # a file a rank removed while the node was being packed
        return "removed while packed"
    except OSError as error:
        return error.strerror or str(error)
    with os.fdopen(descriptor, "rb") as handle:
        found = os.fstat(descriptor)
        if not stat.S_ISREG(found.st_mode):
            return "not a regular file"
        info = tarfile.TarInfo(member.path)
        info.mode, info.mtime, info.size = found.st_mode & 0o777, int(found.st_mtime), found.st_size
        if not secrets or in_checkpoints(member.path):
            if not budget.take(member.path, found.st_size):
                return f"grew to {found.st_size} bytes while packed, over what this node's results may bring"
            tar.addfile(info, handle)
            return ""
        with tempfile.TemporaryFile() as spool:
            _mask(handle, secrets, spool, found.st_size)
            info.size = spool.tell()
            if not budget.take(member.path, info.size):
                return f"grew to {found.st_size} bytes while packed, over what this node's results may bring"
            spool.seek(0)
            tar.addfile(info, spool)
    return ""


def _add(tar: tarfile.TarFile, member: Member, secrets: list[bytes], budget: _Budget) -> str:
    """Add one member; '' or why it was left out ("gone": removed while the node was being packed; "chosen":
    left out and named by :func:`admit`)."""
    if member.kind.startswith("skipped: "):
        return "chosen"
    if member.kind == "file":
        return _add_file(tar, member, secrets, budget)
    info = tarfile.TarInfo(member.path)
    try:
        found = os.lstat(member.name, dir_fd=member.parent)
        if member.kind == "dir":
            info.type, info.mode = tarfile.DIRTYPE, found.st_mode & 0o777
        else:
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(member.name, dir_fd=member.parent)
    except OSError:
        return "gone"
    if not budget.take(member.path):
        return "chosen"
    info.mtime = int(found.st_mtime)
    tar.addfile(info)
    return ""


def pack(
    folder: int, members: Iterable[Member], secrets: list[bytes], admitted: Admitted, max_bytes: int
) -> dict[str, Any]:
    """Write ``members`` (taken as they come: their directories' descriptors live while the walk runs) that
    :func:`admit` let in (``admitted``) into the gzipped tar :data:`ARCHIVE` of the directory opened as
    ``folder`` (the server's own: see :func:`pack_job`), its tar never over ``max_bytes``; members, bytes,
    sha256, checkpoint (the one packed) and left_out (what was left out, and why)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(ARCHIVE, flags, 0o600, dir_fd=folder)
    left_out = list(admitted.left_out)
    budget = _Budget(admitted, max_bytes)
    count, newest = 0, ""
    with os.fdopen(descriptor, "wb") as raw:
        hashing = _Hashing(raw)
        with tarfile.open(fileobj=hashing, mode="w:gz") as tar:  # type: ignore[call-overload]
            for member in members:
                why = _add(tar, member, secrets, budget)
                if why in ("gone", "chosen"):
                    continue
                if why:
                    left_out.append(f"{member.path} ({why})")
                    continue
                count += 1
                if in_checkpoints(member.path) and checkpoint_order(member.name) is not None:
                    newest = member.path
    return {
        "members": count,
        "bytes": hashing.size,
        "sha256": hashing.digest.hexdigest(),
        "checkpoint": newest,
        "left_out": left_out,
    }


def _secrets(job: int) -> tuple[list[bytes], str]:
    """The values to mask, or why they cannot be read ('' when they can)."""
    try:
        return read_secrets(job), ""
    except SecretsUnreadable as error:
        return [], str(error)


def members(
    job_dir: str, workspace: str, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[list[str], str, list[str]]:
    """What :func:`pack_job` would pack within ``max_bytes``: the paths, the checkpoint, and what it would
    leave out."""
    job = open_job_dir(workspace, job_dir)
    try:
        admitted = admit(job, max_bytes, _secrets(job)[1])
        found = [
            m for m in walk(job, admitted.chosen) if m.kind in ("dir", "link") or m.path in admitted.files
        ]
    finally:
        os.close(job)
    paths = [member.path for member in found]
    newest = [m.path for m in found if in_checkpoints(m.path) and checkpoint_order(m.name) is not None]
    return paths, newest[0] if newest else "", admitted.left_out


# How long a pack waits for the job's supervisor on this server to end (it writes the job's last status, then
# ends; the collect follows that status at once), before it refuses: a job that still runs is not packed.
SUPERVISOR_WAIT = 30.0
SUPERVISOR_MODULE = b"ddp_cluster.supervise"


def supervisor_pids(job_id: str, proc: str = "/proc") -> list[int]:
    """The processes on this server (in any of its containers: the server sees theirs) of the supervisor of
    job ``job_id``: ``python -m ddp_cluster.supervise --job-dir <...>/jobs/<job_id>``."""
    found = []
    suffix = ("/jobs/" + job_id).encode()
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "cmdline"), "rb") as handle:
                words = handle.read(1 << 16).split(b"\0")
        except OSError:  # it ended meanwhile, or is not ours to read
            continue
        if SUPERVISOR_MODULE not in words or b"--job-dir" not in words:
            continue
        where = words.index(b"--job-dir") + 1
        if where < len(words) and words[where].rstrip(b"/").endswith(suffix):
            found.append(int(name))
    return found


def await_supervisor_end(job_dir: str, wait: float = SUPERVISOR_WAIT, proc: str = "/proc") -> None:
    """Return once no supervisor of the job of ``job_dir`` runs on this server (within ``wait`` seconds);
    PackError naming it otherwise: the controller took the job for ended (its first node did not answer),
    but it runs, and its results and secrets stay where they are."""
    job_id = os.path.basename(job_dir.rstrip("/"))
    deadline = time.monotonic() + wait
    while True:
        pids = supervisor_pids(job_id, proc)
        if not pids or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if pids:
        raise PackError(
            "the job still runs on this server (its supervisor, pid"
            " " + ", ".join(str(pid) for pid in pids) + "): its results were not packed and its secrets"
            " are kept. Follow it: ansible-playbook train.yml -e attach=" + job_id + "; or stop it:"
            " ansible-playbook jobs.yml -e stop="
            + job_id
            + ", then collect it with train.yml -e attach="
            + job_id
        )


def pack_job(
    job_dir: str,
    workspace: str,
    check: bool = False,
    into: str | None = None,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """Pack job_dir, found from the node's ``workspace`` down without following a link, into ``archive`` (in
    the result): :data:`ARCHIVE` in a new directory of mode 0700 under ``into`` (the server's temporary
    directory), never in the workspace, whose files a node container can swap before the fetch. Its tar holds
    at most ``max_bytes`` (this node's share of the job's results_max_gb; :func:`admit`). Then
    ``secrets.json`` is removed from the job directory (a second pack has no values left to mask), unless it
    could not be read (what it would mask stays on the node with it). In check mode, only count what would go
    in (``archive`` is empty). See :func:`pack`."""
    limit = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    if limit < 0:
        raise PackError(f"max_bytes={max_bytes} must be 0 or more: the bytes this node's results may bring")
    if check:
        paths, newest, left_out = members(job_dir, workspace, limit)
        return {
            "archive": "",
            "members": len(paths),
            "bytes": 0,
            "sha256": "",
            "checkpoint": newest,
            "left_out": left_out,
        }
    await_supervisor_end(job_dir)
    job = open_job_dir(workspace, job_dir)
    scratch = ""
    try:
        secrets, unmaskable = _secrets(job)
        admitted = admit(job, limit, unmaskable)
        scratch = tempfile.mkdtemp(prefix=SCRATCH, dir=into)  # mode 0700, this process's (root's)
        folder = os.open(scratch, DIRECTORY)
        try:
            packed = pack(folder, walk(job, admitted.chosen), secrets, admitted, limit)
        finally:
            os.close(folder)
        if not unmaskable:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(SECRETS, dir_fd=job)  # the job is over: its secrets are not left on the server
    except OSError as error:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        raise PackError(f"could not pack {job_dir}: {error}") from error
    except BaseException:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    finally:
        os.close(job)
    return {"archive": os.path.join(scratch, ARCHIVE), **packed}


def remove_archive(archive: str) -> bool:
    """Remove ``archive`` (once the controller fetched it) and its directory, both :func:`pack_job`'s;
    whether there was one. Anything else is refused: the path comes from the controller, but this runs as
    root."""
    folder = os.path.dirname(archive)
    if os.path.basename(archive) != ARCHIVE or not os.path.basename(folder).startswith(SCRATCH):
        raise PackError(
            f"{archive} is not an archive of ddp_job_pack (<temporary directory>/{SCRATCH}*/{ARCHIVE}):"
            " nothing was removed"
        )
    try:
        os.unlink(archive)
    except FileNotFoundError:
        removed = False
    except OSError as error:
        raise PackError(f"could not remove {archive}: {error}") from error
    else:
        removed = True
    try:
        os.rmdir(folder)
    except FileNotFoundError:
        pass
    except OSError as error:
        raise PackError(f"could not remove {folder}: {error}") from error
    return removed
