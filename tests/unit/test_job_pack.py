"""The ddp_job role's module ddp_job_pack, run by Ansible as collect.yml runs it: the module with
ddp_cluster.server.pack shipped as module_utils (what goes in is unit-tested in python/tests/test_pack.py).
The whole
collect step runs in every train.yml e2e test."""

from __future__ import annotations

import stat
import tarfile
from pathlib import Path
from typing import Any

from rolemodule import run_role_module


def run(job_dir: Path, check: bool = False) -> dict[str, Any]:
    arguments = {"job_dir": str(job_dir), "workspace": str(job_dir.parent.parent)}
    return run_role_module("ddp_job", "ddp_job_pack", arguments, check=check)


def remove(archive: str) -> dict[str, Any]:
    return run_role_module("ddp_job", "ddp_job_pack", {"archive": archive, "remove": True})


def job(tmp_path: Path) -> Path:
    job_dir = tmp_path / "jobs" / "job-1"
    for name, text in {"status.json": "{}", "logs/1/rank.0/stdout": "epoch 1\n",
                       "output/checkpoints/epoch-00001.ckpt": "one",
                       "output/checkpoints/epoch-00002.ckpt": "two"}.items():  # fmt: skip
        (job_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (job_dir / name).write_text(text)
    return job_dir


def test_the_module_packs_the_job_through_ansible(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    (job_dir / "secrets.json").write_text('{"T": "abcdefgh"}')
    result = run(job_dir)
    assert result["changed"] and result["checkpoint"] == "output/checkpoints/epoch-00002.ckpt", result
    archive = Path(result["archive"])
    # outside the workspace, in a directory of the server's root: nothing of the node container reaches it
    assert not archive.is_relative_to(tmp_path) and archive.parent.name.startswith("ddp-pack-"), archive
    assert stat.S_IMODE(archive.parent.stat().st_mode) == 0o700
    assert not (job_dir / "results.tar.gz").exists() and not (job_dir / "secrets.json").exists()
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert sorted(names) == sorted([
        "status.json", "logs", "logs/1", "logs/1/rank.0", "logs/1/rank.0/stdout", "output",
        "output/checkpoints", "output/checkpoints/epoch-00002.ckpt",
    ])  # fmt: skip
    assert result["members"] == len(names) and result["bytes"] == archive.stat().st_size
    assert len(result["sha256"]) == 64 and result["left_out"] == []
    removed = remove(str(archive))
    assert removed["changed"] and removed["removed"] and not archive.parent.exists(), removed
    refused = remove(str(job_dir / "status.json"))
    assert refused["failed"] and "is not an archive of ddp_job_pack" in refused["msg"], refused
    assert (job_dir / "status.json").exists()


def test_check_mode_writes_nothing(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    result = run(job_dir, check=True)
    assert result["changed"] and result["members"] == 8 and result["bytes"] == 0, result
    assert result["archive"] == "", result
    assert not (job_dir / "results.tar.gz").exists()


def test_a_missing_job_directory_is_named(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    result = run(tmp_path / "jobs" / "never")
    assert result["failed"] and "jobs/never is missing on this server" in result["msg"], result


def test_a_job_directory_that_is_a_link_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "var-tmp").mkdir()
    (tmp_path / "jobs" / "job-1").symlink_to(tmp_path / "var-tmp")
    result = run(tmp_path / "jobs" / "job-1")
    assert result["failed"] and f"{tmp_path}/jobs/job-1 on this server is a symbolic link" in result["msg"]
    assert list((tmp_path / "var-tmp").iterdir()) == []
