"""The checkpoints' file names and how a checkpoint file is known to be whole, without torch: what the ranks
write, the supervisor copies and resumes from, and the controller's planner finds.

``epoch-NNNNN.ckpt`` at the end of an epoch, N the epochs completed, and ``epoch-NNNNN.step-SSSSSSSSS.ckpt``
in the middle of one (``--checkpoint-every``), after N completed epochs and S optimizer steps in all. Both are
zero-padded, so sorting the names as plain strings (as :mod:`ddp_cluster.server.pack` does, which ships
alone to the servers and spells the pattern as the glob ``epoch-*.ckpt``) and sorting by (epoch, step) give
the same order, the order of training: ``epoch-00003.ckpt`` < ``epoch-00003.step-000000150.ckpt`` <
``epoch-00004.ckpt``.
A temporary file (a hidden name, a suffix after ``.ckpt``) is never a checkpoint.

Any file under these names is a checkpoint, whoever wrote it; it is *whole* (:func:`check_file`) by the first
of these rules that applies:

1. **Its own header** (``kind`` ``ours``: the package's entrypoint and :mod:`ddp_cluster.checkpoint` write
   it): 48 bytes (:data:`HEADER`: magic ``DDPCKPT1``, the payload's length as a little-endian uint64, the
   payload's SHA-256), then the payload; length and SHA-256 must match.
2. **Its record** (any other file): a hidden ``.NAME.sha256`` beside it (:class:`Record`: the file's size and
   SHA-256, JSON) that the supervisor writes once it found the file whole, and that every copy gets; a copy
   is checked against the record of the file it was copied from (``--size``/``--sha256`` below). A file
   that no longer matches its record was written again since; it is then judged by rule 3.
3. **Its zip archive**: ``torch.save`` writes a zip (PyTorch 1.6 and later); its central directory and every
   member's CRC-32 prove it whole (:mod:`zipfile`), and a file cut short has no central directory.

A file none of these vouch for (an older ``torch.save`` format with no record yet) is not whole, and neither
is one that fails the rule it falls under; what is wrong is named. Every check streams the file: a checkpoint
of many GB is never held in memory.

The supervisor's copies are checked where they land, on another node, by its own Python::

    python -m ddp_cluster.runtime.checkpoint_names --verify PATH [--size N --sha256 HEX] [--rename-to FINAL]

(exit 0 when PATH is whole, by the rules above or, given ``--size`` and ``--sha256``, against them; else 1
with what is wrong on stderr. ``--rename-to`` puts a whole PATH in place, durably, and deletes one that is
not; given ``--size`` and ``--sha256``, the record is written beside the file).

Standard library only: the supervisor and the controller read these names and import no torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import struct
import sys
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ddp_cluster.files import write_atomic

# epoch-NNNNN.ckpt (group 1: epochs completed) or epoch-NNNNN.step-SSSSSSSSS.ckpt (group 2: global step)
NAME = re.compile(r"^epoch-(\d+)(?:\.step-(\d+))?\.ckpt$")
# The folder under a job's output directory that holds them.
FOLDER = "checkpoints"
# A checkpoint file's header: magic, payload length, SHA-256 of the payload.
MAGIC = b"DDPCKPT1"
HEADER = struct.Struct("<8sQ32s")
# How much of a file is read at a time while hashing it.
CHUNK = 4 * 1024 * 1024
# A zip archive's first bytes (a local file header): what torch.save writes.
ZIP_MAGIC = b"PK\x03\x04"
# The record beside a checkpoint NAME: .NAME.sha256
RECORD_SUFFIX = ".sha256"
# What a record may weigh: it holds two numbers.
RECORD_MAX = 4096


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
    return header_of(len(payload), hashlib.sha256(payload).digest())


def header_of(length: int, digest: bytes) -> bytes:
    """The header of a checkpoint file whose payload has ``length`` bytes and the SHA-256 ``digest``."""
    return HEADER.pack(MAGIC, length, digest)


def problem(path: Path | str, size: int, head: bytes, payload_digest: Callable[[], bytes]) -> str:
    """What is wrong with the checkpoint file ``path`` by its own header ('' when nothing), from its size in
    bytes, its first :data:`HEADER` bytes and the SHA-256 of what follows them (asked for last: the costly
    part)."""
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


# --- records ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """A checkpoint file's size in bytes and SHA-256 (hex): what the supervisor found it whole as."""

    size: int
    sha256: str

    def dumps(self) -> bytes:
        return (json.dumps({"size": self.size, "sha256": self.sha256}, sort_keys=True) + "\n").encode()


