"""ddp_cluster.server.mesh: a node's mesh files written once, only where they differ, atomically, validated
first, secrets kept out of the diff. The ssh_mesh role's module runs this code in every node container
(tests/unit/test_mesh_files.py runs the module through Ansible; molecule's ssh_mesh scenario wires a mesh)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddp_cluster.server.mesh import write_files

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n-----END OPENSSH PRIVATE KEY-----\n"


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
    changed, diff, failure = write_files(**files(tmp_path), check=True)
    assert failure == "" and len(changed) == 3 and diff["after"].count("# ") == 3
    assert not (tmp_path / "etc").exists()
    changed, _, failure = write_files(**files(tmp_path), check=False)
    assert failure == "" and changed[0] == str(tmp_path / "root" / ".ssh" / "id")
    key = tmp_path / "root" / ".ssh" / "id"
    assert key.read_text() == KEY and oct(key.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "root" / ".ssh").stat().st_mode & 0o777) == "0o700"
    assert (tmp_path / "etc" / "known_hosts").read_text() == "[node1]:12345 ssh-ed25519 AAAA\n"
    assert write_files(**files(tmp_path), check=False) == ([], {}, "")


def test_the_private_key_is_not_in_the_diff(tmp_path: Path) -> None:
    _, diff, _ = write_files(**files(tmp_path), check=False)
    assert "not-a-real-key" not in diff["before"] + diff["after"]
    assert "(secret)" in diff["after"] and "ssh-ed25519 AAAA x" in diff["after"]
    assert "(mode absent)" in diff["before"]


def test_only_what_differs_is_rewritten_and_a_failed_validation_keeps_the_old_file(tmp_path: Path) -> None:
    write_files(**files(tmp_path), check=False)
    changed, diff, _ = write_files(**files(tmp_path, known="[node1]:12345 ssh-ed25519 BBBB\n"), check=False)
    assert changed == [str(tmp_path / "etc" / "known_hosts")]
    assert "AAAA" in diff["before"] and "BBBB" in diff["after"]
    (tmp_path / "etc" / "authorized_keys").chmod(0o600)  # a mode alone differs too
    bad = files(tmp_path, known="garbage\n")
    bad["files"][1]["validate"] = "grep -q ssh-ed25519 %s"
    changed, _, failure = write_files(**bad, check=False)
    assert changed == [str(tmp_path / "etc" / "authorized_keys")]
    assert failure.startswith(
        f"{tmp_path / 'etc' / 'known_hosts'}: the new content fails `grep -q ssh-ed25519 %s`"
    )
    assert (tmp_path / "etc" / "known_hosts").read_text() == "[node1]:12345 ssh-ed25519 BBBB\n"
    assert oct((tmp_path / "etc" / "authorized_keys").stat().st_mode & 0o777) == "0o644"
    assert not list((tmp_path / "etc").glob(".ddp-mesh-*"))
