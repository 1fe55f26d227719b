"""Datasets: digits split, seeded synthetic data, MNIST idx and CIFAR-10 binary readers, missing files."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from ddp_cluster.errors import DatasetError
from ddp_cluster.runtime.data import load_dataset, read_idx
from ddp_cluster.runtime.models import build_model


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", n) for n in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)


def fake_mnist(folder: Path, n_train: int = 20, n_test: int = 10, compress: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)), compress)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10, compress)


def fake_cifar(folder: Path, per_file: int = 4) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        labels = np.arange(per_file, dtype=np.uint8)[:, None] % 10
        pixels = rng.integers(0, 256, (per_file, 3072), dtype=np.uint8)
        (folder / name).write_bytes(np.concatenate([labels, pixels], axis=1).tobytes())


def test_digits_split_is_fixed_and_disjoint() -> None:
    a, b = load_dataset("digits", Path("unused"), seed=1), load_dataset("digits", Path("unused"), seed=2)
    assert len(a.train) + len(a.test) == 1797 and len(a.test) == 359
    assert torch.equal(a.test.tensors[0], b.test.tensors[0])  # --seed does not move the test set
    train_rows = {tuple(row.tolist()) for row in a.train.tensors[0]}
    overlap = sum(tuple(row.tolist()) in train_rows for row in a.test.tensors[0])
    assert overlap < 10  # the digits set has a few exact duplicate images, nothing more


def test_synthetic_is_seeded_and_sized() -> None:
    a = load_dataset("synthetic", Path("unused"), seed=3, synthetic_samples=100, synthetic_features=7)
    b = load_dataset("synthetic", Path("unused"), seed=3, synthetic_samples=100, synthetic_features=7)
    c = load_dataset("synthetic", Path("unused"), seed=4, synthetic_samples=100, synthetic_features=7)
    assert len(a.train) == 100 and len(a.test) == 25 and a.input_shape == (7,)
    assert torch.equal(a.train.tensors[0], b.train.tensors[0]) and torch.equal(
        a.train.tensors[1], b.train.tensors[1]
    )
    assert not torch.equal(a.train.tensors[0], c.train.tensors[0])
    assert len(set(a.train.tensors[1].tolist())) > 3  # labels are spread over the classes


@pytest.mark.parametrize("layout", ["flat", "mnist", "MNIST/raw", "gzipped"])
def test_mnist_idx_files(tmp_path: Path, layout: str) -> None:
    folder = tmp_path if layout in ("flat", "gzipped") else tmp_path / layout
    fake_mnist(folder, compress=layout == "gzipped")
    data = load_dataset("mnist", tmp_path)
    assert len(data.train) == 20 and len(data.test) == 10 and data.input_shape == (1, 28, 28)
    assert data.train.tensors[0].dtype == torch.uint8 and data.train.tensors[1].tolist()[:3] == [0, 1, 2]
    logits = build_model(data)(data.train.tensors[0][:4])
    assert logits.shape == (4, 10)


def test_mnist_missing_file_names_it_and_where_to_put_it(tmp_path: Path) -> None:
    fake_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DatasetError) as raised:
        load_dataset("mnist", tmp_path)
    message = str(raised.value)
    assert (
        "t10k-labels-idx1-ubyte not found" in message and str(tmp_path) in message and "download" in message
    )


def test_mnist_truncated_file_is_named(tmp_path: Path) -> None:
    fake_mnist(tmp_path)
    images = tmp_path / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-7])
    with pytest.raises(DatasetError, match="train-images-idx3-ubyte is truncated"):
        load_dataset("mnist", tmp_path)
    images.write_bytes(b"\x00\x00\x0d\x01")
    with pytest.raises(DatasetError, match="bad magic"):
        read_idx(images)


def test_cifar10_binary_batches(tmp_path: Path) -> None:
    fake_cifar(tmp_path / "cifar-10-batches-bin")
    data = load_dataset("cifar10", tmp_path)
    assert len(data.train) == 20 and len(data.test) == 4 and data.input_shape == (3, 32, 32)
    first = (tmp_path / "cifar-10-batches-bin" / "data_batch_1.bin").read_bytes()
    assert data.train.tensors[0][0].flatten().tolist() == list(first[1:3073])  # channel-major, as stored
    assert build_model(data)(data.train.tensors[0][:2]).shape == (2, 10)


def test_cifar10_missing_and_malformed_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"data_batch_1\.bin not found.*cifar-10-binary\.tar\.gz"):
        load_dataset("cifar10", tmp_path)
    fake_cifar(tmp_path)
    (tmp_path / "data_batch_3.bin").write_bytes(b"\x01" * 100)
    with pytest.raises(DatasetError, match=r"data_batch_3\.bin is not a CIFAR-10 binary batch"):
        load_dataset("cifar10", tmp_path)


def test_unknown_dataset() -> None:
    with pytest.raises(DatasetError, match="'imagenet' is not one of"):
        load_dataset("imagenet", Path("."))


def test_bundled_digits_are_the_whole_8x8_set() -> None:
    data = load_dataset("digits", Path("unused"))
    images = torch.cat([data.train.tensors[0], data.test.tensors[0]])
    labels = torch.cat([data.train.tensors[1], data.test.tensors[1]])
    assert images.shape == (1797, 64) and labels.shape == (1797,)
    assert images.min() == 0 and images.max() == 16 and torch.equal(images, images.round())
    assert torch.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