def record_name(name: str) -> str:
    """The hidden name of checkpoint ``name``'s record (never a checkpoint's name)."""
    return f".{name}{RECORD_SUFFIX}"


def recorded_checkpoint(name: str) -> str:
    """The checkpoint whose record is called ``name`` ('' when ``name`` is no record's name)."""
    inner = name[1 : -len(RECORD_SUFFIX)] if name.startswith(".") and name.endswith(RECORD_SUFFIX) else ""
    return inner if is_checkpoint(inner) else ""


def record_path(path: Path | str) -> Path:
    path = Path(path)
    return path.with_name(record_name(path.name))


def read_record(path: Path | str) -> Record | None:
    """The record beside the checkpoint ``path``; None when it has none, or none that reads as one."""
    try:
        with open(record_path(path), "rb") as handle:
            data = json.loads(handle.read(RECORD_MAX).decode("utf-8"))
        size, sha256 = data["size"], data["sha256"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not is_sha256(sha256):
        return None
    return Record(size, sha256)


def write_record(path: Path | str, record: Record) -> None:
    """Write ``record`` beside the checkpoint ``path``, atomically; OSError when it cannot be."""
    write_atomic(record_path(path), record.dumps())


def is_sha256(text: object) -> bool:
    return isinstance(text, str) and re.fullmatch(r"[0-9a-f]{64}", text) is not None


# --- the check ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """What :func:`check_handle` found of a checkpoint file.

    ``kind``: ``ours`` (our header's magic first), ``zip`` (a zip archive's first bytes: torch.save's) or
    ``other``; ``rule``: what proved it whole (``header``, ``expected``, ``record``, ``zip``; '' when nothing
    did); ``problem``: '' when whole, else what is wrong, naming the file; ``size``: its bytes; ``sha256``:
    the whole file's SHA-256 (hex), when the check computed it ('' otherwise)."""

    kind: str
    rule: str
    problem: str
    size: int
    sha256: str = ""

    @property
    def record(self) -> Record | None:
        """The file's record, when the check computed its SHA-256."""
        return Record(self.size, self.sha256) if self.sha256 else None


def sha256_of(handle: BinaryIO) -> tuple[int, str]:
    """The bytes and SHA-256 (hex) of an open file, read from its start."""
    sha, read = hashlib.sha256(), 0
    handle.seek(0)
    while chunk := handle.read(CHUNK):
        sha.update(chunk)
        read += len(chunk)
    return read, sha.hexdigest()


def zip_problem(handle: BinaryIO, path: Path | str) -> str:
    """What is wrong with ``path`` as a zip archive ('' when its central directory reads and every member's
    CRC-32 matches); streams each member."""
    handle.seek(0)
    try:
        with zipfile.ZipFile(handle) as archive:
            if not archive.infolist():
                return f"checkpoint {path} is an empty zip archive"
            damaged = archive.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, NotImplementedError) as error:
        return f"checkpoint {path} is not a whole zip archive (torch.save's format): {error}"
    if damaged is not None:
        return f"checkpoint {path} is corrupt: its member {damaged} fails its CRC-32"
    return ""


def kind_of(head: bytes) -> str:
    """``ours``, ``zip`` or ``other``, by a file's first bytes (:class:`Check`)."""
    if head[: len(MAGIC)] == MAGIC:
        return "ours"
    return "zip" if head[: len(ZIP_MAGIC)] == ZIP_MAGIC else "other"


def check_handle(
    handle: BinaryIO,
    path: Path | str,
    expected: Record | None = None,
    *,
    record: Record | None = None,
    digest: bool = False,
) -> Check:
    """Whether the open checkpoint file ``path`` is whole, by the module's rules, or, given ``expected``,
    whether it is the file ``expected`` records. ``record``: the record beside it (the caller reads it: an
    open file may have been renamed); ``digest``: compute the whole file's SHA-256 even where no rule needs
    it. A file that changes size while it is read fails."""
    size = os.fstat(handle.fileno()).st_size
    handle.seek(0)
    head = handle.read(HEADER.size)
    kind = kind_of(head)
    if expected is not None:
        if size != expected.size:
            said = f"checkpoint {path} is truncated or padded: {size} bytes, its record says {expected.size}"
            return Check(kind, "", said, size)
        read, sha256 = sha256_of(handle)
        if read != size or sha256 != expected.sha256:
            said = f"checkpoint {path} is corrupt: its SHA-256 does not match its record's"
            return Check(kind, "", said, size, sha256)
        return Check(kind, "expected", "", size, sha256)
    if kind == "ours":

        def payload_digest() -> bytes:
            sha, read = hashlib.sha256(), 0
            while chunk := handle.read(CHUNK):
                sha.update(chunk)
                read += len(chunk)
            # A file that changed size while it was read is not the file that was measured.
            return sha.digest() if read == size - HEADER.size else b""

        wrong = problem(path, size, head, payload_digest)
        return Check(kind, "" if wrong else "header", wrong, size, sha256_of(handle)[1] if digest else "")
    sha256 = ""
    if record is not None and record.size == size:
        read, sha256 = sha256_of(handle)
        if read == size and sha256 == record.sha256:
            return Check(kind, "record", "", size, sha256)
    wrong = zip_problem(handle, path)
    if wrong and kind == "other":
        found = "does not match its record" if record is not None else "has no record of its size and SHA-256"
        wrong = (
            f"checkpoint {path} cannot be verified: it has no ddp_cluster header, {found} (the supervisor"
            " writes one once it is complete), and is no zip archive (torch.save's format since PyTorch 1.6)"
        )
    elif wrong and record is not None:
        wrong += f"; nor does it match its record ({record.size} bytes)"
    if not wrong and digest and not sha256:
        sha256 = sha256_of(handle)[1]
    return Check(kind, "" if wrong else "zip", wrong, size, sha256 if not wrong else "")


def check_file(path: Path | str, expected: Record | None = None, *, digest: bool = False) -> Check:
    """:func:`check_handle` of the file at ``path``, with the record beside it; one that cannot be read
    fails, naming why."""
    record = None if expected is not None else read_record(path)
    try:
        with open(path, "rb") as handle:
            return check_handle(handle, path, expected, record=record, digest=digest)
    except OSError as error:
        return Check("other", "", f"cannot read checkpoint {path}: {error}", 0)


def verify_file(path: Path | str, expected: Record | None = None) -> str:
    """What is wrong with the checkpoint file at ``path`` ('' when it is whole: :func:`check_file`)."""
    return check_file(path, expected).problem


def has_header(path: Path | str) -> bool:
    """Whether the file at ``path`` starts with our header's magic (it claims to be one of ours)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def fsync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def install_verified(temporary: Path, final: Path, expected: Record | None = None) -> str:
    """Rename the copy ``temporary`` over ``final`` once it is whole (given ``expected``: once it is that
    file), durably (fsync of the file, then of the folder after the rename); a copy that is not is deleted.
    Given ``expected``, its record is written beside ``final``. '' when installed, else why not."""
    wrong = verify_file(temporary, expected)
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
    return keep_record(final, expected)


def keep_record(path: Path, expected: Record | None) -> str:
    """Write ``expected`` beside ``path`` unless it is there already; '' or why it cannot be."""
    if expected is None or read_record(path) == expected:
        return ""
    try:
        write_record(path, expected)
    except OSError as error:
        return f"checkpoint {path} is in place but its record cannot be written: {error}"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ddp_cluster.runtime.checkpoint_names",
        description="Check that a checkpoint file is whole (and put a whole copy in place).",
    )
    parser.add_argument("--verify", type=Path, required=True, metavar="PATH", help="the file to check")
    parser.add_argument("--size", type=int, metavar="N", help="the bytes PATH must have (with --sha256)")
    parser.add_argument("--sha256", metavar="HEX", help="the SHA-256 PATH must have (with --size)")
    parser.add_argument(
        "--rename-to",
        type=Path,
        metavar="FINAL",
        help="once PATH is whole, rename it to FINAL (same folder); a PATH that is not is deleted",
    )
    args = parser.parse_args(argv)
    if (args.size is None) != (args.sha256 is None):
        parser.error("--size and --sha256 go together: the record of the file PATH must be")
    if args.sha256 is not None and (not is_sha256(args.sha256) or args.size < 0):
        parser.error(f"--size {args.size} --sha256 {args.sha256}: a size of 0 or more and 64 hex digits")
    expected = Record(args.size, args.sha256) if args.sha256 is not None else None
    if args.rename_to:
        wrong = install_verified(args.verify, args.rename_to, expected)
    else:
        wrong = verify_file(args.verify, expected) or keep_record(args.verify, expected)
    if wrong:
        print(wrong, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
