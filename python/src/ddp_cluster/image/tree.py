"""One SHA-256 over files and directory trees: the node image's tag is a hash of its inputs.

Paths are hashed with their names relative to the root, in sorted order, so a rename changes the hash too.
Byte-code caches and build metadata are left out: they change without the sources changing. Runs on the
controller (the lookup plugin ``ddp_tree_hash`` is its shim).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable

from ddp_cluster.errors import DdpClusterError

SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
SKIPPED_SUFFIXES = (".pyc", ".pyo")


class TreeHashError(DdpClusterError):
    """A path to hash does not exist."""


def files_under(root: str, term: str) -> list[str]:
    """The files of term (a file, or a directory walked whole), as paths relative to root."""
    path = os.path.join(root, term)
    if os.path.isfile(path):
        return [term]
    if not os.path.isdir(path):
        raise TreeHashError(f"ddp_tree_hash: {path} does not exist")
    found = []
    for directory, subdirs, files in os.walk(path):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info"))
        for name in files:
            if not name.endswith(SKIPPED_SUFFIXES):
                found.append(os.path.relpath(os.path.join(directory, name), root))
    return found


def tree_hash(root: str, terms: Iterable[str], extra: str = "") -> str:
    """The hex SHA-256 of the names and contents of terms' files (relative to root), then extra."""
    digest = hashlib.sha256()
    for name in sorted({name for term in terms for name in files_under(root, term)}):
        digest.update(name.encode() + b"\0")
        with open(os.path.join(root, name), "rb") as handle:
            digest.update(hashlib.sha256(handle.read()).digest())
    digest.update(extra.encode())
    return digest.hexdigest()
