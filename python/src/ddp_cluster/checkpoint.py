"""Checkpoints for a user's own training script: :func:`save` writes one where the job's recovery finds it,
whole or not at all; :func:`load` reads the one a start resumes from.

    from ddp_cluster import checkpoint

    state = checkpoint.load()  # what this start resumes from (DDP_RESUME_FROM), None on a fresh start
    start = state["epoch"] if state else 0
    if state:
        model.load_state_dict(state["model"])  # before the DDP wrap
        optimizer.load_state_dict(state["optimizer"])
    for epoch in range(start, epochs):
        ...
        checkpoint.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                         "epoch": epoch + 1}, epoch=epoch + 1)

:func:`save` runs on global rank 0 only (the others return None), into
``$DDP_JOB_DIR/output/checkpoints/`` under the documented name (``epoch-NNNNN.ckpt``, with ``step``
``epoch-NNNNN.step-SSSSSSSSS.ckpt``: :mod:`ddp_cluster.runtime.checkpoint_names`), with the package's header
(length and SHA-256, so that every copy is checked against it) before a ``torch.save`` payload. It is written
to a hidden temporary file, fsynced and renamed into place, so a crash leaves the previous checkpoints and
never half a file under a checkpoint's name; the payload streams to the file (never held whole in memory). A
plain ``torch.save`` under the same names is a checkpoint too; :func:`load` reads either kind, once it is
whole.

Torch is imported on first use: importing this module needs none.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any, BinaryIO

from ddp_cluster.errors import CheckpointError
from ddp_cluster.runtime import checkpoint_names
from ddp_cluster.runtime.checkpoint_names import HEADER, checkpoint_name, checkpoint_order

__all__ = ["folder", "load", "resume_from", "save"]


def folder() -> Path:
    """The job's checkpoint folder, ``$DDP_JOB_DIR/output/checkpoints``: where the supervisor finds, copies
    and resumes from them."""
    job_dir = os.environ.get("DDP_JOB_DIR", "")
    if not job_dir:
        raise CheckpointError(
            "DDP_JOB_DIR is not set (this is not a job started by train.yml): pass directory= to say where"
            " the checkpoints go"
        )
    return Path(job_dir) / "output" / checkpoint_names.FOLDER


def resume_from() -> Path | None:
    """The checkpoint this start resumes from (``DDP_RESUME_FROM``, set by a restart or ``-e resume=true``);
    None on a fresh start."""
    given = os.environ.get("DDP_RESUME_FROM", "")
    return Path(given) if given else None


def global_rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:
        pass
    rank = os.environ.get("RANK", "0")
    try:
        return int(rank)
    except ValueError:
        raise CheckpointError(f"RANK={rank!r} is not a whole number: the launcher sets it") from None


def whole_number(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CheckpointError(f"{name}={value!r} must be a whole number of {minimum} or more")
    return value


class HashingWriter:
    """Passes what torch.save writes on to the file, counting and hashing it for the header."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.length = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.length += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


class Payload(io.RawIOBase):
    """A checkpoint file read from past its header, as torch.load reads a file (it seeks within it)."""

    def __init__(self, handle: BinaryIO) -> None:
        super().__init__()
        self.handle = handle
        handle.seek(HEADER.size)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.handle.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            offset += HEADER.size
        return self.handle.seek(offset, whence) - HEADER.size

    def tell(self) -> int:
        return self.handle.tell() - HEADER.size


def save(
    obj: Any,
    epoch: int,
    step: int | None = None,
    *,
    directory: Path | str | None = None,
    keep: int | None = None,
) -> Path | None:
    """Write ``obj`` (what ``torch.save`` takes: a dict of state dicts, tensors, numbers) as the checkpoint of
    ``epoch`` completed epochs (with ``step``: the mid-epoch one at that global step) into ``directory``
    (default :func:`folder`), atomically, with the package's header; with ``keep``, delete all but the newest
    ``keep`` checkpoints there. On global rank 0 only: returns its path there, None on every other rank."""
    epoch = whole_number(epoch, "epoch", 0)
    step = None if step is None else whole_number(step, "step", 0)
    keep = None if keep is None else whole_number(keep, "keep", 1)
    if global_rank() != 0:
        return None
    import torch

    target = Path(directory) if directory is not None else folder()
    target.mkdir(parents=True, exist_ok=True)
    final = target / checkpoint_name(epoch, step)
    temporary = target / f".{final.name}.tmp-{os.getpid()}"
    try:
        with open(temporary, "wb") as out:
            out.write(bytes(HEADER.size))  # its place, written once the payload's length and hash are known
            writer = HashingWriter(out)
            torch.save(obj, writer)  # type: ignore[arg-type]
            out.seek(0)
            out.write(checkpoint_names.header_of(writer.length, writer.sha.digest()))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, final)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    checkpoint_names.fsync_folder(target)
    if keep is not None:
        found = sorted((order, path) for path in target.iterdir() if (order := checkpoint_order(path.name)))
        for _, old in found[:-keep]:
            old.unlink(missing_ok=True)
            checkpoint_names.record_path(old).unlink(missing_ok=True)
    return final


def load(
    path: Path | str | None = None, *, map_location: Any = "cpu", weights_only: bool = True
) -> Any | None:
    """The object a checkpoint holds, once it is whole (its header, its record or its zip archive:
    :mod:`ddp_cluster.runtime.checkpoint_names`; checked by streaming it), loaded with ``torch.load``
    (``map_location`` and ``weights_only`` are its own: pass ``weights_only=False`` for objects other than
    tensors, containers and numbers, from a file you trust). ``path`` defaults to :func:`resume_from`: None
    on a fresh start. CheckpointError naming the file when it is not whole or cannot be loaded."""
    if path is None:
        path = resume_from()
        if path is None:
            return None
    import torch

    record = checkpoint_names.read_record(path)
    try:
        with open(path, "rb") as handle:
            checked = checkpoint_names.check_handle(handle, path, record=record)
            if checked.problem:
                raise CheckpointError(checked.problem)
            source: Any = Payload(handle) if checked.kind == "ours" else handle
            source.seek(0)
            try:
                return torch.load(source, map_location=map_location, weights_only=weights_only)
            except Exception as error:
                raise CheckpointError(f"checkpoint {path} is whole but cannot be loaded: {error}") from error
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error}") from error
