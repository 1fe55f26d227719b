"""Files written whole: atomic writes (readers see the old file or the new one); tar members."""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a hidden temporary file beside ``path``, fsync it, rename it over ``path``, fsync the
    folder (so the rename itself survives a power loss)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """A regular file ``name`` holding ``data`` (mode 644), into an open tar."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
    tar.addfile(info, io.BytesIO(data))
