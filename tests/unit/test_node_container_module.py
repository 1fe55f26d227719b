"""The node_container role's one-run-per-node module (roles/node_container/library/ddp_node_container.py), run
as Ansible runs it, with ddp_cluster.server.node shipped as module_utils: check mode against a docker double
says what it would do and touches nothing. What the module does is unit-tested in
python/tests/test_server_node.py; the container itself runs in molecule's node_container scenario and the e2e
tests (tests/test_site_scale.py counts the runs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rolemodule import run_role_module

# No image on the engine: in check mode the module only says it would create the container.
DOCKER = '#!/bin/sh\necho "$*" >> "$(dirname "$0")/calls"\n[ "$1 $2" = "image inspect" ] && exit 1\nexit 0\n'


def run(tmp_path: Path, **args: Any) -> dict[str, Any]:
    double = tmp_path / "bin" / "docker"
    double.parent.mkdir(exist_ok=True)
    double.write_text(DOCKER)
    double.chmod(0o755)
    path = {"PATH": f"{double.parent}{os.pathsep}{os.environ['PATH']}"}
    # Outside the checkout, whose ansible.cfg would run the role's action (it needs a record) for the module.
    return run_role_module(
        "node_container", "ddp_node_container", args, cwd=tmp_path, check=True, diff=True, env=path
    )


def test_check_mode_says_what_it_would_do_and_touches_nothing(tmp_path: Path) -> None:
    node = tmp_path / "node0"
    result = run(
        tmp_path,
        directories=[{"path": str(node / "etc"), "mode": "0755"}],
        settings={"path": str(node / "etc" / "node.env"), "content": "x\n", "mode": "0644"},
        container={"name": "node0", "image": "ddp-cluster/node:abc"},
        sshd={"port": 12345, "timeout": 5, "probe": "true"},
    )
    assert result["changed"] and not result.get("failed"), result
    assert result["actions"] == [
        f"created directory {node / 'etc'}",
        f"created {node / 'etc' / 'node.env'}",
        "would create container node0 from ddp-cluster/node:abc (not on this engine yet)",
    ]
    assert result["sshd"] == [] and result["diff"]["after"]["settings"] == "x\n"
    assert not node.exists()
    assert (tmp_path / "bin" / "calls").read_text() == "image inspect --format {{.Id}} ddp-cluster/node:abc\n"
