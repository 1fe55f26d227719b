"""The ddp_job role's packing of a node's job directory (roles/ddp_job/library/ddp_job_pack.py), run as Ansible
runs a module: JSON arguments in, JSON result out. The whole collect step runs in every train.yml e2e test."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODULE = REPO / "roles" / "ddp_job" / "library" / "ddp_job_pack.py"


def run(tmp_path: Path, job_dir: Path, check: bool = False) -> dict[str, Any]:
    arguments = tmp_path / "args.json"
    archive = job_dir / "results.tar.gz"
    arguments.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"job_dir": str(job_dir), "archive": str(archive),
                                                             "_ansible_check_mode": check}}))  # fmt: skip
    done = subprocess.run([sys.executable, str(MODULE), str(arguments)], capture_output=True, text=True)
    return dict(json.loads(done.stdout))


def job(tmp_path: Path) -> Path:
    job_dir = tmp_path / "jobs" / "job-1"
    files = {
        "status.json": "{}",
        "hostfile": "node0 slots=1\n",
        "logs/1/rank.0/stdout": "epoch 1\n",
        "output/metrics.jsonl": "{}\n",
        "output/checkpoints/epoch-00001.ckpt": "one",
        "output/checkpoints/epoch-00002.ckpt": "two",
        "output/checkpoints/epoch-00002.ckpt.tmp": "half",
        "output/half.tmp": "half",
        "project/pkg/__pycache__/mod.cpython-311.pyc": "x",
        "project/pkg/mod.py": "VALUE = 1\n",
        "results.tar.gz": "an earlier archive",
    }
    for name, text in files.items():
        (job_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (job_dir / name).write_text(text)
    (job_dir / "empty").mkdir()
    (job_dir / "data").symlink_to("/usr/share")  # a link to a dataset's directory stays a link
    return job_dir


def test_everything_but_older_checkpoints_temporary_files_and_caches_is_packed(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    result = run(tmp_path, job_dir)
    assert result["changed"] and result["checkpoint"] == "output/checkpoints/epoch-00002.ckpt", result
    with tarfile.open(job_dir / "results.tar.gz") as tar:
        names = tar.getnames()
        assert tar.extractfile("output/checkpoints/epoch-00002.ckpt").read() == b"two"  # type: ignore[union-attr]
    assert sorted(names) == sorted([
        "status.json", "hostfile", "logs", "logs/1", "logs/1/rank.0", "logs/1/rank.0/stdout", "output",
        "output/metrics.jsonl", "output/checkpoints", "output/checkpoints/epoch-00002.ckpt", "project",
        "project/pkg", "project/pkg/mod.py", "empty", "data",
    ])  # fmt: skip
    with tarfile.open(job_dir / "results.tar.gz") as tar:
        assert tar.getmember("data").issym() and tar.getmember("data").linkname == "/usr/share"
    assert len(names) == result["members"] and result["bytes"] == (job_dir / "results.tar.gz").stat().st_size
    # Nothing is left beside the job directory but the archive inside it.
    assert sorted(path.name for path in (tmp_path / "jobs").iterdir()) == ["job-1"]


def test_a_job_without_checkpoints_packs_its_logs(tmp_path: Path) -> None:
    job_dir = tmp_path / "jobs" / "job-2"
    (job_dir / "logs").mkdir(parents=True)
    (job_dir / "logs" / "agent.0.log").write_text("failed\n")
    result = run(tmp_path, job_dir)
    assert result["checkpoint"] == ""
    with tarfile.open(job_dir / "results.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["logs", "logs/agent.0.log"]


def test_check_mode_writes_nothing(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    result = run(tmp_path, job_dir, check=True)
    assert result["changed"] and result["members"] == 15 and result["bytes"] == 0
    assert (job_dir / "results.tar.gz").read_text() == "an earlier archive"


def test_a_missing_job_directory_is_named(tmp_path: Path) -> None:
    result = run(tmp_path, tmp_path / "jobs" / "never")
    assert result["failed"] and "jobs/never is missing on this server" in result["msg"]
