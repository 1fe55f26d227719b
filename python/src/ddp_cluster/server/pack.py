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
  ``output/checkpoints/`` other than the newest ``epoch-*.ckpt`` (an epoch's ``epoch-NNNNN.ckpt`` or a
  mid-epoch ``epoch-NNNNN.step-SSSSSSSSS.ckpt``: the newest by name is the newest in training order), files
  ending in ``.tmp``, ``__pycache__`` directories, the job's files as sent (``job.tar.gz``), its secrets
  (``secrets.json``, never packed); a link (to a dataset's directory, say) goes in as the link; what is
  neither a file, a directory nor a link (a device, a fifo, a socket) is left out and named, and so is a
  directory nested deeper than :data:`MAX_DEPTH` (with all under it);
- :func:`pack`: those into a gzipped tar ``results.tar.gz`` in a new directory of the server's own (mode
  0700, ``ddp-pack-*`` in its temporary directory), never in the workspace: the controller fetches it from
  there as root, where nothing of the node container can swap it for a link. The values of the job's
  secrets (4 characters or more) are masked as ``***`` in every text file packed (not in checkpoints);
- :func:`pack_job`: both, then ``secrets.json`` removed from the node (the job is over: its values are not
  left on the server), or in check mode only the count; :func:`remove_archive`: the archive and its
  directory removed once the controller has it.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import json
import os
import shutil
import stat
import tarfile
import tempfile
from typing import IO, Any, Iterable, Iterator, NamedTuple

CHECKPOINTS = os.path.join("output", "checkpoints")
# Both names of ddp_cluster.runtime.checkpoint_names (this file ships alone: it imports nothing of the
# package), epoch-NNNNN.ckpt and epoch-NNNNN.step-SSSSSSSSS.ckpt, zero-padded so that they sort by name in
# training order: epoch-00003.ckpt < epoch-00003.step-000000150.ckpt < epoch-00004.ckpt.
CHECKPOINT = "epoch-*.ckpt"
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
# A file whose first bytes hold a NUL is not text: it is packed as it is.
TEXT_PROBE = 8192
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


def walk(job: int) -> Iterator[Member]:
    """The members of the job directory opened as ``job`` (see the module's text), parents before children.
    A directory's descriptor is valid until the walk leaves it. What cannot go in is yielded with the kind
    ``skipped: <why>``."""
    yield from _walk(job, "", 1)


def _walk(directory: int, relative: str, depth: int) -> Iterator[Member]:
    with os.scandir(directory) as listing:
        entries = sorted(listing, key=lambda entry: entry.name)
    if relative == CHECKPOINTS:
        names = [
            entry.name
            for entry in entries
            if fnmatch.fnmatch(entry.name, CHECKPOINT) and entry.is_file(follow_symlinks=False)
        ]
        entries = [entry for entry in entries if names and entry.name == names[-1]]
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
                yield from _walk(inner, path, depth + 1)
            finally:
                os.close(inner)
        elif entry.is_file(follow_symlinks=False):
            yield Member(path, "file", directory, name)
        else:
            kind = os.lstat(name, dir_fd=directory).st_mode
            what = "a fifo" if stat.S_ISFIFO(kind) else "a socket" if stat.S_ISSOCK(kind) else "a device"
            yield Member(path, f"skipped: {what}", directory, name)


def read_secrets(job: int) -> list[bytes]:
    """The byte strings to mask: each secret value of MASK_MIN characters or more, and its JSON-escaped form
    (status.json quotes the ranks' last lines); longest first."""
    try:
        descriptor = os.open(SECRETS, FILE, dir_fd=job)
    except OSError:
        return []
    with os.fdopen(descriptor, "rb") as handle:
        try:
            found = json.loads(handle.read(1 << 20).decode("utf-8"))
        except ValueError:
            return []
    values = [value for value in found.values() if isinstance(value, str)] if isinstance(found, dict) else []
    forms = {
        form.encode()
        for value in values
        if len(value) >= MASK_MIN
        for form in (value, json.dumps(value)[1:-1])
    }
    return sorted(forms, key=len, reverse=True)


def _mask(source: IO[bytes], first: bytes, secrets: list[bytes], target: IO[bytes]) -> int:
    """Copy ``first`` then the rest of ``source`` to ``target`` with every secret replaced by MASK; how many
    were. A value split across two reads is kept back until it is whole."""
    keep = max(len(secret) for secret in secrets) - 1
    masked, pending = 0, first
    while True:
        chunk = source.read(CHUNK)
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


