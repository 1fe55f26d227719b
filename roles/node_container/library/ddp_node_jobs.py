#!/usr/bin/python
"""The jobs that run in a node's container, asked of the node before teardown.yml removes it; with force, each
stopped there first."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ddp_node_jobs
short_description: The jobs that run in a node's container, and their stop before the container is removed
description:
  - The check site.yml makes before it would recreate a running container (ddp_cluster.server.node's
    jobs_in, shipped as module_utils, as ddp_node_container uses it): the node itself is asked which jobs run
    there (O(command), in the container). teardown.yml refuses the whole teardown when one runs, naming it,
    before anything is removed on any node.
  - With O(force), each job found is stopped there as jobs.yml stops it (O(stop_command)), before the
    container goes; a warning names it. Without it nothing changes.
  - A container that is missing or stopped runs no job; one that runs but does not answer is said in a
    warning (it runs no job it could report).
  - Check mode asks, and stops nothing.
options:
  name:
    description: The node's container.
    type: str
    required: true
  command:
    description: The node's report of its jobs (one JSON line, C(busy) and C(jobs)), run with C(/bin/bash -c)
      in the container; the action builds it (ddp_cluster.job.node_jobs.command).
    type: str
    required: true
  stop_command:
    description: One job's stop there, C({job}) in it replaced by the job's id; run for each job with
      O(force).
    type: str
    required: true
  force:
    description: Stop the jobs found, instead of only naming them.
    type: bool
    default: false
"""

RETURN = r"""
jobs:
  description: The jobs that run in the container (job id to its nodes), as found before any stop.
  type: dict
  returned: always
running:
  description: What runs there, as the refusal says it ('job A (nodes node0, node1) runs on node0'); empty
    when nothing does.
  type: str
  returned: always
actions:
  description: The jobs stopped (force).
  type: list
  returned: always
"""

from typing import TYPE_CHECKING  # noqa: E402  (Ansible modules put DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

if TYPE_CHECKING:  # the same file: module_utils/ddp_node.py links to the package's module
    from ddp_cluster.server.node import NodeError, describe_jobs, docker, jobs_in, stop_jobs
else:
    from ansible.module_utils.ddp_node import NodeError, describe_jobs, docker, jobs_in, stop_jobs


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "command": {"type": "str", "required": True},
            "stop_command": {"type": "str", "required": True},
            "force": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    name = module.params["name"]
    try:
        state = docker("inspect", "--format", "{{.State.Running}}", name, check=False, timeout=60)
        if state.returncode != 0 or state.stdout.strip() != "true":  # missing or stopped: it runs no job
            module.exit_json(changed=False, jobs={}, running="", actions=[])
        found, unanswered = jobs_in(name, module.params["command"])
        if unanswered:
            module.warn(f"{name}: could not ask the node which jobs run there ({unanswered}): removing it")
        running = ""
        if found:
            running = f"{describe_jobs(found)} {'runs' if len(found) == 1 else 'run'} on {name}"
        stopped: list[str] = []
        if found and module.params["force"]:
            would = "would stop" if module.check_mode else "stops"
            module.warn(f"force=true: removing {name} {would} {describe_jobs(found)}")
            if not module.check_mode:
                stopped, unclean = stop_jobs(name, found, module.params["stop_command"])
                for warning in unclean:
                    module.warn(warning)
    except NodeError as error:
        module.fail_json(msg=f"{name}: {error}")
    module.exit_json(changed=bool(stopped), jobs=found, running=running, actions=stopped)


if __name__ == "__main__":
    main()
