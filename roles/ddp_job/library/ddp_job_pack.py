#!/usr/bin/python
"""Pack a node's job directory into one archive for the controller to fetch (the job's results, whatever its end)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ddp_job_pack
short_description: Pack a job's directory on a node's server into one gzipped tar, all but older checkpoints
description:
  - Runs on the server (its own Python, not the node container, which may have died with the job), so a node
    whose container is gone still sends its logs back.
  - Everything under I(job_dir) goes in, but the checkpoints under C(output/checkpoints/) other than the newest
    C(epoch-*.ckpt), files ending in C(.tmp), C(__pycache__) directories, and the archive itself.
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

import fnmatch  # noqa: E402  (Ansible modules put DOCUMENTATION first)
import os  # noqa: E402
import tarfile  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

CHECKPOINTS = os.path.join("output", "checkpoints")
CHECKPOINT = "epoch-*.ckpt"


def skipped(name: str) -> bool:
    return name == "__pycache__" or name.endswith(".tmp")


def members(job_dir: str, archive: str) -> tuple[list[str], str]:
    """The paths to pack, relative to job_dir, parents before children; and the newest checkpoint's."""
    archive = os.path.abspath(archive)
    found: list[str] = []
    for directory, subdirectories, files in os.walk(job_dir):
        relative = os.path.relpath(directory, job_dir)
        subdirectories[:] = sorted(name for name in subdirectories if not skipped(name))
        # A link to a directory goes in as the link (as tar keeps it); the walk does not follow it.
        links = [name for name in subdirectories if os.path.islink(os.path.join(directory, name))]
        subdirectories[:] = [name for name in subdirectories if name not in links]
        if relative == CHECKPOINTS:
            subdirectories[:] = []
            continue
        if relative != ".":
            found.append(relative)
        for name in sorted(files + links):
            path = os.path.join(directory, name)
            if skipped(name) or os.path.abspath(path) == archive:
                continue
            found.append(os.path.normpath(os.path.join(relative, name)))
    checkpoints = os.path.join(job_dir, CHECKPOINTS)
    names = sorted(fnmatch.filter(os.listdir(checkpoints), CHECKPOINT)) if os.path.isdir(checkpoints) else []
    newest = os.path.join(CHECKPOINTS, names[-1]) if names else ""
    if newest:
        found += [path for path in ("output", CHECKPOINTS) if path not in found] + [newest]
    return found, newest


def pack(job_dir: str, archive: str, paths: list[str]) -> int:
    descriptor, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(job_dir)), prefix=".pack-")
    try:
        with os.fdopen(descriptor, "wb") as handle, tarfile.open(fileobj=handle, mode="w:gz") as tar:
            for path in paths:
                try:
                    tar.add(os.path.join(job_dir, path), arcname=path, recursive=False)
                except FileNotFoundError:  # a file a rank removed while the node was being packed
                    continue
        os.chmod(temporary, 0o644)
        os.replace(temporary, archive)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return os.path.getsize(archive)


def main() -> None:
    module = AnsibleModule(
        argument_spec={"job_dir": {"type": "path", "required": True}, "archive": {"type": "path", "required": True}},
        supports_check_mode=True,
    )
    job_dir, archive = module.params["job_dir"], module.params["archive"]
    if not os.path.isdir(job_dir):
        module.fail_json(msg=f"the job directory {job_dir} is missing on this server: the job never reached it")
    paths, newest = members(job_dir, archive)
    size = 0
    if not module.check_mode:
        try:
            size = pack(job_dir, archive, paths)
        except OSError as error:
            module.fail_json(msg=f"could not pack {job_dir} into {archive}: {error}")
    module.exit_json(changed=True, members=len(paths), bytes=size, checkpoint=newest)


if __name__ == "__main__":
    main()
