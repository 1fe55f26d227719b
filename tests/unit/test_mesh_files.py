"""The ssh_mesh role's one-call file writer (roles/ssh_mesh/library/ddp_mesh_files.py), run by Ansible with
ddp_cluster.server.mesh shipped as module_utils. What it writes is unit-tested in
python/tests/test_server_mesh.py; the mesh itself runs in molecule's ssh_mesh scenario and the e2e tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rolemodule import run_role_module

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n-----END OPENSSH PRIVATE KEY-----\n"


def run(tmp_path: Path, check: bool = False, diff: bool = True, **args: Any) -> dict[str, Any]:
    return run_role_module("ssh_mesh", "ddp_mesh_files", args, cwd=tmp_path, check=check, diff=diff)


def files(tmp_path: Path, known: str = "[node1]:12345 ssh-ed25519 AAAA\n") -> dict[str, Any]:
    return {
        "secret_files": [{"path": str(tmp_path / "root" / ".ssh" / "id"), "content": KEY, "mode": "0600"}],
        "files": [
            {
                "path": str(tmp_path / "etc" / "authorized_keys"),
                "content": "ssh-ed25519 AAAA x\n",
                "mode": "0644",
            },
            {"path": str(tmp_path / "etc" / "known_hosts"), "content": known, "mode": "0644"},
        ],
    }


def test_the_module_writes_once_in_check_mode_nothing_and_logs_no_private_key(tmp_path: Path) -> None:
    checked = run(tmp_path, check=True, **files(tmp_path))
    assert checked["changed"] and len(checked["changed_paths"]) == 3
    assert not (tmp_path / "etc").exists()
    written = run(tmp_path, **files(tmp_path))
    assert written["changed"] and (tmp_path / "root" / ".ssh" / "id").read_text() == KEY
    assert "not-a-real-key" not in json.dumps(written) and "(secret)" in written["diff"]["after"]
    bad = files(tmp_path, known="garbage\n")
    bad["files"][1]["validate"] = "grep -q ssh-ed25519 %s"
    failed = run(tmp_path, **bad)
    assert (
        failed["failed"]
        and "fails `grep -q ssh-ed25519 %s`" in failed["msg"]
        and failed["changed_paths"] == []
    )
