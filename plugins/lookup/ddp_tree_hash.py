"""Lookup ``ddp_tree_hash``: one SHA-256 over files and directory trees, for content-addressed image tags.

    {{ lookup('ddp_tree_hash', 'docker', 'python/src', extra='base-image-id', root=repo_root) }}

The logic is ``ddp_cluster.image.tree`` (unit-tested with the package).
"""

from __future__ import annotations

import site
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.image.tree import TreeHashError, tree_hash

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


class LookupModule(LookupBase):
    def run(self, terms: list[str], variables: Any = None, **kwargs: Any) -> list[str]:
        self.set_options(var_options=variables, direct=kwargs)
        try:
            return [tree_hash(self.get_option("root"), terms, self.get_option("extra"))]
        except TreeHashError as error:
            raise AnsibleLookupError(str(error)) from error
