"""The checkpoints' file names, without torch: what the ranks write, the supervisor resumes from and the
controller's planner finds.

``epoch-NNNNN.ckpt`` at the end of an epoch, N the epochs completed, and ``epoch-NNNNN.step-SSSSSSSSS.ckpt``
in the middle of one (``--checkpoint-every``), after N completed epochs and S optimizer steps in all. Both are
zero-padded, so sorting the names as plain strings (as :mod:`ddp_cluster.server.pack` does, which ships
alone to the servers and spells the pattern as the glob ``epoch-*.ckpt``) and sorting by (epoch, step) give
the same order, the order of training: ``epoch-00003.ckpt`` < ``epoch-00003.step-000000150.ckpt`` <
``epoch-00004.ckpt``.
A temporary file (a hidden name, a suffix after ``.ckpt``) is never a checkpoint.

A checkpoint file carries its own checksum: a 48-byte header (:data:`HEADER`: magic ``DDPCKPT1``, the
payload's length as a little-endian uint64, the payload's SHA-256), then the payload. :func:`verify_file`
checks a file against it by streaming (a checkpoint of many GB is never held in memory), and
:func:`install_verified` renames a copy into place only once it verifies; both run where the supervisor's
copies of the checkpoints go, on this node or on another node's own Python::

    python -m ddp_cluster.runtime.checkpoint_names --verify PATH [--rename-to FINAL]

(exit 0 when it verifies, else 1 with what is wrong on stderr).

Standard library only: the supervisor and the controller read these names and import no torch.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import struct
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

# epoch-NNNNN.ckpt (group 1: epochs completed) or epoch-NNNNN.step-SSSSSSSSS.ckpt (group 2: global step)
NAME = re.compile(r"^epoch-(\d+)(?:\.step-(\d+))?\.ckpt$")
# The folder under a job's output directory that holds them.
FOLDER = "checkpoints"
# A checkpoint file's header: magic, payload length, SHA-256 of the payload.
MAGIC = b"DDPCKPT1"
HEADER = struct.Struct("<8sQ32s")
# How much of a file is read at a time while hashing it.
CHUNK = 4 * 1024 * 1024


def checkpoint_name(epoch: int, step: int | None = None) -> str:
    """``epoch-NNNNN.ckpt`` after ``epoch`` completed epochs; with ``step``, the mid-epoch checkpoint taken
    at that global step, ``epoch-NNNNN.step-SSSSSSSSS.ckpt``."""
    if step is None:
        return f"epoch-{epoch:05d}.ckpt"
    return f"epoch-{epoch:05d}.step-{step:09d}.ckpt"


def checkpoint_order(name: str) -> tuple[int, int] | None:
    """(epoch, step) of a checkpoint's file name, step 0 for an epoch-end one; None for any other name."""
    match = NAME.match(name)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else None


def is_checkpoint(name: str) -> bool:
    return NAME.match(name) is not None


def header(payload: bytes) -> bytes:
    """The header of a checkpoint file holding ``payload``."""
    return HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest())


def problem(path: Path | str, size: int, head: bytes, payload_digest: Callable[[], bytes]) -> str:
    """What is wrong with the checkpoint file ``path`` ('' when nothing), from its size in bytes, its first
    :data:`HEADER` bytes and the SHA-256 of what follows them (asked for last: the costly part)."""
    if size < HEADER.size or len(head) < HEADER.size:
        return f"checkpoint {path} is truncated: {size} bytes, shorter than its header"
    magic, length, digest = HEADER.unpack_from(head)
    if magic != MAGIC:
        return f"{path} is not a ddp_cluster checkpoint (magic {magic!r}, expected {MAGIC!r})"
    if size - HEADER.size != length:
        return (
            f"checkpoint {path} is truncated or padded: its header says {length} payload bytes, "
            f"the file has {size - HEADER.size}"
        )
    if payload_digest() != digest:
        return f"checkpoint {path} is corrupt: its SHA-256 does not match the one in its header"
    return ""


def verify_handle(handle: BinaryIO, path: Path | str) -> str:
    """:func:`verify_file` of an open file (read from its start; a file unlinked meanwhile still reads)."""
    size = os.fstat(handle.fileno()).st_size
    handle.seek(0)
    head = handle.read(HEADER.size)

    def payload_digest() -> bytes:
        sha, read = hashlib.sha256(), 0
        while chunk := handle.read(CHUNK):
            sha.update(chunk)
            read += len(chunk)
        # A file that changed size while it was read is not the file that was measured.
        return sha.digest() if read == size - HEADER.size else b""

    return problem(path, size, head, payload_digest)


def verify_file(path: Path | str) -> str:
    """What is wrong with the checkpoint file at ``path``: '' when its length and SHA-256 match its header,
    else the problem (unreadable, truncated, not a checkpoint, corrupt), naming the file."""
    try:
        with open(path, "rb") as handle:
            return verify_handle(handle, path)
    except OSError as error:
        return f"cannot read checkpoint {path}: {error}"


def fsync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def install_verified(temporary: Path, final: Path) -> str:
    """Rename the copy ``temporary`` over ``final`` once it verifies, durably (fsync of the file, then of
    the folder after the rename); a copy that does not verify is deleted. '' when installed, else why not."""
    wrong = verify_file(temporary)
    if wrong:
        temporary.unlink(missing_ok=True)
        return wrong
    try:
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, final)
        fsync_folder(final.parent)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        return f"cannot put checkpoint {final} in place: {error}"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ddp_cluster.runtime.checkpoint_names",
        description="Check a checkpoint file against its own checksum (and put a verified copy in place).",
    )
    parser.add_argument("--verify", type=Path, required=True, metavar="PATH", help="the file to check")
    parser.add_argument(
        "--rename-to",
        type=Path,
        metavar="FINAL",
        help="once PATH verifies, rename it to FINAL (same folder); a PATH that does not is deleted",
    )
    args = parser.parse_args(argv)
    wrong = install_verified(args.verify, args.rename_to) if args.rename_to else verify_file(args.verify)
    if wrong:
        print(wrong, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
