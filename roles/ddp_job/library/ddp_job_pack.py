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
  - The archive is written beside the job directory under a temporary name and renamed over I(archive), so a
    reader never sees half an archive.
  - Check mode lists what would be packed and writes nothing.
options:
  job_dir:
    description: The job's directory on the server (the node's workspace, jobs/<job-id>).
    type: path
    required: true
  archive:
    description: Where the archive goes (normally I(job_dir)/results.tar.gz).
    type: path
    required: true
"""

RETURN = r"""
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
"""

from typing import TYPE_CHECKING  # noqa: E402  (Ansible modules put DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

if TYPE_CHECKING:  # the same file: module_utils/ddp_pack.py links to the package's module
    from ddp_cluster.server.pack import PackError, pack_job
else:
    from ansible.module_utils.ddp_pack import PackError, pack_job


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "job_dir": {"type": "path", "required": True},
            "archive": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    try:
        packed = pack_job(module.params["job_dir"], module.params["archive"], check=module.check_mode)
    except PackError as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=True, **packed)


if __name__ == "__main__":
    main()
