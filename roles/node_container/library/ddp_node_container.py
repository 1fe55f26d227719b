#!/usr/bin/python
"""Bring one node up in one module run: its directories, its settings file, its container, and sshd's
check."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ddp_node_container
short_description: A node's directories, settings file and container, and the check that its sshd answers
description:
  - The logic is ddp_cluster.server.node (shipped as module_utils), unit-tested with the package.
  - One module run per node for the whole container stage (each module run costs the controller about half a
    second of CPU; the stage was eight per node). Directories are made or re-moded, the settings file written
    only when its content or mode differs (to a temporary file renamed over the old one), the container
    created with the docker CLI only when it is missing or was created from another specification, started
    when stopped, then the module waits for sshd to listen on the cluster port and reads its effective
    configuration and the node's network (the lines of O(sshd.probe)).
  - The container's specification (the image's id included) is kept in its label C(ddp-cluster.spec); a
    container whose label differs from the one asked for is removed and created again, so a new image, a
    changed volume or variable, or a container made by hand under the node's name is replaced, and an
    unchanged one is left running.
  - Replacing a container stops what runs in it. When the running container would be replaced, the module
    first asks the node which jobs run there (O(jobs.command), in the container); when one does, the node is
    refused by name before anything changes on it (directories and settings file included), naming the jobs
    and how to go on, unless O(jobs.force) (each job stopped as jobs.yml stops it, then the container
    replaced, said in a warning) or O(jobs.wait) (their end waited for, within O(jobs.wait_timeout)
    seconds). A container that does not answer runs no job it could report (a warning says so).
  - Check mode says what would change and changes nothing (a refusal too); diff mode shows the settings file
    and the specification before and after.
options:
  directories:
    description: Each C(path) and C(mode) (octal string), owned by root.
    type: list
    elements: dict
    required: true
  settings:
    description: The node settings file, C(path), C(content) and C(mode).
    type: dict
    required: true
  container:
    description:
      - C(name), C(hostname), C(image), C(restart_policy), C(init), C(ipc_mode), C(shm_size), C(ulimits)
        (C(name:soft:hard)), C(runtime), C(env), C(network) (a network name, or C(host)), C(aliases),
        C(etc_hosts) (name to address), C(volumes), C(devices), C(device_requests) (as community.docker's
        docker_container takes them) and C(labels).
    type: dict
    required: true
  sshd:
    description: C(port), C(listen) (the one address sshd must listen on), C(timeout) (seconds), C(files)
      and C(probe) (a shell script run with the port as
      $0 and the files as its arguments; it exits 0 once sshd is ready and prints C(sshd -T)'s lines and
      one line per fact the action reads, C(ddp-node KEY), a colon, the value).
    type: dict
    required: true
  jobs:
    description:
      - C(command), the node's report of its jobs (one JSON line, C(busy) and C(jobs)), run with
        C(/bin/bash -c) in the container; the action builds it (ddp_cluster.job.node_jobs.command). Without
        it the jobs are not asked.
      - C(stop_command), one job's stop there (C({job}) in it replaced by the job's id), run before
        C(force) recreates the container.
      - C(force) (stop the jobs and recreate anyway), C(wait) (wait for the jobs to end), C(wait_timeout)
        (seconds), C(poll) (seconds between looks while waiting, default 5).
    type: dict
    required: false
"""

RETURN = r"""
actions:
  description: What was done (or would be, in check mode), in order.
  type: list
  returned: always
sshd:
  description: The probe's output lines, once sshd answered (empty when it did not, or in check mode before
    the container exists).
  type: list
  returned: always
"""

from typing import TYPE_CHECKING  # noqa: E402  (Ansible modules put DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

if TYPE_CHECKING:  # the same file: module_utils/ddp_node.py links to the package's module
    from ddp_cluster.server.node import NodeError, bring_up
else:
    from ansible.module_utils.ddp_node import NodeError, bring_up


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "dict", "required": True},
            "settings": {"type": "dict", "required": True},
            "container": {"type": "dict", "required": True},
            "sshd": {"type": "dict", "required": True},
            "jobs": {"type": "dict", "required": False},
        },
        supports_check_mode=True,
    )
    try:
        result = bring_up(module.params, module.check_mode)
    except NodeError as error:
        module.fail_json(msg=f"{module.params['container'].get('name', '?')}: {error}")
    for warning in result.pop("warnings"):
        module.warn(warning)
    diff = result.pop("diff")
    if module._diff and result["actions"]:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