def _add_file(tar: tarfile.TarFile, member: Member, secrets: list[bytes]) -> str:
    """Add a regular file, opened without following a link; '' or why it was left out."""
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
        first = handle.read(TEXT_PROBE)
        text = secrets and not member.path.startswith(CHECKPOINTS + os.sep) and b"\0" not in first
        if not text:
            handle.seek(0)
            tar.addfile(info, handle)
            return ""
        with tempfile.TemporaryFile() as spool:
            _mask(handle, first, secrets, spool)
            info.size = spool.tell()
            spool.seek(0)
            tar.addfile(info, spool)
    return ""


def _add(tar: tarfile.TarFile, member: Member, secrets: list[bytes]) -> str:
    """Add one member; '' or why it was left out ("gone": removed while the node was being packed)."""
    if member.kind.startswith("skipped: "):
        return member.kind[len("skipped: ") :]
    if member.kind == "file":
        return _add_file(tar, member, secrets)
    info = tarfile.TarInfo(member.path)
    try:
        found = os.lstat(member.name, dir_fd=member.parent)
        if member.kind == "dir":
            info.type, info.mode = tarfile.DIRTYPE, found.st_mode & 0o777
        else:
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(member.name, dir_fd=member.parent)
    except OSError:
        return "gone"
    info.mtime = int(found.st_mtime)
    tar.addfile(info)
    return ""


def pack(folder: int, members: Iterable[Member], secrets: list[bytes]) -> dict[str, Any]:
    """Write ``members`` (taken as they come: their directories' descriptors live while the walk runs) into
    the gzipped tar :data:`ARCHIVE` of the directory opened as ``folder`` (the server's own: see
    :func:`pack_job`); members, bytes, sha256, checkpoint (the one packed) and left_out (what was left out,
    and why)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(ARCHIVE, flags, 0o600, dir_fd=folder)
    left_out: list[str] = []
    count, newest = 0, ""
    with os.fdopen(descriptor, "wb") as raw:
        hashing = _Hashing(raw)
        with tarfile.open(fileobj=hashing, mode="w:gz") as tar:  # type: ignore[call-overload]
            for member in members:
                why = _add(tar, member, secrets)
                if why == "gone":
                    continue
                if why:
                    left_out.append(f"{member.path} ({why})")
                    continue
                count += 1
                if member.path.startswith(CHECKPOINTS + os.sep):
                    newest = member.path
    return {
        "members": count,
        "bytes": hashing.size,
        "sha256": hashing.digest.hexdigest(),
        "checkpoint": newest,
        "left_out": left_out,
    }


def members(job_dir: str, workspace: str) -> tuple[list[str], str, list[str]]:
    """What :func:`pack_job` would pack: the paths, the checkpoint, and what it would leave out."""
    job = open_job_dir(workspace, job_dir)
    try:
        found = list(walk(job))
    finally:
        os.close(job)
    paths = [member.path for member in found if not member.kind.startswith("skipped: ")]
    newest = [path for path in paths if path.startswith(CHECKPOINTS + os.sep)]
    left_out = [f"{m.path} ({m.kind[len('skipped: ') :]})" for m in found if m.kind.startswith("skipped: ")]
    return paths, newest[0] if newest else "", left_out


def pack_job(job_dir: str, workspace: str, check: bool = False, into: str | None = None) -> dict[str, Any]:
    """Pack job_dir, found from the node's ``workspace`` down without following a link, into ``archive`` (in
    the result): :data:`ARCHIVE` in a new directory of mode 0700 under ``into`` (the server's temporary
    directory), never in the workspace, whose files a node container can swap before the fetch. Then
    ``secrets.json`` is removed from the job directory (a second pack has no values left to mask). In check
    mode, only count what would go in (``archive`` is empty). See :func:`pack`."""
    if check:
        paths, newest, left_out = members(job_dir, workspace)
        return {
            "archive": "",
            "members": len(paths),
            "bytes": 0,
            "sha256": "",
            "checkpoint": newest,
            "left_out": left_out,
        }
    job = open_job_dir(workspace, job_dir)
    scratch = ""
    try:
        scratch = tempfile.mkdtemp(prefix=SCRATCH, dir=into)  # mode 0700, this process's (root's)
        folder = os.open(scratch, DIRECTORY)
        try:
            packed = pack(folder, walk(job), read_secrets(job))
        finally:
            os.close(folder)
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
