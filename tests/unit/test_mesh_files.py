"""The ssh_mesh role's one-call file writer (roles/ssh_mesh/library/ddp_mesh_files.py), run by Ansible with
ddp_cluster.server.mesh shipped as module_utils. What it writes is unit-tested in
python/tests/test_server_mesh.py; the mesh itself runs in molecule's ssh_mesh scenario and the e2e tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "ssh_mesh"
ANSIBLE = Path(sys.executable).parent / "ansible"
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n-----END OPENSSH PRIVATE KEY-----\n"


def run(tmp_path: Path, check: bool = False, diff: bool = True, **args: Any) -> dict[str, Any]:
    env = os.environ | {
        "ANSIBLE_LIBRARY": str(ROLE / "library"),
        "ANSIBLE_MODULE_UTILS": str(ROLE / "module_utils"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
    }
    command = [str(ANSIBLE), "localhost", "-i", "localhost,", "-c", "local", "-m", "ddp_mesh_files"]
    command += ["-a", json.dumps(args)] + (["--check"] if check else []) + (["--diff"] if diff else [])
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    result: dict[str, Any] = json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return result


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
