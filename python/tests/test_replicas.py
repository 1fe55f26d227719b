"""Checkpoint copies off the first node: verified where they land, pruned only after a newer one verified,
retried after a failure, never to a node found lost; the newest verified copy chosen to resume from.

No containers: each node is a folder (tmp/NODE/...), and the stand-in mesh runs the replicator's own shell
commands in a shell, with the first node's folder in their paths swapped for the node's (the job's directory
is the same path on every node). The node's Python is this one.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from ddp_cluster.runtime import checkpoint_names
from ddp_cluster.runtime.checkpoint_names import (
    Record,
    check_file,
    checkpoint_name,
    read_record,
    record_name,
    verify_file,
)
from ddp_cluster.supervisor import replicas
from ddp_cluster.supervisor.replicas import Replicator, newest_verified

JOB = "job-7"
# What a "full" node's disk takes of one file (FakeMesh.full: the shell's file size limit, 512-byte blocks).
FULL_AT = 8 * 512


class FakeMesh:
    """Nodes as folders under ``root``; a node in ``down`` does not answer."""

    def __init__(self, root: Path, first: str = "n0") -> None:
        self.root, self.first = root, first
        self.down: set[str] = set()
        self.cut: dict[str, int] = {}  # node -> bytes lost off the end of its next transfer
        self.full: set[str] = set()  # nodes whose disk takes no more than FULL_AT bytes of a file
        self.gate: threading.Event | None = None  # when set: transfers wait for it
        self.commands: list[tuple[str, str]] = []
        self.sends: list[str] = []

    def here(self, node: str, command: str) -> str:
        return command.replace(str(self.root / self.first), str(self.root / node))

    def run(self, node: str, command: str) -> str:
        self.commands.append((node, command))
        if node in self.down:
            return ""
        done = subprocess.run(
            ["/bin/sh", "-c", self.here(node, command)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return done.stdout

    def send(self, node: str, source: BinaryIO, command: str, timeout: float) -> str:
        self.commands.append((node, command))
        if self.gate is not None:
            self.gate.wait(30)
        if node in self.down:
            return "ssh: connect to host node port 22: Connection refused"
        self.sends.append(node)
        data = source.read()
        if cut := self.cut.pop(node, 0):
            data = data[:-cut]
        limit = f"ulimit -f {FULL_AT // 512}; " if node in self.full else ""
        done = subprocess.run(
            ["/bin/sh", "-c", limit + self.here(node, command)],
            input=data,
            capture_output=True,
            timeout=60,
            check=False,
        )
        said = done.stderr.decode().strip().splitlines()
        return "" if done.returncode == 0 else (said[-1] if said else f"exit {done.returncode}")


def job_dir(root: Path, node: str = "n0") -> Path:
    return root / node / "workspace" / "jobs" / JOB


def folder(root: Path, node: str = "n0") -> Path:
    return job_dir(root, node) / "output" / "checkpoints"


def checkpoint_bytes(payload: bytes) -> bytes:
    return checkpoint_names.header(payload) + payload


def write_checkpoint(where: Path, epoch: int, step: int | None = None, size: int = 4096) -> Path:
    """A checkpoint file as rank 0 writes it (the payload need not be a torch.save for the checksum)."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / checkpoint_name(epoch, step)
    payload = hashlib.sha256(f"{epoch}.{step}".encode()).digest() * (size // 32)
    path.write_bytes(checkpoint_bytes(payload))
    return path


def write_user_checkpoint(where: Path, epoch: int, step: int | None = None, size: int = 16384) -> Path:
    """A checkpoint as a user's script writes it with a plain torch.save: a zip archive of stored members
    (torch.save's layout: archive/data.pkl, archive/data/0, ...), no header of ours."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / checkpoint_name(epoch, step)
    tensor = hashlib.sha256(f"user {epoch}.{step}".encode()).digest() * (size // 32)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        archive.writestr("archive/data/0", tensor)
        archive.writestr("archive/version", b"3\n")
    return path


def write_pickle_checkpoint(where: Path, epoch: int) -> Path:
    """A checkpoint in torch.save's format before PyTorch 1.6 (a pickle stream): nothing in it proves it
    whole."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / checkpoint_name(epoch)
    path.write_bytes(b"\x80\x02\x8a\x0a" + hashlib.sha256(str(epoch).encode()).digest() * 64)
    return path


def names(where: Path) -> list[str]:
    return sorted(os.listdir(where)) if where.is_dir() else []


def replicator(
    root: Path, mesh: FakeMesh, nodes: list[str], shared: Path | None = None, **extra: Any
) -> Replicator:
    return Replicator(
        job_dir(root),
        nodes,
        str(shared) if shared else "",
        JOB,
        mesh,
        python=sys.executable,
        node_env="",
        retry_first=0.0,
        **extra,
    )


def by_place(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {record["place"]: record for record in records}


# verify_file


def test_verify_file_names_what_is_wrong(tmp_path: Path) -> None:
    good = write_checkpoint(tmp_path, 1)
    assert verify_file(good) == ""
    data = good.read_bytes()
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(data[:-10])
    assert "is truncated or padded: its header says 4096 payload bytes, the file has 4086" in verify_file(
        truncated
    )
    padded = tmp_path / "padded.ckpt"
    padded.write_bytes(data + b"x")
    assert "truncated or padded" in verify_file(padded)
    short = tmp_path / "short.ckpt"
    short.write_bytes(data[:20])
    assert verify_file(short) == f"checkpoint {short} is truncated: 20 bytes, shorter than its header"
    altered = tmp_path / "altered.ckpt"
    flipped = bytearray(data)
    flipped[-100] ^= 0x01
    altered.write_bytes(bytes(flipped))
    assert verify_file(altered) == (
        f"checkpoint {altered} is corrupt: its SHA-256 does not match the one in its header"
    )
    cut_zip = tmp_path / "cut.ckpt"
    cut_zip.write_bytes(b"PK\x03\x04" + bytes(100))  # the start of a zip, as a plain torch.save writes
    assert verify_file(cut_zip).startswith(f"checkpoint {cut_zip} is not a whole zip archive")
    foreign = tmp_path / "foreign.ckpt"
    foreign.write_bytes(b"\x80\x02" + bytes(100))  # a pickle (torch.save before PyTorch 1.6), no record
    assert verify_file(foreign).startswith(f"checkpoint {foreign} cannot be verified: it has no ddp_cluster")
    assert verify_file(tmp_path / "missing.ckpt").startswith(
        f"cannot read checkpoint {tmp_path / 'missing.ckpt'}"
    )


def test_verify_command_and_rename_only_once_verified(tmp_path: Path) -> None:
    good = write_checkpoint(tmp_path, 1)
    module = ["-m", "ddp_cluster.runtime.checkpoint_names"]

    def verify(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *module, *args], capture_output=True, text=True, timeout=60, check=False
        )

    assert verify("--verify", str(good)).returncode == 0
    bad = tmp_path / ".epoch-00002.ckpt.replica"
    bad.write_bytes(good.read_bytes()[:-1])
    done = verify("--verify", str(bad), "--rename-to", str(tmp_path / "epoch-00002.ckpt"))
    assert done.returncode == 1 and "truncated or padded" in done.stderr
    assert names(tmp_path) == ["epoch-00001.ckpt"]  # the bad copy deleted, nothing put in place
    copy = tmp_path / ".epoch-00001.ckpt.replica"
    copy.write_bytes(good.read_bytes())
    assert verify("--verify", str(copy), "--rename-to", str(tmp_path / "epoch-00003.ckpt")).returncode == 0
    assert names(tmp_path) == ["epoch-00001.ckpt", "epoch-00003.ckpt"]


# Replicator.poll


def test_copies_land_verified_on_each_replica_and_the_shared_dir_and_older_ones_are_pruned(
    tmp_path: Path,
) -> None:
    mesh, shared = FakeMesh(tmp_path), tmp_path / "shared"
    copier = replicator(tmp_path, mesh, ["n1", "n2"], shared)
    assert copier.poll() == [] and mesh.commands == []  # nothing written yet: nothing done
    written = []
    for epoch, step in [(0, 10), (1, None), (1, 30), (2, None)]:
        written.append(write_checkpoint(folder(tmp_path), epoch, step).name)
        records = copier.finish(timeout=60)
        assert {r["place"] for r in records} == {"n1", "n2", str(shared / JOB)}
        assert all(
            r["verified"] and r["checkpoint"] == written[-1] and r["bytes"] == 4096 + 48 for r in records
        )
        for place in (folder(tmp_path, "n1"), folder(tmp_path, "n2"), shared / JOB):
            assert names(place) == written[-2:], place  # KEEP=2: the newest and one older, no temporary
            assert all(verify_file(place / name) == "" for name in names(place))
    assert names(folder(tmp_path)) == written  # the first node's own folder is rank 0's: untouched
    state = {entry["place"]: entry for entry in copier.state()}
    assert state["n1"]["checkpoint"] == "epoch-00002.ckpt" and state["n1"]["kind"] == "node"
    assert state[str(shared / JOB)]["kind"] == "dir" and not state["n2"]["error"]
    # A node's job processes are found by JOB/ in their command lines: a copy must not look like one.
    tag = str(job_dir(tmp_path)) + "/"
    assert mesh.commands and not [command for _, command in mesh.commands if tag in command]


def test_a_failed_copy_prunes_nothing_and_is_retried(tmp_path: Path) -> None:
    mesh = FakeMesh(tmp_path)
    copier = replicator(tmp_path, mesh, ["n1"])
    for epoch in (1, 2):
        write_checkpoint(folder(tmp_path), epoch)
        copier.finish(timeout=60)
    assert names(folder(tmp_path, "n1")) == ["epoch-00001.ckpt", "epoch-00002.ckpt"]
    write_checkpoint(folder(tmp_path), 3)
    mesh.cut["n1"] = 100  # the transfer loses its end
    [record] = copier.finish(timeout=60)
    assert not record["verified"] and "truncated or padded" in record["error"]
    assert names(folder(tmp_path, "n1")) == [
        "epoch-00001.ckpt",
        "epoch-00002.ckpt",
    ]  # nothing pruned or added
    assert copier.state()[0]["failures"] == 1 and copier.state()[0]["checkpoint"] == "epoch-00002.ckpt"
    [again] = copier.finish(timeout=60)  # the next poll tries again (no pause in this test)
    assert again["verified"] and again["pruned"] == ["epoch-00001.ckpt"]
    assert names(folder(tmp_path, "n1")) == ["epoch-00002.ckpt", "epoch-00003.ckpt"]
    assert copier.state()[0]["failures"] == 0 and copier.state()[0]["error"] == ""


def test_a_node_down_is_reported_not_raised_and_caught_up_when_back(tmp_path: Path) -> None:
    mesh = FakeMesh(tmp_path)
    copier = replicator(tmp_path, mesh, ["n1", "n2"])
    mesh.down.add("n1")
    write_checkpoint(folder(tmp_path), 1)
    records = by_place(copier.finish(timeout=60))
    assert not records["n1"]["verified"] and "Connection refused" in records["n1"]["error"]
    assert records["n2"]["verified"]
    write_checkpoint(folder(tmp_path), 2)
    mesh.down.clear()
    records = by_place(copier.finish(timeout=60))
    assert records["n1"]["checkpoint"] == "epoch-00002.ckpt" and records["n1"]["verified"]
    assert names(folder(tmp_path, "n1")) == ["epoch-00002.ckpt"]  # the newest, not the one it missed


def test_a_failing_place_waits_before_it_is_tried_again(tmp_path: Path) -> None:
    mesh = FakeMesh(tmp_path)
    copier = Replicator(job_dir(tmp_path), ["n1"], "", JOB, mesh, python=sys.executable, node_env="")
    mesh.down.add("n1")
    write_checkpoint(folder(tmp_path), 1)
    assert not copier.finish(timeout=60)[0]["verified"]
    sent = len(mesh.commands)
    assert copier.finish(timeout=60) == [] and len(mesh.commands) == sent  # within RETRY_FIRST: not tried


def test_finish_returns_a_copy_that_ended_as_soon_as_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy to a node that refuses at once can end before finish looks for the copies under way: its record
    is still returned, not left for a poll that never comes."""
    mesh = FakeMesh(tmp_path)
    copier = Replicator(job_dir(tmp_path), ["n1"], "", JOB, mesh, python=sys.executable, node_env="")
    mesh.down.add("n1")
    write_checkpoint(folder(tmp_path), 1)
    start_copies = copier.start_copies

    def ended_at_once(failed: set[str] | None) -> list[dict[str, Any]]:
        done = start_copies(failed)
        for place in copier.places:
            if place.thread is not None:
                place.thread.join()
        return done

    monkeypatch.setattr(copier, "start_copies", ended_at_once)
    [record] = copier.finish(timeout=60)
    assert record["place"] == "n1" and not record["verified"] and "Connection refused" in record["error"]


def test_a_forgotten_node_gets_nothing_and_retarget_names_the_new_set(tmp_path: Path) -> None:
    mesh = FakeMesh(tmp_path)
    copier = replicator(tmp_path, mesh, ["n1", "n2"])
    copier.forget("n1")
    write_checkpoint(folder(tmp_path), 1)
    assert [r["place"] for r in copier.finish(timeout=60)] == ["n2"]
    assert not [node for node, _ in mesh.commands if node == "n1"] and names(folder(tmp_path, "n1")) == []
    assert {e["place"]: e["lost"] for e in copier.state()} == {"n1": True, "n2": False}
    copier.retarget(["n2", "n3"])  # after a restart: n1 gone, n3 new
    records = copier.finish(timeout=60)
    assert [r["place"] for r in records] == ["n3"]  # n2 already holds the newest
    assert names(folder(tmp_path, "n3")) == ["epoch-00001.ckpt"]
    assert [e["place"] for e in copier.state()] == ["n2", "n3"]


def test_a_copy_already_in_place_is_not_sent_again(tmp_path: Path) -> None:
    mesh = FakeMesh(tmp_path)
    write_checkpoint(folder(tmp_path, "n1"), 1)  # n1 holds it already (a restart on the same nodes)
    write_checkpoint(folder(tmp_path), 1)
    copier = replicator(tmp_path, mesh, ["n1"])
    [record] = copier.finish(timeout=60)
    assert record["verified"] and mesh.sends == []
    # but a damaged copy there is replaced
    damaged = write_checkpoint(folder(tmp_path, "n1"), 2)
    damaged.write_bytes(damaged.read_bytes()[:-1])
    write_checkpoint(folder(tmp_path), 2)
    copier.finish(timeout=60)
    assert mesh.sends == ["n1"] and verify_file(damaged) == ""


def test_poll_returns_while_a_copy_runs(tmp_path: Path) -> None:
    mesh = FakeMesh(tmp_path)
    mesh.gate = threading.Event()
    copier = replicator(tmp_path, mesh, ["n1"])
    write_checkpoint(folder(tmp_path), 1)
    started = time.monotonic()
    assert copier.poll() == []
    assert copier.poll() == []  # the copy under way is not started twice
    assert time.monotonic() - started < 5
    assert copier.state()[0]["copying"] == "epoch-00001.ckpt"
    mesh.gate.set()
    [record] = copier.finish(timeout=60)
    assert record["verified"] and copier.state()[0]["copying"] is None
    assert mesh.sends == ["n1"]


def test_a_corrupt_checkpoint_here_is_not_copied(tmp_path: Path) -> None:
    mesh = FakeMesh(tmp_path)
    copier = replicator(tmp_path, mesh, ["n1"])
    path = write_checkpoint(folder(tmp_path), 1)
    path.write_bytes(path.read_bytes()[:-5])
    [record] = copier.finish(timeout=60)
    assert not record["verified"] and record["error"].startswith("not copied: checkpoint")
    assert copier.finish(timeout=60) == []  # not tried again: a newer one will come
    assert mesh.sends == [] and names(folder(tmp_path, "n1")) == []


def test_a_checkpoint_pruned_before_its_copy_is_skipped_not_failed(tmp_path: Path) -> None:
    mesh = FakeMesh(tmp_path)
    copier = replicator(tmp_path, mesh, ["n1"])
    place = copier.places[0]
    copier.copy(place, checkpoint_name(4))  # rank 0 pruned it before the copy began
    [record] = copier.poll()
    assert "skipped" in record and record["error"] == "" and place.failures == 0


def test_stale_temporary_copies_are_cleaned_and_newer_copies_kept(tmp_path: Path) -> None:
    mesh = FakeMesh(tmp_path)
    there = folder(tmp_path, "n1")
    write_checkpoint(there, 9)  # newer than anything here (not this run's lineage): left alone
    write_checkpoint(there, 1)
    (there / ".epoch-00001.ckpt.replica").write_bytes(b"half")  # an interrupted copy
    (there / ".epoch-00001.ckpt.tmp-12").write_bytes(b"rank 0's")  # not ours: never touched
    for epoch in (2, 3):
        write_checkpoint(folder(tmp_path), epoch)
    copier = replicator(tmp_path, mesh, ["n1"], keep=1)
    [record] = copier.finish(timeout=60)
    assert sorted(record["pruned"]) == [".epoch-00001.ckpt.replica", "epoch-00001.ckpt"]
    assert names(there) == [".epoch-00001.ckpt.tmp-12", "epoch-00003.ckpt", "epoch-00009.ckpt"]


# newest_verified


def test_newest_verified_takes_the_newest_that_verifies(tmp_path: Path) -> None:
    job = job_dir(tmp_path)
    assert newest_verified(job, "", JOB) == ("", None)
    for epoch, step in [(1, None), (1, 20), (2, None)]:
        write_checkpoint(folder(tmp_path), epoch, step)
    assert newest_verified(job, "", JOB) == ("epoch-00002.ckpt", folder(tmp_path) / "epoch-00002.ckpt")
    newest = folder(tmp_path) / "epoch-00002.ckpt"
    newest.write_bytes(newest.read_bytes()[:-7])  # truncated
    skipped: list[str] = []
    name, path = newest_verified(job, "", JOB, skipped)
    assert name == "epoch-00001.step-000000020.ckpt" and path == folder(tmp_path) / name
    assert len(skipped) == 1 and "epoch-00002.ckpt is truncated or padded" in skipped[0]
    # set aside, so that rank 0, which resumes from the newest in its folder, takes the verified one
    assert names(folder(tmp_path)) == [
        ".epoch-00002.ckpt.corrupt",
        "epoch-00001.ckpt",
        "epoch-00001.step-000000020.ckpt",
    ]


def test_newest_verified_brings_a_newer_shared_copy_here(tmp_path: Path) -> None:
    job, shared = job_dir(tmp_path), tmp_path / "shared"
    write_checkpoint(folder(tmp_path), 1)
    write_checkpoint(shared / JOB, 1)
    write_checkpoint(shared / JOB, 1, 50)
    name, path = newest_verified(job, str(shared), JOB)
    assert name == "epoch-00001.step-000000050.ckpt" and path == folder(tmp_path) / name
    assert path.read_bytes() == (shared / JOB / name).read_bytes()
    assert names(folder(tmp_path)) == ["epoch-00001.ckpt", name]  # no temporary left
    # a damaged shared copy is skipped for the next older, wherever that is
    write_checkpoint(shared / JOB, 2)
    damaged = shared / JOB / "epoch-00002.ckpt"
    damaged.write_bytes(b"\0" * 48 + damaged.read_bytes()[48:])
    skipped: list[str] = []
    assert newest_verified(job, str(shared), JOB, skipped)[0] == name
    assert "cannot be verified" in skipped[0] and damaged.exists()


def test_newest_verified_repairs_a_damaged_copy_here_from_the_shared_one(tmp_path: Path) -> None:
    job, shared = job_dir(tmp_path), tmp_path / "shared"
    here = write_checkpoint(folder(tmp_path), 3)
    write_checkpoint(shared / JOB, 3)
    here.write_bytes(here.read_bytes()[:-1])
    assert newest_verified(job, str(shared), JOB) == ("epoch-00003.ckpt", here)
    assert verify_file(here) == ""


@pytest.mark.parametrize("keep", [0, 1])
def test_keep_never_prunes_the_newest(tmp_path: Path, keep: int) -> None:
    mesh = FakeMesh(tmp_path)
    copier = replicator(tmp_path, mesh, ["n1"], keep=keep)
    for epoch in (1, 2):
        write_checkpoint(folder(tmp_path), epoch)
        copier.finish(timeout=60)
    assert names(folder(tmp_path, "n1")) == ["epoch-00002.ckpt"]
    assert replicas.KEEP == 2


# A user's own checkpoints (plain torch.save, no header of ours)


def test_a_users_zip_is_whole_by_its_archive_and_a_cut_or_altered_one_is_named(tmp_path: Path) -> None:
    good = write_user_checkpoint(tmp_path, 1)
    assert check_file(good).rule == "zip" and verify_file(good) == ""
    data = good.read_bytes()
    cut = tmp_path / checkpoint_name(2)
    cut.write_bytes(data[: len(data) - 30])  # the end of the central directory is gone
    assert verify_file(cut).startswith(f"checkpoint {cut} is not a whole zip archive (torch.save's format)")
    altered = tmp_path / checkpoint_name(3)
    flipped = bytearray(data)
    flipped[data.index(hashlib.sha256(b"user 1.None").digest()) + 5] ^= 0x01  # a byte of the tensor
    altered.write_bytes(bytes(flipped))
    assert (
        verify_file(altered) == f"checkpoint {altered} is corrupt: its member archive/data/0 fails its CRC-32"
    )


def test_a_record_vouches_for_a_file_of_any_format_until_it_changes(tmp_path: Path) -> None:
    path = write_pickle_checkpoint(tmp_path, 1)
    assert "has no record of its size and SHA-256" in verify_file(path)
    data = path.read_bytes()
    checkpoint_names.write_record(path, Record(len(data), hashlib.sha256(data).hexdigest()))
    assert (tmp_path / record_name(path.name)).is_file() and check_file(path).rule == "record"
    path.write_bytes(data[:-1])
    assert "does not match its record" in verify_file(path)
    # a zip written again under a recorded name is judged as a zip
    zipped = write_user_checkpoint(tmp_path, 2)
    checkpoint_names.write_record(zipped, Record(3, "0" * 64))
    assert check_file(zipped).rule == "zip"


def test_verify_command_checks_a_copy_against_the_record_and_writes_it_beside(tmp_path: Path) -> None:
    source = write_pickle_checkpoint(tmp_path / "source", 1)
    data = source.read_bytes()
    record = ["--size", str(len(data)), "--sha256", hashlib.sha256(data).hexdigest()]

    def verify(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ddp_cluster.runtime.checkpoint_names", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    copy, final = tmp_path / ".epoch-00001.ckpt.replica", tmp_path / "epoch-00001.ckpt"
    copy.write_bytes(data[:-3])
    done = verify("--verify", str(copy), *record, "--rename-to", str(final))
    assert done.returncode == 1 and f"{len(data) - 3} bytes, its record says {len(data)}" in done.stderr
    assert names(tmp_path) == ["source"]  # the bad copy deleted, nothing put in place
    copy.write_bytes(data)
    assert verify("--verify", str(copy), *record, "--rename-to", str(final)).returncode == 0
    assert names(tmp_path) == [".epoch-00001.ckpt.sha256", "epoch-00001.ckpt", "source"]
    assert read_record(final) == Record(len(data), hashlib.sha256(data).hexdigest())
    assert verify("--verify", str(final)).returncode == 0  # by its record, from now on
    half = verify("--verify", str(final), "--size", "3")
    assert half.returncode == 2 and "--size and --sha256 go together" in half.stderr


def test_a_users_checkpoints_are_recorded_here_copied_against_the_record_and_pruned_with_it(
    tmp_path: Path,
) -> None:
    mesh, shared = FakeMesh(tmp_path), tmp_path / "shared"
    copier = replicator(tmp_path, mesh, ["n1"], shared)
    written = []
    for epoch in (1, 2, 3):
        written.append(write_user_checkpoint(folder(tmp_path), epoch).name)
        records = copier.finish(timeout=60)
        assert {r["place"] for r in records} == {"n1", str(shared / JOB)}
        assert all(r["verified"] and r["checkpoint"] == written[-1] for r in records), records
    data = (folder(tmp_path) / written[-1]).read_bytes()
    expected = Record(len(data), hashlib.sha256(data).hexdigest())
    for place in (folder(tmp_path), folder(tmp_path, "n1"), shared / JOB):
        assert read_record(place / written[-1]) == expected, place
    for place in (folder(tmp_path, "n1"), shared / JOB):  # KEEP=2, the records of the pruned ones gone too
        assert names(place) == sorted([*written[-2:], *(record_name(n) for n in written[-2:])]), place
    assert [c for node, c in mesh.commands if node == "n1" and f"--sha256 {expected.sha256}" in c]
    # rank 0 prunes its own: the supervisor's record of a checkpoint gone goes with it
    (folder(tmp_path) / written[0]).unlink()
    copier.poll()
    assert record_name(written[0]) not in names(folder(tmp_path))


def test_a_copy_that_does_not_match_the_record_is_refused_and_deleted(tmp_path: Path) -> None:
    mesh = FakeMesh(tmp_path)
    copier = replicator(tmp_path, mesh, ["n1"])
    write_user_checkpoint(folder(tmp_path), 1)
    mesh.cut["n1"] = 100
    [record] = copier.finish(timeout=60)
    assert not record["verified"] and "its record says" in record["error"]
    assert names(folder(tmp_path, "n1")) == []
    [again] = copier.finish(timeout=60)
    assert again["verified"] and names(folder(tmp_path, "n1")) == [
        ".epoch-00001.ckpt.sha256",
        "epoch-00001.ckpt",
    ]


def test_a_failed_write_on_a_full_replica_leaves_no_partial_file_there(tmp_path: Path) -> None:
    mesh = FakeMesh(tmp_path)
    copier = replicator(tmp_path, mesh, ["n1"])
    for write in (write_user_checkpoint, write_checkpoint):
        mesh.full.add("n1")
        path = write(folder(tmp_path), 1 if write is write_user_checkpoint else 2, size=4 * FULL_AT)
        [record] = copier.finish(timeout=60)
        assert not record["verified"] and record["error"].startswith("copy to node n1 failed"), record
        assert names(folder(tmp_path, "n1")) in ([], [".epoch-00001.ckpt.sha256", "epoch-00001.ckpt"])
        assert not [n for n in names(folder(tmp_path, "n1")) if n.endswith(".replica")], "a partial copy left"
        mesh.full.clear()
        [again] = copier.finish(timeout=60)
        assert again["verified"] and verify_file(folder(tmp_path, "n1") / path.name) == ""


def test_a_file_of_another_format_is_copied_once_it_has_settled(tmp_path: Path) -> None:
    mesh = FakeMesh(tmp_path)
    copier = replicator(tmp_path, mesh, ["n1"], settle=1.0)
    path = write_pickle_checkpoint(folder(tmp_path), 1)
    assert copier.poll() == []
    time.sleep(0.3)
    assert copier.poll() == [] and mesh.sends == []  # still within its settle time: not known complete
    assert copier.state()[0]["error"] == "" and copier.state()[0]["failures"] == 0
    started = time.monotonic()
    [record] = copier.finish(timeout=60)
    assert record["verified"] and time.monotonic() - started >= 0.4
    data = path.read_bytes()
    assert read_record(path) == Record(len(data), hashlib.sha256(data).hexdigest())
    assert read_record(folder(tmp_path, "n1") / path.name) == read_record(path)


def test_a_users_zip_left_cut_short_is_named_once_and_copied_once_rewritten(tmp_path: Path) -> None:
    mesh = FakeMesh(tmp_path)
    copier = replicator(tmp_path, mesh, ["n1"], settle=0.2)
    path = write_user_checkpoint(folder(tmp_path), 1)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # its writer died half way
    [record] = copier.finish(timeout=60)
    assert record["error"].startswith(f"not copied: checkpoint {path} is not a whole zip archive")
    assert copier.finish(timeout=5) == [] and mesh.sends == []  # named once, not tried again
    assert names(folder(tmp_path)) == [path.name]  # a user's file is never renamed or recorded
    path.write_bytes(whole)
    [again] = copier.finish(timeout=60)
    assert again["verified"] and mesh.sends == ["n1"]


def test_newest_verified_takes_a_users_checkpoints_and_passes_over_a_cut_one_in_place(
    tmp_path: Path,
) -> None:
    job, shared = job_dir(tmp_path), tmp_path / "shared"
    write_user_checkpoint(folder(tmp_path), 1)
    write_user_checkpoint(folder(tmp_path), 1, 40)
    newest = write_user_checkpoint(folder(tmp_path), 2)
    newest.write_bytes(newest.read_bytes()[:-200])
    pickled = write_pickle_checkpoint(folder(tmp_path), 3)  # no record: cannot be verified
    skipped: list[str] = []
    assert newest_verified(job, "", JOB, skipped) == (
        "epoch-00001.step-000000040.ckpt",
        folder(tmp_path) / "epoch-00001.step-000000040.ckpt",
    )
    assert (
        len(skipped) == 2
        and "passed over, left as it is" in skipped[0]
        and "cannot be verified" in skipped[0]
    )
    assert "epoch-00002.ckpt is not a whole zip archive" in skipped[1]
    assert sorted(n for n in names(folder(tmp_path)) if "corrupt" in n) == []  # left where they are
    # with its record, the other format is whole; a newer one in checkpoint_dir comes here with its record
    data = pickled.read_bytes()
    checkpoint_names.write_record(pickled, Record(len(data), hashlib.sha256(data).hexdigest()))
    assert newest_verified(job, "", JOB)[0] == pickled.name
    there = write_user_checkpoint(shared / JOB, 4)
    name, path = newest_verified(job, str(shared), JOB)
    assert name == there.name and path is not None and path.read_bytes() == there.read_bytes()
    assert read_record(path) is not None and verify_file(path) == ""
