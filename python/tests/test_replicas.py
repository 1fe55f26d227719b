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
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from ddp_cluster.runtime import checkpoint_names
from ddp_cluster.runtime.checkpoint_names import checkpoint_name, verify_file
from ddp_cluster.supervisor import replicas
from ddp_cluster.supervisor.replicas import Replicator, newest_verified

JOB = "job-7"


class FakeMesh:
    """Nodes as folders under ``root``; a node in ``down`` does not answer."""

    def __init__(self, root: Path, first: str = "n0") -> None:
        self.root, self.first = root, first
        self.down: set[str] = set()
        self.cut: dict[str, int] = {}  # node -> bytes lost off the end of its next transfer
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
        done = subprocess.run(
            ["/bin/sh", "-c", self.here(node, command)],
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
    foreign = tmp_path / "foreign.ckpt"
    foreign.write_bytes(b"PK\x03\x04" + bytes(100))  # a zip, as a plain torch.save writes
    assert "is not a ddp_cluster checkpoint (magic" in verify_file(foreign)
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
    assert "is not a ddp_cluster checkpoint" in skipped[0] and damaged.exists()


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
