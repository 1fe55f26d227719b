"""Write a node's mesh files (its private key, the authorized key, the pinned host keys, the ssh settings)
in one pass, each only when its content or mode differs.

One module for the ``ssh_mesh`` role's Ansible module ``ddp_mesh_files`` (which ships this file into the node
containers as module_utils, so it uses the standard library only and runs on Python 3.8) and for the package.
Each file is written to a temporary file beside it, validated when asked, and renamed over the old one, so a
reader never sees half a file; parent directories are made (mode 0700) when missing. A secret file's content
(the private key) appears in no diff.
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import tempfile
from typing import Any


# Travels alone into the containers, so it cannot derive from ddp_cluster.errors.DdpClusterError.
class MeshFileError(Exception):
    """A file cannot be written, or its new content fails its validation; the message names the file."""


def current(path: str) -> tuple[str | None, int | None]:
    """A file's content and mode; (None, None) when it does not exist."""
    try:
        with open(path, encoding="utf-8") as handle:
            content = handle.read()
        return content, stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None, None


def write(spec: dict[str, Any], mode: int) -> None:
    """SPEC's content to its path with MODE, through a temporary file validated by SPEC's ``validate``."""
    path = spec["path"]
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=".ddp-mesh-")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(spec["content"])
        os.chmod(temporary, mode)
        if spec.get("validate"):
            command = [word.replace("%s", temporary) for word in shlex.split(spec["validate"])]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise MeshFileError(
                    f"{path}: the new content fails `{spec['validate']}`: {done.stderr.strip()}"
                )
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def write_files(
    files: list[dict[str, Any]], secret_files: list[dict[str, Any]], check: bool
) -> tuple[list[str], dict[str, str], str]:
    """Each file (``path``, ``content``, ``mode`` as an octal string, optional ``validate``: a command with
    ``%s`` for the new file) written where it differs, secret files first; in check mode none.

    Returns the paths written (or that would be), the diff (before and after, secret contents hidden; empty
    when nothing differs) and why a write failed (empty when none did: the paths are then those written
    before it)."""
    changed: list[str] = []
    before: list[str] = []
    after: list[str] = []
    for spec in [{**spec, "secret": True} for spec in secret_files] + list(files):
        path, mode = spec["path"], int(str(spec["mode"]), 8)
        content, old_mode = current(path)
        if content == spec["content"] and old_mode == mode:
            continue
        secret = bool(spec.get("secret"))
        shown_mode = oct(old_mode) if old_mode is not None else "absent"
        before.append(
            f"# {path} (mode {shown_mode})\n"
            + ("(secret)\n" if secret and content is not None else content or "")
        )
        after.append(f"# {path} (mode {oct(mode)})\n" + ("(secret)\n" if secret else spec["content"]))
        if not check:
            try:
                write(spec, mode)
            except (OSError, MeshFileError) as error:
                return changed, {}, str(error)
        changed.append(path)
    diff = {"before": "".join(before), "after": "".join(after)} if changed else {}
    return changed, diff, ""
