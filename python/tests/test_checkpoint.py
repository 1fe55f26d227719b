"""Checkpoint files: round trip, truncation and corruption named, atomic writes, keep last K, RNG state."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from ddp_cluster.errors import CheckpointError
from ddp_cluster.files import write_atomic
from ddp_cluster.runtime import checkpoint as ckpt


def sample_state() -> dict[str, object]:
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": 2,
        "step": 40,
        "rng": ckpt.capture_rng_state(),
        "config": {"dataset": "digits", "output_dir": "/tmp/x"},
    }


def save(tmp_path: Path, epoch: int = 1, keep: int = 3) -> Path:
    return ckpt.save_checkpoint(tmp_path, epoch, sample_state(), keep)


def test_round_trip_is_complete(tmp_path: Path) -> None:
    state = sample_state()
    path = ckpt.save_checkpoint(tmp_path, 7, state, keep=3)
    assert path.name == "epoch-00007.ckpt"
    loaded = ckpt.load_checkpoint(path)
    assert loaded["epoch"] == 2 and loaded["step"] == 40 and loaded["config"]["dataset"] == "digits"
    for name, tensor in state["model"].items():  # type: ignore[attr-defined]
        assert torch.equal(loaded["model"][name], tensor)
    momentum = loaded["optimizer"]["state"][0]["momentum_buffer"]
    assert torch.equal(momentum, state["optimizer"]["state"][0]["momentum_buffer"])  # type: ignore[index]


def test_truncated_file_is_named(tmp_path: Path) -> None:
    path = save(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is truncated or padded"):
        ckpt.load_checkpoint(path)
    path.write_bytes(data[:20])
    with pytest.raises(CheckpointError, match="shorter than its header"):
        ckpt.load_checkpoint(path)


def test_flipped_byte_is_detected(tmp_path: Path) -> None:
    state = sample_state()
    path = ckpt.save_checkpoint(tmp_path, 1, state, keep=3)
    data = bytearray(path.read_bytes())
    weights = state["model"]["weight"].numpy().tobytes()  # type: ignore[index]
    where = bytes(data).index(weights)
    data[where + 5] ^= 0x01  # a bit of a stored weight
    path.write_bytes(bytes(data))
    # torch.load alone would load the altered weight without a word:
    altered = torch.load(io.BytesIO(bytes(data[ckpt.HEADER.size :])), weights_only=True)
    assert not torch.equal(altered["model"]["weight"], state["model"]["weight"])  # type: ignore[index]
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is corrupt: its SHA-256 does not match"):
        ckpt.load_checkpoint(path)


def test_foreign_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "epoch-00001.ckpt"
    torch.save({"model": {}}, path)  # a plain torch.save, not ours
    with pytest.raises(CheckpointError, match="is not a ddp_cluster checkpoint"):
        ckpt.load_checkpoint(path)


def test_keep_last_k_and_ignore_temporary_files(tmp_path: Path) -> None:
    for epoch in range(1, 6):
        save(tmp_path, epoch, keep=2)
    (tmp_path / ".epoch-00009.ckpt.tmp-123").write_bytes(b"half")  # a crash mid-write
    assert [e for e, _ in ckpt.list_checkpoints(tmp_path)] == [4, 5]
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "epoch-00005.ckpt"
    assert ckpt.latest_checkpoint(tmp_path / "missing") is None


def test_atomic_write_leaves_no_temporary_file_and_keeps_the_old_one_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "summary.json"
    write_atomic(target, b"old")
    assert os.listdir(tmp_path) == ["summary.json"]

    def broken_fsync(fd: int) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk gone"):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["summary.json"]


def test_rng_state_round_trip() -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    saved = ckpt.capture_rng_state()
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    ckpt.restore_rng_state(saved)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_names_of_both_kinds_and_their_order() -> None:
    assert ckpt.checkpoint_name(3) == "epoch-00003.ckpt"
    assert ckpt.checkpoint_name(3, 150) == "epoch-00003.step-000000150.ckpt"
    assert ckpt.checkpoint_name(0, 4) == "epoch-00000.step-000000004.ckpt"
    assert ckpt.checkpoint_order("epoch-00003.ckpt") == (3, 0)
    assert ckpt.checkpoint_order("epoch-00003.step-000000150.ckpt") == (3, 150)
    for other in [
        "epoch-00003.step-.ckpt",
        "epoch-00003.step-000000150.ckpt.tmp",
        ".epoch-00003.step-000000150.ckpt.tmp-123",
        "epoch-00003.step-000000150",
        "epoch-00003.steps-000000150.ckpt",
        "epoch-.ckpt",
        "latest.ckpt",
    ]:
        assert ckpt.NAME.match(other) is None and ckpt.checkpoint_order(other) is None, other
    # The order of training, as plain strings (pack.py) and as (epoch, step) (list_checkpoints) alike.
    training_order = [(0, 4), (0, 8), (1, 0), (1, 12), (1, 100), (2, 0), (2, 17), (10, 0)]
    names = [ckpt.checkpoint_name(e, s or None) for e, s in training_order]
    assert names[:4] == [
        "epoch-00000.step-000000004.ckpt",
        "epoch-00000.step-000000008.ckpt",
        "epoch-00001.ckpt",
        "epoch-00001.step-000000012.ckpt",
    ]
    assert sorted(names) == names
    assert sorted(names, key=ckpt.checkpoint_order) == names  # type: ignore[arg-type]
    assert "epoch-00003.ckpt" < "epoch-00003.step-000000150.ckpt" < "epoch-00004.ckpt"


def test_list_latest_and_keep_order_mid_epoch_checkpoints_by_epoch_then_step(tmp_path: Path) -> None:
    for epoch, step in [(1, 12), (2, None), (0, 4), (1, 9), (1, None), (2, 20)]:  # written out of order
        path = ckpt.save_checkpoint(tmp_path, epoch, sample_state(), keep=10, step=step)
        assert path.name == ckpt.checkpoint_name(epoch, step)
    listed = ckpt.list_checkpoints(tmp_path)
    assert [path.name for _, path in listed] == [
        "epoch-00000.step-000000004.ckpt",
        "epoch-00001.ckpt",
        "epoch-00001.step-000000009.ckpt",
        "epoch-00001.step-000000012.ckpt",
        "epoch-00002.ckpt",
        "epoch-00002.step-000000020.ckpt",
    ]
    assert [epoch for epoch, _ in listed] == [0, 1, 1, 1, 2, 2]  # still (epoch, path)
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "epoch-00002.step-000000020.ckpt"
    # keep counts both kinds, the oldest go first
    ckpt.save_checkpoint(tmp_path, 3, sample_state(), keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "epoch-00002.ckpt",
        "epoch-00002.step-000000020.ckpt",
        "epoch-00003.ckpt",
    ]
    ckpt.save_checkpoint(tmp_path, 3, sample_state(), keep=3, step=31)
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "epoch-00003.step-000000031.ckpt"
    assert ckpt.list_checkpoints(tmp_path)[0][1].name == "epoch-00002.step-000000020.ckpt"
    # by number, not by name, past 9 digits of steps
    for name in ["epoch-00004.step-1000000000.ckpt", "epoch-00004.step-999999999.ckpt", "epoch-00004.ckpt"]:
        (tmp_path / name).write_bytes(b"")
    assert [p.name for _, p in ckpt.list_checkpoints(tmp_path)][-3:] == [
        "epoch-00004.ckpt",
        "epoch-00004.step-999999999.ckpt",
        "epoch-00004.step-1000000000.ckpt",
    ]


def test_pack_keeps_the_checkpoint_that_resume_would_load(tmp_path: Path) -> None:
    from ddp_cluster.server import pack

    job_dir = tmp_path / "jobs" / "job-1"  # the node's workspace being tmp_path
    checkpoints = job_dir / pack.CHECKPOINTS
    for epoch, step in [(0, 4), (1, None), (1, 12), (2, None), (2, 17)]:
        ckpt.save_checkpoint(checkpoints, epoch, sample_state(), keep=3, step=step)
        _, newest, _ = pack.members(str(job_dir), str(tmp_path))
        assert job_dir / newest == ckpt.latest_checkpoint(checkpoints)
    assert newest.endswith("epoch-00002.step-000000017.ckpt")


def test_the_supervisors_torch_free_check_agrees_with_loading(tmp_path: Path) -> None:
    """verify_file (the supervisor's, on its copies) says what read_verified (a rank's, on load) raises."""
    from ddp_cluster.runtime.checkpoint_names import verify_file

    path = save(tmp_path)
    assert verify_file(path) == ""
    data = path.read_bytes()
    altered = bytearray(data)
    altered[-10] ^= 0x01
    for damaged, expected in [
        (data[: len(data) // 2], "is truncated or padded"),
        (data[:20], "shorter than its header"),
        (bytes(altered), "is corrupt: its SHA-256 does not match"),
    ]:
        path.write_bytes(damaged)
        said = verify_file(path)
        assert expected in said
        with pytest.raises(CheckpointError) as raised:
            ckpt.read_verified(path)
        assert str(raised.value) == said
    assert verify_file(tmp_path / "gone.ckpt").startswith("cannot read checkpoint")
    # A user's plain torch.save is whole to the supervisor (its zip archive), not the entrypoint's to load.
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"model": {}}, foreign)
    assert verify_file(foreign) == ""
    with pytest.raises(CheckpointError, match="is not a ddp_cluster checkpoint"):
        ckpt.read_verified(foreign)


# ddp_cluster.checkpoint: the public helper for a user's own script


def test_the_helper_saves_atomically_under_the_documented_name_with_our_header_and_loads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddp_cluster import checkpoint
    from ddp_cluster.runtime.checkpoint_names import MAGIC, check_file

    monkeypatch.setenv("DDP_JOB_DIR", str(tmp_path / "job"))
    monkeypatch.delenv("RANK", raising=False)
    state = sample_state()
    path = checkpoint.save(state, epoch=3)
    assert path == tmp_path / "job" / "output" / "checkpoints" / "epoch-00003.ckpt"
    assert path.read_bytes()[:8] == MAGIC and check_file(path).rule == "header"
    assert sorted(p.name for p in path.parent.iterdir()) == ["epoch-00003.ckpt"]  # no temporary left
    loaded = checkpoint.load(path)
    assert loaded["epoch"] == 2 and torch.equal(loaded["model"]["weight"], state["model"]["weight"])  # type: ignore[index]
    # the entrypoint's own reader agrees: one format
    assert ckpt.read_verified(path)[:2] == b"PK"
    mid = checkpoint.save({"step": 7}, epoch=3, step=70, keep=2)
    assert mid is not None and mid.name == "epoch-00003.step-000000070.ckpt"
    checkpoint.save({"step": 9}, epoch=4, keep=2)
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "epoch-00003.step-000000070.ckpt",
        "epoch-00004.ckpt",
    ]


def test_the_helper_writes_on_rank_0_only_and_leaves_nothing_when_the_save_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddp_cluster import checkpoint

    monkeypatch.setenv("RANK", "1")
    assert checkpoint.save({"a": 1}, epoch=1, directory=tmp_path) is None and list(tmp_path.iterdir()) == []
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(Exception):  # noqa: B017 - pickle's own error: a lambda cannot be saved
        checkpoint.save({"f": lambda: 1}, epoch=1, directory=tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(CheckpointError, match="epoch=-1 must be a whole number of 0 or more"):
        checkpoint.save({}, epoch=-1, directory=tmp_path)
    monkeypatch.delenv("DDP_JOB_DIR", raising=False)
    with pytest.raises(CheckpointError, match="DDP_JOB_DIR is not set"):
        checkpoint.save({}, epoch=1)


def test_the_helper_loads_what_this_start_resumes_from_a_plain_torch_save_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddp_cluster import checkpoint

    monkeypatch.delenv("DDP_RESUME_FROM", raising=False)
    assert checkpoint.load() is None  # a fresh start
    plain = tmp_path / "epoch-00002.ckpt"
    torch.save({"epoch": 2, "w": torch.arange(5)}, plain)  # a user's own plain torch.save
    monkeypatch.setenv("DDP_RESUME_FROM", str(plain))
    loaded = checkpoint.load()
    assert loaded["epoch"] == 2 and torch.equal(loaded["w"], torch.arange(5))
    data = plain.read_bytes()
    plain.write_bytes(data[: len(data) - 40])  # cut short: refused, named, never half loaded
    with pytest.raises(CheckpointError, match=f"checkpoint {plain} is not a whole zip archive"):
        checkpoint.load()
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        checkpoint.load(tmp_path / "gone.ckpt")
