#!/usr/bin/python
"""Pack a node's job directory into one archive for the controller to fetch (the job's results, whatever its
end)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ddp_job_pack
short_description: Pack a job's directory on a node's server into one gzipped tar, all but older checkpoints
description:
  - Runs on the server (its own Python, not the node container, which may have died with the job), so a node
    whose container is gone still sends its logs back.
  - The logic is ddp_cluster.server.pack (shipped as module_utils), unit-tested with the package.
  - Everything under I(job_dir) goes in, but the checkpoints under C(output/checkpoints/) other than the
    newest C(epoch-*.ckpt), files ending in C(.tmp), C(__pycache__) directories, C(job.tar.gz) (the files
    sent), and the archive.
  - Runs as root in a directory the node container can write, so it never follows a link; the job directory
    is opened from I(workspace) down one component at a time, and a component that is a link (or a job
    directory outside the workspace) is refused, naming it. Links inside go in as links; devices, fifos
    and sockets are left out and named (C(left_out)).
  - C(secrets.json) (the job's secrets) is never packed, and the secrets' values (4 characters or more) are
    masked as C(***) in every text file packed (not in checkpoints); once packed, C(secrets.json) is removed
    from the job directory (a second pack of the job has no values left to mask).
  - Directories nested deeper than 256 levels are left out, named in C(left_out).
  - The archive (C(archive) in the result) is written to a new directory of the server's root, mode 0700
    (C(ddp-pack-*) in its temporary directory), never in the workspace, where the node container could swap
    it for a link before the fetch; C(sha256) lets the controller check what it fetched.
  - With I(remove), only I(archive) and its directory are removed (once the controller has it).
  - Check mode lists what would be packed and writes nothing.
options:
  job_dir:
    description: The job's directory on the server (the node's workspace, jobs/<job-id>); not with I(remove).
    type: path
  workspace:
    description: The node's workspace on the server; I(job_dir) must lie inside it.
    type: path
    required: true
  archive:
    description: With I(remove), the archive to remove (the C(archive) a pack returned).
    type: path
  remove:
    description: Remove I(archive) and its directory instead of packing (the controller fetched it).
    type: bool
    default: false
  max_bytes:
    description:
      - At most this many bytes of files go into the archive (this node's share of the job's
        C(results_max_gb)); what is over is left on the node and named in C(left_out). Unset, no bound.
    type: int
"""

RETURN = r"""
archive:
  description: The archive's path on the server, in a directory of its own (empty in check mode).
  type: str
  returned: unless remove
members:
  description: How many entries (files, directories, links) the archive holds.
  type: int
  returned: always
bytes:
  description: The archive's size (0 in check mode).
  type: int
  returned: always
checkpoint:
  description: The checkpoint packed (its path inside the job directory), or an empty string.
  type: str
  returned: always
sha256:
  description: The archive's SHA-256 (empty in check mode).
  type: str
  returned: always
left_out:
  description: What was left out, each as C(path (why)) (a device, a fifo, a socket).
  type: list
  elements: str
  returned: always
"""

from typing import TYPE_CHECKING  # noqa: E402  (Ansible modules put DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

if TYPE_CHECKING:  # the same file: module_utils/ddp_pack.py links to the package's module
    from ddp_cluster.server.pack import PackError, pack_job, remove_archive
else:
    from ansible.module_utils.ddp_pack import PackError, pack_job, remove_archive


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "job_dir": {"type": "path"},
            "workspace": {"type": "path"},
            "archive": {"type": "path"},
            "remove": {"type": "bool", "default": False},
            "max_bytes": {"type": "int"},
        },
        required_if=[("remove", True, ["archive"]), ("remove", False, ["job_dir", "workspace"])],
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["remove"]:
            removed = module.check_mode or remove_archive(params["archive"])
            module.exit_json(changed=removed, removed=removed)
        packed = pack_job(
            params["job_dir"], params["workspace"], check=module.check_mode, max_bytes=params["max_bytes"]
        )
    except PackError as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=True, **packed)


if __name__ == "__main__":
    main()
