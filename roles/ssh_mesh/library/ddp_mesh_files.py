#!/usr/bin/python
"""Write a node's mesh files (private key, authorized keys, pinned host keys, ssh settings) in one module
call."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ddp_mesh_files
short_description: Write several small files in one call, each only when its content or mode differs
description:
  - The logic is ddp_cluster.server.mesh (shipped as module_utils), unit-tested with the package.
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

from typing import TYPE_CHECKING  # noqa: E402  (Ansible modules put DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

if TYPE_CHECKING:  # the same file: module_utils/ddp_mesh.py links to the package's module
    from ddp_cluster.server.mesh import write_files
else:
    from ansible.module_utils.ddp_mesh import write_files


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "dict", "required": True},
            "secret_files": {"type": "list", "elements": "dict", "default": [], "no_log": True},
        },
        supports_check_mode=True,
    )
    changed, diff, failure = write_files(
        module.params["files"], module.params["secret_files"], module.check_mode
    )
    if failure:
        module.fail_json(msg=failure, changed_paths=changed)
    module.exit_json(changed=bool(changed), changed_paths=changed, diff=diff)


if __name__ == "__main__":
    main()
