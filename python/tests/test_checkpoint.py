"""Checkpoint files: round trip, truncation and corruption named, atomic writes, keep last K, RNG state."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from ddp_cluster import checkpoint as ckpt
from ddp_cluster.atomic import write_atomic
from ddp_cluster.errors import CheckpointError


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
