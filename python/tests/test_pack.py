"""ddp_cluster.server.pack: what a node's job directory packs into (the ddp_job role's ddp_job_pack module
runs this code on every server; tests/unit/test_job_pack.py runs the module through Ansible): never through a
link a node container planted, never secrets.json, the secrets' values masked."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from ddp_cluster.server import pack
from ddp_cluster.server.pack import PackError, members, pack_job, remove_archive


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


def pack_it(job_dir: Path, check: bool = False) -> dict[str, object]:
    """The job directory packed into its results.tar.gz, the node's workspace being tmp_path."""
    return pack_job(str(job_dir), str(job_dir / "results.tar.gz"), str(job_dir.parent.parent), check=check)


def test_everything_but_older_checkpoints_temporary_files_and_caches_is_packed(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    archive = job_dir / "results.tar.gz"
    packed = pack_it(job_dir)
    assert packed["checkpoint"] == "output/checkpoints/epoch-00002.ckpt"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert tar.extractfile("output/checkpoints/epoch-00002.ckpt").read() == b"two"  # type: ignore[union-attr]
        assert tar.getmember("data").issym() and tar.getmember("data").linkname == "/usr/share"
    assert sorted(names) == sorted(PACKED)
    assert packed["members"] == len(names) and packed["bytes"] == archive.stat().st_size
    assert packed["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest() and packed["left_out"] == []
    # Nothing is left beside the job directory, nor inside it but the archive.
    assert sorted(path.name for path in (tmp_path / "jobs").iterdir()) == ["job-1"]
    assert not list(job_dir.glob(".*"))
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600


def test_parents_come_before_their_children(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    paths, _, _ = members(str(job_dir), str(tmp_path), "elsewhere.tar.gz")
    for index, path in enumerate(paths):
        parent = str(Path(path).parent)
        assert parent == "." or paths.index(parent) < index, path
    assert "results.tar.gz" in paths  # an earlier archive goes in when it is not the one being written


def test_a_job_without_checkpoints_packs_its_logs(tmp_path: Path) -> None:
    job_dir = tmp_path / "jobs" / "job-2"
    (job_dir / "logs").mkdir(parents=True)
    (job_dir / "logs" / "agent.0.log").write_text("failed\n")
    assert pack_it(job_dir)["checkpoint"] == ""
    with tarfile.open(job_dir / "results.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["logs", "logs/agent.0.log"]


def test_check_mode_writes_nothing(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    packed = pack_it(job_dir, check=True)
    assert packed == {
        "members": 15,
        "bytes": 0,
        "sha256": "",
        "checkpoint": "output/checkpoints/epoch-00002.ckpt",
        "left_out": [],
    }
    assert (job_dir / "results.tar.gz").read_text() == "an earlier archive"


def test_a_missing_job_directory_is_named(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    with pytest.raises(PackError, match="jobs/never is missing on this server"):
        pack_it(tmp_path / "jobs" / "never")


def test_the_archive_is_written_only_inside_the_job_directory(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    with pytest.raises(PackError, match=r"must be a file of the job directory .*jobs/job-1/results.tar.gz"):
        pack_job(str(job_dir), str(tmp_path / "elsewhere" / "results.tar.gz"), str(tmp_path))
    assert sorted(path.name for path in (tmp_path / "jobs").iterdir()) == ["job-1"]


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    (job_dir / "results.tar.gz").unlink()
    (job_dir / "results.tar.gz").mkdir()  # the rename over it fails
    with pytest.raises(PackError, match="could not pack"):
        pack_it(job_dir)
    assert not list(job_dir.glob(".*"))


# --- links planted by a node container: never followed, refused by name ---


@pytest.mark.parametrize("component", ["jobs", "jobs/job-1"])
def test_a_job_directory_reached_through_a_link_is_refused_naming_it(tmp_path: Path, component: str) -> None:
    """A link /workspace/jobs/ID -> /var/tmp (or jobs -> ...) planted in the node container: nothing is read
    or written through it."""
    workspace = tmp_path / "workspace"
    elsewhere = tmp_path / "host-var-tmp"
    (elsewhere / "job-1").mkdir(parents=True)
    (elsewhere / "job-1" / "docker-config.json").write_text("{}")
    (workspace / "jobs").mkdir(parents=True)
    if component == "jobs":
        (workspace / "jobs").rmdir()
    (workspace / component).symlink_to(elsewhere / "job-1" if component.endswith("job-1") else elsewhere)
    job_dir = workspace / "jobs" / "job-1"
    for check in (False, True):
        with pytest.raises(PackError, match=rf"{workspace / component} on this server is a symbolic link"):
            pack_job(str(job_dir), str(job_dir / "results.tar.gz"), str(workspace), check=check)
    with pytest.raises(PackError, match="symbolic link"):
        remove_archive(str(job_dir), str(job_dir / "results.tar.gz"), str(workspace))
    assert sorted(path.name for path in elsewhere.rglob("*")) == ["docker-config.json", "job-1"]


def test_a_job_directory_outside_the_workspace_is_refused(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    for outside in (tmp_path / "jobs" / "job-1" / ".." / ".." / "..", tmp_path.parent):
        with pytest.raises(PackError, match="is not inside the node's workspace"):
            pack_job(str(outside), str(Path(outside) / "results.tar.gz"), str(job_dir))


def test_links_inside_go_in_as_links_and_are_never_opened(tmp_path: Path) -> None:
    """A link to a host file (the server's docker config, say) is packed as the link: its target's bytes
    never reach the archive; nor do a fifo's (an open would hang) or a device's."""
    host = tmp_path / "host-secret"
    host.write_text("HOST SECRET")
    job_dir = tmp_path / "jobs" / "job-1"
    (job_dir / "output").mkdir(parents=True)
    (job_dir / "output" / "config.json").symlink_to(host)
    (job_dir / "output" / "etc").symlink_to(tmp_path)
    (job_dir / "output" / "dangling").symlink_to("/nowhere/at/all")
    os.mkfifo(job_dir / "output" / "pipe")
    packed = pack_it(job_dir)
    assert packed["left_out"] == ["output/pipe (a fifo)"]
    with tarfile.open(job_dir / "results.tar.gz") as tar:
        kinds = {member.name: (member.type, member.linkname) for member in tar.getmembers()}
    assert kinds["output/config.json"] == (tarfile.SYMTYPE, str(host))
    assert kinds["output/etc"] == (tarfile.SYMTYPE, str(tmp_path))
    assert kinds["output/dangling"] == (tarfile.SYMTYPE, "/nowhere/at/all")
    assert b"HOST SECRET" not in gzip.decompress((job_dir / "results.tar.gz").read_bytes())


def test_an_archive_name_planted_as_a_link_is_replaced_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "host-file"
    target.write_text("keep me")
    job_dir = job(tmp_path)
    (job_dir / "results.tar.gz").unlink()
    (job_dir / "results.tar.gz").symlink_to(target)
    pack_it(job_dir)
    assert target.read_text() == "keep me"
    assert not (job_dir / "results.tar.gz").is_symlink()
    assert remove_archive(str(job_dir), str(job_dir / "results.tar.gz"), str(tmp_path))
    assert not (job_dir / "results.tar.gz").exists()
    assert not remove_archive(str(job_dir), str(job_dir / "results.tar.gz"), str(tmp_path))


# --- secrets ---


def test_secrets_json_is_never_packed_and_the_values_are_masked_in_text_files(tmp_path: Path) -> None:
    job_dir = tmp_path / "jobs" / "job-1"
    (job_dir / "logs").mkdir(parents=True)
    (job_dir / "output" / "checkpoints").mkdir(parents=True)
    token, quoted = "hf_TOKEN_1234", 'pa"ss\\word'
    (job_dir / "secrets.json").write_text(json.dumps({"HF_TOKEN": token, "PASS": quoted, "PIN": "123"}))
    (job_dir / "logs" / "rank.0.log").write_text(f"login with {token} ok; pin 123\n" * 3)
    (job_dir / "status.json").write_text(json.dumps({"log_tail": [f"password {quoted}"]}))
    (job_dir / "output" / "checkpoints" / "epoch-00001.ckpt").write_bytes(b"\0" + token.encode())
    (job_dir / "output" / "weights.bin").write_bytes(b"\0" + token.encode())
    pack_it(job_dir)
    with tarfile.open(job_dir / "results.tar.gz") as tar:
        assert "secrets.json" not in tar.getnames()

        def read(name: str) -> bytes:
            found = tar.extractfile(name)
            assert found is not None
            return found.read()

        assert read("logs/rank.0.log") == b"login with *** ok; pin 123\n" * 3  # 3 characters: not masked
        assert read("status.json") == json.dumps({"log_tail": ["password ***"]}).encode()
        # checkpoints and binary files as they are
        assert read("output/checkpoints/epoch-00001.ckpt") == b"\0" + token.encode()
        assert read("output/weights.bin") == b"\0" + token.encode()


def test_a_value_split_across_two_reads_is_masked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(pack, "CHUNK", 7)
    monkeypatch.setattr(pack, "TEXT_PROBE", 5)
    job_dir = tmp_path / "jobs" / "job-1"
    job_dir.mkdir(parents=True)
    (job_dir / "secrets.json").write_text(json.dumps({"T": "abcdefgh", "U": "xyzw"}))
    (job_dir / "log").write_text("0123abcdefgh45xyzw6789abcdefgh" * 5)
    pack_it(job_dir)
    with tarfile.open(job_dir / "results.tar.gz") as tar:
        found = tar.extractfile("log")
        assert found is not None and found.read() == b"0123***45***6789***" * 5


def test_the_bundle_left_out_is_the_one_the_plan_ships() -> None:
    from ddp_cluster.job import spec as job

    assert pack.BUNDLE == job.BUNDLE_FILE  # pack.py ships alone to the servers, so it spells the name out


def test_the_checkpoints_packed_are_the_ones_the_ranks_write() -> None:
    """pack.py spells the checkpoints' names as a glob (it ships alone): every name a rank writes matches it,
    in the folder a rank writes them to."""
    import fnmatch
    import os

    from ddp_cluster.runtime import checkpoint_names as names

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
    packed = pack_it(job_dir)
    assert packed["checkpoint"] == f"output/checkpoints/{newest}"
    with tarfile.open(archive) as tar:
        assert [name for name in tar.getnames() if name.endswith(".ckpt")] == [f"output/checkpoints/{newest}"]
        assert tar.extractfile(f"output/checkpoints/{newest}").read() == newest.encode()  # type: ignore[union-attr]
