"""Checkpoints: complete, checksummed, written atomically, the last K kept.

Names: :mod:`ddp_cluster.runtime.checkpoint_names` (``epoch-NNNNN.ckpt``,
``epoch-NNNNN.step-SSSSSSSSS.ckpt``; torch-free, so the supervisor and the controller share them).
:func:`list_checkpoints` orders by (epoch, step).

A checkpoint file is a 48-byte header (magic ``DDPCKPT1``, payload length as a little-endian uint64, SHA-256
of the payload; the header and its check live in :mod:`~ddp_cluster.runtime.checkpoint_names`, torch-free,
so the supervisor checks its copies with them) followed by the payload, a ``torch.save`` of a dict of plain
types and tensors (model state, optimizer state, epoch, step, the batches done of the epoch under way, RNG
states, config). A truncated or altered file fails the length or checksum test and is named in the error; it
is never loaded. Loading uses ``weights_only=True`` and ``map_location="cpu"``. Read one yourself with
:func:`load_checkpoint`.

Writing: a hidden temporary file in the same folder, fsync, rename over the final name, fsync the folder, so
a crash leaves either the previous set of checkpoints or the new one, never half a file under a final name.
"""

from __future__ import annotations

import hashlib
import io
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ddp_cluster.errors import CheckpointError
from ddp_cluster.files import write_atomic
from ddp_cluster.runtime import checkpoint_names
from ddp_cluster.runtime.checkpoint_names import HEADER as HEADER
from ddp_cluster.runtime.checkpoint_names import NAME as NAME
from ddp_cluster.runtime.checkpoint_names import checkpoint_name, checkpoint_order

FORMAT_VERSION = 1


def encode(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    return checkpoint_names.header(payload) + payload


def read_verified(path: Path) -> bytes:
    """The payload of a checkpoint file, after checking its header, length and checksum."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error}") from error
    wrong = checkpoint_names.problem(
        path, len(data), data[: HEADER.size], lambda: hashlib.sha256(memoryview(data)[HEADER.size :]).digest()
    )
    if wrong:
        raise CheckpointError(wrong)
    return data[HEADER.size :]


def decode(payload: bytes, path: Path | str) -> dict[str, Any]:
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(
            f"checkpoint {path} passed its checksum but cannot be loaded: {error}"
        ) from error
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has an unknown layout (format_version != {FORMAT_VERSION})")
    return state


def load_checkpoint(path: Path | str) -> dict[str, Any]:
    """Verify and load one checkpoint file onto the cpu."""
    return decode(read_verified(Path(path)), path)


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(epoch, path) of every checkpoint in ``directory``, oldest first by (epoch, step) (an epoch-end one
    counts as step 0 of its epoch); temporary files are ignored."""
    if not directory.is_dir():
        return []
    found = [(order, p) for p in directory.iterdir() if (order := checkpoint_order(p.name)) and p.is_file()]
    return [(epoch, path) for (epoch, _), path in sorted(found)]


def latest_checkpoint(directory: Path) -> Path | None:
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1][1] if checkpoints else None


def save_checkpoint(
    directory: Path, epoch: int, state: dict[str, Any], keep: int, step: int | None = None
) -> Path:
    """Write the checkpoint of ``epoch`` (with ``step``: the mid-epoch one at that global step) and delete all
    but the newest ``keep``, mid-epoch ones included; returns its path."""
    path = directory / checkpoint_name(epoch, step)
    write_atomic(path, encode({"format_version": FORMAT_VERSION, **state}))
    for _, old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def capture_rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states, as plain types and tensors (loadable with weights_only=True)."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
