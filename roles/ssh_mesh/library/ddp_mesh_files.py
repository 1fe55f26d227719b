#!/usr/bin/python
"""Write a node's mesh files (private key, authorized keys, pinned host keys, ssh settings) in one module
call."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ddp_mesh_files
short_description: Write several small files in one call, each only when its content or mode differs
description:
  - One module run per node instead of one per file (each of which is a C(docker exec) on the mesh play's
    docker connection). Each file is written to a temporary file beside it, validated when asked, and renamed
    over the old one, so a reader never sees half a file. Parent directories are made (mode 0700) when
    missing.
  - Check mode reports what would change; diff mode shows each file before and after, except secret ones.
options:
  files:
    description:
      - Each C(path), C(content), C(mode) (octal string) and optional C(validate) (a command with C(%s) for
        the new file, run before it replaces the old one).
    type: list
    elements: dict
    required: true
  secret_files:
    description: The same for files whose content is secret (a private key) - never logged, not in the diff.
    type: list
    elements: dict
    default: []
"""

RETURN = r"""
changed_paths:
  description: The files written (or that would be, in check mode).
  type: list
  returned: always
"""

import os  # noqa: E402  (Ansible modules put DOCUMENTATION first)
import shlex  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def current(path: str) -> tuple[str | None, int | None]:
    try:
        with open(path, encoding="utf-8") as handle:
            content = handle.read()
        return content, stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None, None


def write(spec: dict[str, Any], mode: int) -> None:
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
                raise ValueError(f"{path}: the new content fails `{spec['validate']}`: {done.stderr.strip()}")
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "dict", "required": True},
            "secret_files": {"type": "list", "elements": "dict", "default": [], "no_log": True},
        },
        supports_check_mode=True,
    )
    changed_paths, before, after = [], [], []
    specs = [{**spec, "secret": True} for spec in module.params["secret_files"]] + module.params["files"]
    for spec in specs:
        path, mode = spec["path"], int(str(spec["mode"]), 8)
        content, old_mode = current(path)
        if content == spec["content"] and old_mode == mode:
            continue
        changed_paths.append(path)
        secret = bool(spec.get("secret"))
        before.append(f"# {path} (mode {oct(old_mode) if old_mode is not None else 'absent'})\n"
                      + ("(secret)\n" if secret and content is not None else content or ""))  # fmt: skip
        after.append(f"# {path} (mode {oct(mode)})\n" + ("(secret)\n" if secret else spec["content"]))
        if not module.check_mode:
            try:
                write(spec, mode)
            except (OSError, ValueError) as error:
                module.fail_json(msg=str(error), changed_paths=changed_paths[:-1])
    diff = {"before": "".join(before), "after": "".join(after)} if changed_paths else {}
    module.exit_json(changed=bool(changed_paths), changed_paths=changed_paths, diff=diff)


if __name__ == "__main__":
    main()
