"""Connection ``ddp_docker``: community.docker's ``docker`` connection (the docker CLI on the controller,
which reaches a server's engine with ``-H ssh://ADDRESS``), and, on a controller without the docker CLI (a Mac
or a locked-down jump host that builds nothing itself), the same calls through ``scripts/docker-over-ssh``:
the controller's own ssh runs the server's docker CLI, stdin and stdout passed through.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ansible_collections.community.docker.plugins.connection.docker import Connection as DockerConnection

DOCUMENTATION = r"""
name: ddp_docker
short_description: Run tasks in a node container, with or without the docker CLI on the controller
description:
  - community.docker.docker, whose docker command is scripts/docker-over-ssh when the controller has no docker
    CLI (then ansible_docker_extra_args must name the server, -H ssh://USER@ADDRESS).
options:
  remote_addr:
    description: The container's name.
    default: inventory_hostname
    vars:
      - name: inventory_hostname
      - name: ansible_host
      - name: ansible_docker_host
  remote_user:
    description: The user in the container.
    vars:
      - name: ansible_user
      - name: ansible_docker_user
    keyword:
      - name: remote_user
  docker_extra_args:
    description: Extra arguments of the docker command line (-H ssh://USER@ADDRESS).
    default: ''
    vars:
      - name: ansible_docker_extra_args
  container_timeout:
    description: Seconds to wait for the container's output once a command started.
    default: 10
    type: integer
    env:
      - name: ANSIBLE_TIMEOUT
    ini:
      - key: timeout
        section: defaults
    vars:
      - name: ansible_docker_timeout
  extra_env:
    description: Environment variables of the commands in the container.
    type: dict
    vars:
      - name: ansible_docker_extra_env
  working_dir:
    description: The directory in the container to run commands in.
    type: string
    vars:
      - name: ansible_docker_working_dir
  privileged:
    description: Whether commands run with extended privileges.
    type: boolean
    default: false
    vars:
      - name: ansible_docker_privileged
"""

SHIM = Path(__file__).resolve().parents[2] / "scripts" / "docker-over-ssh"


class Connection(DockerConnection):
    transport = "ddp_docker"

    def __init__(self, play_context: Any, new_stdin: Any, *args: Any, **kwargs: Any) -> None:
        if "docker_command" not in kwargs and shutil.which("docker") is None:
            kwargs["docker_command"] = str(SHIM)
        super().__init__(play_context, new_stdin, *args, **kwargs)
