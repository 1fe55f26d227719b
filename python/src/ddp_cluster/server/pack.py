"""Pack a node's job directory into one archive for the controller to fetch: the job's results, whatever its
end.

One module for the ``ddp_job`` role's Ansible module ``ddp_job_pack`` (which ships this file to the servers
as module_utils, so it uses the standard library only and runs on Python 3.8, the oldest a server may have)
and for the package. It runs on the server, not in the node container, so a node whose container died with
the job still sends its logs back.

- :func:`members`: everything under the job directory, parents before children, but the checkpoints under
  ``output/checkpoints/`` other than the newest ``epoch-*.ckpt`` (an epoch's ``epoch-NNNNN.ckpt`` or a
  mid-epoch ``epoch-NNNNN.step-SSSSSSSSS.ckpt``: the newest by name is the newest in training order), files
  ending in ``.tmp``, ``__pycache__`` directories, the job's files as sent (``job.tar.gz``) and the archive
  itself; a link (to a dataset's directory, say) goes in as the link;
- :func:`pack`: those paths into a gzipped tar, written under a temporary name beside the job directory and
  renamed over the archive, so a reader never sees half an archive;
- :func:`pack_job`: both, or in check mode only the count.
"""

from __future__ import annotations

import fnmatch
import os
import tarfile
import tempfile

CHECKPOINTS = os.path.join("output", "checkpoints")
# Both names of ddp_cluster.runtime.checkpoint_names (this file ships alone: it imports nothing of the
# package), epoch-NNNNN.ckpt and epoch-NNNNN.step-SSSSSSSSS.ckpt, zero-padded so that they sort by name in
# training order: epoch-00003.ckpt < epoch-00003.step-000000150.ckpt < epoch-00004.ckpt.
CHECKPOINT = "epoch-*.ckpt"
# The job's files as the controller sent them (the project is kept in runs/<job-id>/workdir.tar.gz already):
# ddp_cluster.job.spec.BUNDLE_FILE, spelled out here because this file ships alone to the servers.
BUNDLE = "job.tar.gz"


class PackError(Exception):
    """The job directory cannot be packed; the message says why."""


def skipped(name: str) -> bool:
    return name == "__pycache__" or name.endswith(".tmp")


def members(job_dir: str, archive: str) -> tuple[list[str], str]:
    """The paths to pack, relative to job_dir, parents before children; and the newest checkpoint's."""
    archive = os.path.abspath(archive)
    found: list[str] = []
    for directory, subdirectories, files in os.walk(job_dir):
        relative = os.path.relpath(directory, job_dir)
        subdirectories[:] = sorted(name for name in subdirectories if not skipped(name))
        # A link to a directory goes in as the link (as tar keeps it); the walk does not follow it.
        links = [name for name in subdirectories if os.path.islink(os.path.join(directory, name))]
        subdirectories[:] = [name for name in subdirectories if name not in links]
        if relative == CHECKPOINTS:
            subdirectories[:] = []
            continue
        if relative != ".":
            found.append(relative)
        for name in sorted(files + links):
            path = os.path.join(directory, name)
            if skipped(name) or os.path.abspath(path) == archive or (relative == "." and name == BUNDLE):
                continue
            found.append(os.path.normpath(os.path.join(relative, name)))
    checkpoints = os.path.join(job_dir, CHECKPOINTS)
    names = sorted(fnmatch.filter(os.listdir(checkpoints), CHECKPOINT)) if os.path.isdir(checkpoints) else []
    newest = os.path.join(CHECKPOINTS, names[-1]) if names else ""
    if newest:
        found += [path for path in ("output", CHECKPOINTS) if path not in found] + [newest]
    return found, newest


def pack(job_dir: str, archive: str, paths: list[str]) -> int:
    """Write ``paths`` (relative to job_dir) into the gzipped tar ``archive``, atomically; its size."""
    parent = os.path.dirname(os.path.abspath(job_dir))
    descriptor, temporary = tempfile.mkstemp(dir=parent, prefix=".pack-")
    try:
        with os.fdopen(descriptor, "wb") as handle, tarfile.open(fileobj=handle, mode="w:gz") as tar:
            for path in paths:
                try:
                    tar.add(os.path.join(job_dir, path), arcname=path, recursive=False)
                except FileNotFoundError:  # a file a rank removed while the node was being packed
                    continue
        os.chmod(temporary, 0o644)
        os.replace(temporary, archive)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return os.path.getsize(archive)


def pack_job(job_dir: str, archive: str, check: bool = False) -> dict[str, int | str]:
    """Pack job_dir into archive (in check mode, only count what would go in): members, bytes, checkpoint."""
    if not os.path.isdir(job_dir):
        raise PackError(f"the job directory {job_dir} is missing on this server: the job never reached it")
    paths, newest = members(job_dir, archive)
    size = 0
    if not check:
        try:
            size = pack(job_dir, archive, paths)
        except OSError as error:
            raise PackError(f"could not pack {job_dir} into {archive}: {error}") from error
    return {"members": len(paths), "bytes": size, "checkpoint": newest}
