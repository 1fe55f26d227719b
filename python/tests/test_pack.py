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
from typing import Any

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
    "project/pkg", "project/pkg/mod.py", "empty", "data", "results.tar.gz",
]  # fmt: skip


def server_tmp(workspace: Path) -> Path:
    """The server's temporary directory, beside the node's workspace (tmp_path), not inside it."""
    found = workspace.with_name(f"{workspace.name}-server-tmp")
    found.mkdir(exist_ok=True)
    return found


def pack_it(job_dir: Path, check: bool = False) -> dict[str, Any]:
    """The job directory packed, the node's workspace being tmp_path."""
    workspace = job_dir.parent.parent
    return pack_job(str(job_dir), str(workspace), check=check, into=str(server_tmp(workspace)))


def test_everything_but_older_checkpoints_temporary_files_and_caches_is_packed(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    packed = pack_it(job_dir)
    archive = Path(packed["archive"])
    assert packed["checkpoint"] == "output/checkpoints/epoch-00002.ckpt"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert tar.extractfile("output/checkpoints/epoch-00002.ckpt").read() == b"two"  # type: ignore[union-attr]
        assert tar.getmember("data").issym() and tar.getmember("data").linkname == "/usr/share"
    assert sorted(names) == sorted(PACKED)
    assert packed["members"] == len(names) and packed["bytes"] == archive.stat().st_size
    assert packed["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest() and packed["left_out"] == []
    # The archive is in a directory of its own, mode 0700, outside the workspace; nothing is written there.
    assert archive.parent.parent == server_tmp(tmp_path) and archive.parent.name.startswith("ddp-pack-")
    assert stat.S_IMODE(archive.parent.stat().st_mode) == 0o700 and os.listdir(archive.parent) == [
        archive.name
    ]
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    assert sorted(path.name for path in (tmp_path / "jobs").iterdir()) == ["job-1"]
    assert not list(job_dir.glob(".*")) and (job_dir / "results.tar.gz").read_text() == "an earlier archive"
    assert remove_archive(str(archive)) and not archive.parent.exists()
    assert not remove_archive(str(archive))


def test_parents_come_before_their_children(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    paths, _, _ = members(str(job_dir), str(tmp_path))
    for index, path in enumerate(paths):
        parent = str(Path(path).parent)
        assert parent == "." or paths.index(parent) < index, path
    assert "results.tar.gz" in paths  # a file of the job's like any other: the archive is never written there


def test_a_job_without_checkpoints_packs_its_logs(tmp_path: Path) -> None:
    job_dir = tmp_path / "jobs" / "job-2"
    (job_dir / "logs").mkdir(parents=True)
    (job_dir / "logs" / "agent.0.log").write_text("failed\n")
    packed = pack_it(job_dir)
    assert packed["checkpoint"] == ""
    with tarfile.open(packed["archive"]) as tar:
        assert sorted(tar.getnames()) == ["logs", "logs/agent.0.log"]


def test_check_mode_writes_nothing(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    packed = pack_it(job_dir, check=True)
    assert packed == {
        "archive": "",
        "members": 16,
        "bytes": 0,
        "sha256": "",
        "checkpoint": "output/checkpoints/epoch-00002.ckpt",
        "left_out": [],
    }
    assert (job_dir / "results.tar.gz").read_text() == "an earlier archive"
    assert list(server_tmp(tmp_path).iterdir()) == []


def test_a_missing_job_directory_is_named(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    with pytest.raises(PackError, match="jobs/never is missing on this server"):
        pack_it(tmp_path / "jobs" / "never")


def test_only_an_archive_of_the_pack_is_removed(tmp_path: Path) -> None:
    """remove_archive runs as root with a path from the controller: anything but <tmp>/ddp-pack-*/
    results.tar.gz is refused, nothing removed."""
    job_dir = job(tmp_path)
    for path in (job_dir / "results.tar.gz", job_dir / "status.json", tmp_path / "ddp-pack-x" / "other"):
        with pytest.raises(PackError, match="is not an archive of ddp_job_pack"):
            remove_archive(str(path))
    assert (job_dir / "results.tar.gz").exists() and (job_dir / "status.json").exists()


def test_a_failed_write_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    (job_dir / "secrets.json").write_text(json.dumps({"T": "abcdefgh"}))

    def full(*_: object) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pack, "_add", full)
    with pytest.raises(PackError, match=r"could not pack .*No space left on device"):
        pack_it(job_dir)
    assert list(server_tmp(tmp_path).iterdir()) == []
    assert (job_dir / "secrets.json").exists()  # kept: a collect run again still masks the values


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
            pack_job(str(job_dir), str(workspace), check=check, into=str(server_tmp(workspace)))
    assert sorted(path.name for path in elsewhere.rglob("*")) == ["docker-config.json", "job-1"]
    assert list(server_tmp(workspace).iterdir()) == []


def test_a_job_directory_outside_the_workspace_is_refused(tmp_path: Path) -> None:
    job_dir = job(tmp_path)
    for outside in (tmp_path / "jobs" / "job-1" / ".." / ".." / "..", tmp_path.parent):
        with pytest.raises(PackError, match="is not inside the node's workspace"):
            pack_job(str(outside), str(job_dir), into=str(server_tmp(tmp_path)))


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
    with tarfile.open(packed["archive"]) as tar:
        kinds = {member.name: (member.type, member.linkname) for member in tar.getmembers()}
    assert kinds["output/config.json"] == (tarfile.SYMTYPE, str(host))
    assert kinds["output/etc"] == (tarfile.SYMTYPE, str(tmp_path))
    assert kinds["output/dangling"] == (tarfile.SYMTYPE, "/nowhere/at/all")
    assert b"HOST SECRET" not in gzip.decompress(Path(packed["archive"]).read_bytes())


def test_a_results_archive_planted_in_the_job_directory_is_never_written_through(
    tmp_path: Path,
) -> None:
    """The archive the controller fetches (as root) is never a path of the workspace: a results.tar.gz there
    planted as a link (to a host file, /dev/zero) is packed as the link and never written through."""
    target = tmp_path / "host-file"
    target.write_text("keep me")
    job_dir = job(tmp_path)
    (job_dir / "results.tar.gz").unlink()
    (job_dir / "results.tar.gz").symlink_to(target)
    packed = pack_it(job_dir)
    assert target.read_text() == "keep me" and (job_dir / "results.tar.gz").is_symlink()
    assert not Path(packed["archive"]).is_relative_to(tmp_path)
    with tarfile.open(packed["archive"]) as tar:
        assert tar.getmember("results.tar.gz").linkname == str(target)


# --- secrets ---


def test_secrets_json_is_never_packed_and_the_values_are_masked_in_every_file_but_checkpoints(
    tmp_path: Path,
) -> None:
    job_dir = tmp_path / "jobs" / "job-1"
    (job_dir / "logs").mkdir(parents=True)
    (job_dir / "output" / "checkpoints").mkdir(parents=True)
    token, quoted = "hf_TOKEN_1234", 'pa"ss\\word'
    (job_dir / "secrets.json").write_text(json.dumps({"HF_TOKEN": token, "PASS": quoted, "PIN": "123"}))
    (job_dir / "logs" / "rank.0.log").write_text(f"login with {token} ok; pin 123\n" * 3)
    (job_dir / "status.json").write_text(json.dumps({"log_tail": [f"password {quoted}"]}))
    (job_dir / "output" / "checkpoints" / "epoch-00001.ckpt").write_bytes(b"\0" + token.encode())
    (job_dir / "output" / "weights.bin").write_bytes(b"\0" + token.encode())
    packed = pack_it(job_dir)
    with tarfile.open(packed["archive"]) as tar:
        assert "secrets.json" not in tar.getnames()

        def read(name: str) -> bytes:
            found = tar.extractfile(name)
            assert found is not None
            return found.read()

        assert read("logs/rank.0.log") == b"login with *** ok; pin 123\n" * 3  # 3 characters: not masked
        assert read("status.json") == json.dumps({"log_tail": ["password ***"]}).encode()
        # a checkpoint as it is; a file with a NUL first is masked too (a pickle or an event file can hold
        # a value as well as a log)
        assert read("output/checkpoints/epoch-00001.ckpt") == b"\0" + token.encode()
        assert read("output/weights.bin") == b"\0***"


def test_a_value_split_across_two_reads_is_masked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(pack, "CHUNK", 7)
    job_dir = tmp_path / "jobs" / "job-1"
    job_dir.mkdir(parents=True)
    (job_dir / "secrets.json").write_text(json.dumps({"T": "abcdefgh", "U": "xyzw"}))
    (job_dir / "log").write_text("0123abcdefgh45xyzw6789abcdefgh" * 5)
    packed = pack_it(job_dir)
    with tarfile.open(packed["archive"]) as tar:
        found = tar.extractfile("log")
        assert found is not None and found.read() == b"0123***45***6789***" * 5


def test_secrets_json_is_removed_from_the_node_once_packed(tmp_path: Path) -> None:
    """The job is over when it is packed: its secrets are not left on the server (check mode keeps them); a
    second pack of the same job has no values left to mask."""
    job_dir = tmp_path / "jobs" / "job-1"
    job_dir.mkdir(parents=True)
    (job_dir / "secrets.json").write_text(json.dumps({"T": "abcdefgh"}))
    (job_dir / "log").write_text("token abcdefgh\n")
    pack_it(job_dir, check=True)
    assert (job_dir / "secrets.json").exists()
    first = pack_it(job_dir)
    assert not (job_dir / "secrets.json").exists() and (job_dir / "log").exists()
    second = pack_it(job_dir)
    for packed, expected in [(first, b"token ***\n"), (second, b"token abcdefgh\n")]:
        with tarfile.open(packed["archive"]) as tar:
            found = tar.extractfile("log")
            assert found is not None and found.read() == expected


def test_directories_nested_too_deep_are_left_out_named(tmp_path: Path) -> None:
    """A job's code can nest directories 1,500 deep: the walk stops at MAX_DEPTH (no RecursionError, no
    descriptor per level beyond it) and names what it left out."""
    job_dir = tmp_path / "jobs" / "job-1"
    job_dir.mkdir(parents=True)
    (job_dir / "log").write_text("kept\n")
    chain = [os.open(job_dir, os.O_RDONLY)]
    try:
        for _ in range(1500):  # by descriptor: the path grows past PATH_MAX
            os.mkdir("d", dir_fd=chain[-1])
            chain.append(os.open("d", os.O_RDONLY, dir_fd=chain[-1]))
        packed = pack_it(job_dir)
        assert pack_it(job_dir, check=True)["left_out"] == packed["left_out"]
    finally:  # removed here, bottom up: pytest's own removal of tmp_path would overflow its stack
        for descriptor in reversed(chain[:-1]):
            os.rmdir("d", dir_fd=descriptor)
        for descriptor in chain:
            os.close(descriptor)
    deepest = "/".join(["d"] * (pack.MAX_DEPTH + 1))
    assert packed["left_out"] == [f"{deepest} (nested deeper than {pack.MAX_DEPTH} directories)"]
    with tarfile.open(packed["archive"]) as tar:
        names = tar.getnames()
    assert "log" in names and "/".join(["d"] * pack.MAX_DEPTH) in names and deepest not in names


def test_the_bundle_left_out_is_the_one_the_plan_ships() -> None:
    from ddp_cluster.job import spec as job

    assert pack.BUNDLE == job.BUNDLE_FILE  # pack.py ships alone to the servers, so it spells the name out


def test_the_checkpoints_packed_are_the_ones_the_ranks_write() -> None:
    """pack.py spells the checkpoints' names and header out (it ships alone): the ranks' own, in the folder a
    rank writes them to, ordered as the ranks order them."""
    import os

    from ddp_cluster.runtime import checkpoint_names as names

    assert os.path.join("output", names.FOLDER) == pack.CHECKPOINTS
    assert pack.CHECKPOINT.pattern == names.NAME.pattern
    assert (pack.MAGIC, pack.HEADER.format) == (names.MAGIC, names.HEADER.format)
    for epoch, step in [(0, 4), (3, None), (3, 150), (99999, 999999999)]:
        name = names.checkpoint_name(epoch, step)
        assert pack.checkpoint_order(name) == names.checkpoint_order(name)


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
    packed = pack_it(job_dir)
    assert packed["checkpoint"] == f"output/checkpoints/{newest}"
    with tarfile.open(packed["archive"]) as tar:
        assert [name for name in tar.getnames() if name.endswith(".ckpt")] == [f"output/checkpoints/{newest}"]
        assert tar.extractfile(f"output/checkpoints/{newest}").read() == newest.encode()  # type: ignore[union-attr]
