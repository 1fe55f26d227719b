"""ddp_cluster.server.pack: what a node's job directory packs into (the ddp_job role's ddp_job_pack module
runs
this code on every server; tests/test_job_pack.py runs the module through Ansible)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from ddp_cluster.server.pack import PackError, members, pack_job


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


PACKED = [
    "status.json", "hostfile", "logs", "logs/1", "logs/1/rank.0", "logs/1/rank.0/stdout", "output",
    "output/metrics.jsonl", "output/checkpoints", "output/checkpoints/epoch-00002.ckpt", "project",
    "project/pkg", "project/pkg/mod.py", "empty", "data",
]  # fmt: skip


def test_everything_but_older_checkpoints_temporary_files_and_caches_is_packed(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    archive = job_dir / "results.tar.gz"
    packed = pack_job(str(job_dir), str(archive))
    assert packed["checkpoint"] == "output/checkpoints/epoch-00002.ckpt"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert tar.extractfile("output/checkpoints/epoch-00002.ckpt").read() == b"two"  # type: ignore[union-attr]
        assert tar.getmember("data").issym() and tar.getmember("data").linkname == "/usr/share"
    assert sorted(names) == sorted(PACKED)
    assert packed["members"] == len(names) and packed["bytes"] == archive.stat().st_size
    # Nothing is left beside the job directory but the archive inside it.
    assert sorted(path.name for path in (tmp_path / "jobs").iterdir()) == ["job-1"]


def test_parents_come_before_their_children(tmp_path: Path) -> None:
    paths, _ = members(str(job(tmp_path)), str(tmp_path / "elsewhere.tar.gz"))
    for index, path in enumerate(paths):
        parent = str(Path(path).parent)
        assert parent == "." or paths.index(parent) < index, path
    assert "results.tar.gz" in paths  # an earlier archive goes in when it is not the one being written


def test_a_job_without_checkpoints_packs_its_logs(tmp_path: Path) -> None:
    job_dir = tmp_path / "jobs" / "job-2"
    (job_dir / "logs").mkdir(parents=True)
    (job_dir / "logs" / "agent.0.log").write_text("failed\n")
    assert pack_job(str(job_dir), str(job_dir / "results.tar.gz"))["checkpoint"] == ""
    with tarfile.open(job_dir / "results.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["logs", "logs/agent.0.log"]


def test_check_mode_writes_nothing(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    packed = pack_job(str(job_dir), str(job_dir / "results.tar.gz"), check=True)
    assert packed == {"members": 15, "bytes": 0, "checkpoint": "output/checkpoints/epoch-00002.ckpt"}
    assert (job_dir / "results.tar.gz").read_text() == "an earlier archive"


def test_a_missing_job_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="jobs/never is missing on this server"):
        pack_job(str(tmp_path / "jobs" / "never"), str(tmp_path / "never.tar.gz"))


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    with pytest.raises(PackError, match="could not pack"):
        pack_job(str(job_dir), str(tmp_path / "no-such-dir" / "results.tar.gz"))
    assert sorted(path.name for path in (tmp_path / "jobs").iterdir()) == ["job-1"]


def test_the_bundle_left_out_is_the_one_the_plan_ships() -> None:
    from ddp_cluster.job import spec as job
    from ddp_cluster.server import pack

    assert pack.BUNDLE == job.BUNDLE_FILE  # pack.py ships alone to the servers, so it spells the name out


def test_the_checkpoints_packed_are_the_ones_the_ranks_write() -> None:
    """pack.py spells the checkpoints' names as a glob (it ships alone): every name a rank writes matches it,
    in the folder a rank writes them to."""
    import fnmatch
    import os

    from ddp_cluster.runtime import checkpoint_names as names
    from ddp_cluster.server import pack

    assert os.path.join("output", names.FOLDER) == pack.CHECKPOINTS
    for epoch, step in [(0, 4), (3, None), (3, 150), (99999, 999999999)]:
        assert fnmatch.fnmatch(names.checkpoint_name(epoch, step), pack.CHECKPOINT)


@pytest.mark.parametrize(
    ("names", "newest"),
    [
        (["epoch-00001.ckpt", "epoch-00001.step-000000012.ckpt", "epoch-00002.ckpt"], "epoch-00002.ckpt"),
        (
            ["epoch-00001.ckpt", "epoch-00002.ckpt", "epoch-00002.step-000000020.ckpt"],
            "epoch-00002.step-000000020.ckpt",
        ),
        (
            ["epoch-00000.step-000000004.ckpt", "epoch-00000.step-000000008.ckpt"],
            "epoch-00000.step-000000008.ckpt",
        ),
        (["epoch-00003.step-000000150.ckpt", "epoch-00003.ckpt"], "epoch-00003.step-000000150.ckpt"),
    ],
)
def test_the_newest_checkpoint_of_either_kind_is_the_one_packed(
    tmp_path: Path, names: list[str], newest: str
) -> None:
    """Mid-epoch checkpoints (train --checkpoint-every) are epoch-NNNNN.step-SSSSSSSSS.ckpt: their names sort
    between their epoch's checkpoint and the next epoch's, the order of training."""
    job_dir = tmp_path / "jobs" / "job-3"
    checkpoints = job_dir / "output" / "checkpoints"
    checkpoints.mkdir(parents=True)
    for name in names:
        (checkpoints / name).write_text(name)
    (checkpoints / f".{newest}.tmp-7").write_text("half")  # a checkpoint being written is not newest
    (checkpoints / "epoch-00009.step-000000999.ckpt.tmp").write_text("half")
    archive = job_dir / "results.tar.gz"
    packed = pack_job(str(job_dir), str(archive))
    assert packed["checkpoint"] == f"output/checkpoints/{newest}"
    with tarfile.open(archive) as tar:
        assert [name for name in tar.getnames() if name.endswith(".ckpt")] == [f"output/checkpoints/{newest}"]
        assert tar.extractfile(f"output/checkpoints/{newest}").read() == newest.encode()  # type: ignore[union-attr]
