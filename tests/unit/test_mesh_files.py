"""The ssh_mesh role's one-call file writer (roles/ssh_mesh/library/ddp_mesh_files.py), run as Ansible runs a
module: JSON arguments in, JSON result out. The mesh itself runs in molecule's ssh_mesh scenario and the e2e
tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "roles" / "ssh_mesh" / "library" / "ddp_mesh_files.py"
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n-----END OPENSSH PRIVATE KEY-----\n"


def run(tmp_path: Path, check: bool = False, diff: bool = True, **args: Any) -> dict[str, Any]:
    arguments = tmp_path / "args.json"
    arguments.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check,
                                                             "_ansible_diff": diff}}))  # fmt: skip
    done = subprocess.run([sys.executable, str(MODULE), str(arguments)], capture_output=True, text=True)
    return dict(json.loads(done.stdout))


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


def test_check_mode_writes_nothing_then_the_files_are_written_once(tmp_path: Path) -> None:
    checked = run(tmp_path, check=True, **files(tmp_path))
    assert checked["changed"] and len(checked["changed_paths"]) == 3
    assert not (tmp_path / "etc").exists()
    written = run(tmp_path, **files(tmp_path))
    assert written["changed"]
    key = tmp_path / "root" / ".ssh" / "id"
    assert key.read_text() == KEY and oct(key.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "root" / ".ssh").stat().st_mode & 0o777) == "0o700"
    assert (tmp_path / "etc" / "known_hosts").read_text() == "[node1]:12345 ssh-ed25519 AAAA\n"
    assert run(tmp_path, **files(tmp_path))["changed"] is False


def test_the_private_key_is_in_neither_the_diff_nor_the_logged_arguments(tmp_path: Path) -> None:
    result = run(tmp_path, **files(tmp_path))
    text = json.dumps(result)
    assert "not-a-real-key" not in text
    assert "(secret)" in result["diff"]["after"]
    assert "ssh-ed25519 AAAA x" in result["diff"]["after"]


def test_only_what_differs_is_rewritten_and_a_failed_validation_keeps_the_old_file(tmp_path: Path) -> None:
    run(tmp_path, **files(tmp_path))
    changed = run(tmp_path, **files(tmp_path, known="[node1]:12345 ssh-ed25519 BBBB\n"))
    assert changed["changed_paths"] == [str(tmp_path / "etc" / "known_hosts")]
    bad = files(tmp_path, known="garbage\n")
    bad["files"][1]["validate"] = "grep -q ssh-ed25519 %s"
    failed = run(tmp_path, **bad)
    assert failed["failed"] and "fails `grep -q ssh-ed25519 %s`" in failed["msg"]
    assert (tmp_path / "etc" / "known_hosts").read_text() == "[node1]:12345 ssh-ed25519 BBBB\n"
    assert not list((tmp_path / "etc").glob(".ddp-mesh-*"))
