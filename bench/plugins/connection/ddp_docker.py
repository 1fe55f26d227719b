"""Connection ``ddp_docker`` for the controller benchmark: the mesh play (playbooks/mesh.yml) talks to each
node container through ``ddp_docker``; with ANSIBLE_CONNECTION_PLUGINS naming this folder (bench_controller.py
sets it) that name is this class, which answers from the virtual server hosting the container (the node's
name).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "ddp_virtual_connection", Path(__file__).with_name("ddp_virtual.py")
)
assert _spec and _spec.loader
_virtual = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_virtual)

DOCUMENTATION = r"""
name: ddp_docker
short_description: The node container of a virtual server (controller benchmark)
description:
  - The ddp_virtual connection, reached by the node's name as the mesh play's ansible_docker_host gives it.
options:
  remote_addr:
    description: The container's name (the node's).
    default: inventory_hostname
    vars:
      - name: inventory_hostname
      - name: ansible_host
      - name: ansible_docker_host
  remote_user:
    description: Ignored.
    vars:
      - name: ansible_user
  pipelining:
    description: Modules sent on stdin.
    type: boolean
    default: true
    vars:
      - name: ansible_pipelining
"""


class Connection(_virtual.Connection):  # type: ignore[name-defined,misc]
    transport = "ddp_docker"
