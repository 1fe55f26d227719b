"""Lookup ``ddp_tree_hash``: one SHA-256 over files and directory trees, for content-addressed image tags.

    {{ lookup('ddp_tree_hash', 'docker', 'python/src', extra='base-image-id', root=repo_root) }}

Paths are hashed with their names relative to ``root``, in sorted order, so renames change the hash too.
Byte-code caches and build metadata are left out: they change without the sources changing.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: ddp_tree_hash
short_description: SHA-256 of files and directory trees
description:
  - Hashes the names and contents of the given files and trees (relative to root), plus an extra string.
options:
  _terms:
    description: Files or directories, relative to root.
    required: true
  root:
    description: Directory the terms are relative to.
    type: str
    required: true
  extra:
    description: A string hashed along with the files (for example a base image id).
    type: str
    default: ""
"""

SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
SKIPPED_SUFFIXES = (".pyc", ".pyo")


def _files_under(root: str, term: str) -> list[str]:
    path = os.path.join(root, term)
    if os.path.isfile(path):
        return [term]
    if not os.path.isdir(path):
        raise AnsibleLookupError(f"ddp_tree_hash: {path} does not exist")
    found = []
    for directory, subdirs, files in os.walk(path):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info"))
        for name in files:
            if not name.endswith(SKIPPED_SUFFIXES):
                found.append(os.path.relpath(os.path.join(directory, name), root))
    return found


class LookupModule(LookupBase):
    def run(self, terms: list[str], variables: Any = None, **kwargs: Any) -> list[str]:
        self.set_options(var_options=variables, direct=kwargs)
        root = self.get_option("root")
        digest = hashlib.sha256()
        names = sorted({name for term in terms for name in _files_under(root, term)})
        for name in names:
            digest.update(name.encode() + b"\0")
            with open(os.path.join(root, name), "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())
        digest.update(self.get_option("extra").encode())
        return [digest.hexdigest()]
