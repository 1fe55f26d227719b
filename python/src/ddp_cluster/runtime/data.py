"""Datasets, held in memory as tensors: digits, synthetic, mnist and cifar10.

Images stay in their stored form (uint8 for MNIST and CIFAR-10, 0..16 for digits); the model's first layer
scales them (see :mod:`ddp_cluster.runtime.models`), which keeps CIFAR-10 at 150 MB per process instead of
600 MB.
MNIST and CIFAR-10 are read from their standard binary files; nothing is ever downloaded.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ddp_cluster.errors import DatasetError
from ddp_cluster.runtime.config import DATASETS

DIGITS_SPLIT_SEED = 0  # the train/test split of digits is fixed, whatever --seed says
DIGITS_TEST_FRACTION = 0.2
DIGITS_FILE = Path(__file__).parent / "datasets" / "digits.csv.gz"
SYNTHETIC_CLASSES = 10
MNIST_URL = "https://yann.lecun.com/exdb/mnist/ (or any mirror of the four idx files)"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"


@dataclass(frozen=True)
class Data:
    name: str
    train: TensorDataset
    test: TensorDataset
    input_shape: tuple[int, ...]
    num_classes: int
    input_mean: float  # of the raw stored values: the model normalizes with these
    input_std: float


def load_dataset(
    name: str,
    data_dir: Path,
    seed: int = 0,
    synthetic_samples: int = 4096,
    synthetic_features: int = 32,
) -> Data:
    if name == "digits":
        return load_digits()
    if name == "synthetic":
        return make_synthetic(synthetic_samples, synthetic_features, seed)
    if name == "mnist":
        return load_mnist(data_dir)
    if name == "cifar10":
        return load_cifar10(data_dir)
    raise DatasetError(f"--dataset {name!r} is not one of {', '.join(DATASETS)}")


def load_digits() -> Data:
    """The 8x8 digits (UCI's optdigits test set as scikit-learn ships it: 1797 images, 64 values 0..16 and
    the label per row), bundled with the package so that the node image needs no scikit-learn (whose pins do
    not fit a CANN base's numpy), split 80/20 with a fixed seed."""
    with gzip.open(DIGITS_FILE, "rt") as rows:
        table = np.loadtxt(rows, delimiter=",", dtype=np.float32)
    images = np.ascontiguousarray(table[:, :-1])  # 0..16
    labels = table[:, -1].astype(np.int64)
    order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(labels))
    n_test = round(len(labels) * DIGITS_TEST_FRACTION)
    test_idx, train_idx = order[:n_test], order[n_test:]
    return Data(
        name="digits",
        train=_tensors(images[train_idx], labels[train_idx]),
        test=_tensors(images[test_idx], labels[test_idx]),
        input_shape=(64,),
        num_classes=10,
        input_mean=float(images[train_idx].mean()),
        input_std=float(images[train_idx].std()),
    )


def make_synthetic(samples: int, features: int, seed: int) -> Data:
    """A seeded, learnable classification task: labels from a random linear teacher, plus noise.

    ``samples`` training samples and a quarter as many test samples; the same seed gives the same data.
    """
    if samples < 1 or features < 1:
        raise DatasetError(
            f"--synthetic-samples ({samples}) and --synthetic-features ({features}) must be >= 1"
        )
    rng = np.random.default_rng(seed)
    n_test = max(1, samples // 4)
    inputs = rng.standard_normal((samples + n_test, features), dtype=np.float32)
    teacher = rng.standard_normal((features, SYNTHETIC_CLASSES), dtype=np.float32)
    noise = 0.5 * rng.standard_normal((samples + n_test, SYNTHETIC_CLASSES), dtype=np.float32)
    labels = np.argmax(inputs @ teacher + noise, axis=1).astype(np.int64)
    return Data(
        name="synthetic",
        train=_tensors(inputs[:samples], labels[:samples]),
        test=_tensors(inputs[samples:], labels[samples:]),
        input_shape=(features,),
        num_classes=SYNTHETIC_CLASSES,
        input_mean=0.0,
        input_std=1.0,
    )


MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def load_mnist(data_dir: Path) -> Data:
    """MNIST from its four idx files (optionally .gz) in DATA_DIR, DATA_DIR/mnist or DATA_DIR/MNIST/raw."""
    where = [data_dir, data_dir / "mnist", data_dir / "MNIST" / "raw"]
    hint = f"download the four MNIST idx files from {MNIST_URL} into {data_dir}"
    arrays = {key: read_idx(_find(name, where, hint, gzipped_too=True)) for key, name in MNIST_FILES.items()}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DatasetError(
                f"MNIST {split} files do not fit together: images {images.shape}, labels {labels.shape} "
                f"(in {data_dir})"
            )
    train_images = arrays["train_images"]
    return Data(
        name="mnist",
        train=_tensors(train_images[:, None], arrays["train_labels"].astype(np.int64)),
        test=_tensors(arrays["test_images"][:, None], arrays["test_labels"].astype(np.int64)),
        input_shape=(1, *train_images.shape[1:]),
        num_classes=10,
        input_mean=255 * 0.1307,
        input_std=255 * 0.3081,
    )


def read_idx(path: Path) -> np.ndarray:
    """Read an idx file (the MNIST format): magic 0x0000 08 NDIM, NDIM big-endian sizes, then uint8 data."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DatasetError(f"{path} is not an unsigned-byte idx file (bad magic {raw[:4].hex()})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise DatasetError(f"{path} is truncated: its header is incomplete")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise DatasetError(
            f"{path} is truncated or padded: its header says {shape} = {expected} bytes, "
            f"the file has {len(raw) - header}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape).copy()  # writable, for torch


CIFAR10_RECORD = 1 + 3 * 32 * 32
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch.bin"


def load_cifar10(data_dir: Path) -> Data:
    """CIFAR-10, binary version: data_batch_1..5.bin and test_batch.bin (a record: 1 label byte, 3072 px)."""
    where = [data_dir / "cifar-10-batches-bin", data_dir]
    hint = f"download {CIFAR10_URL} and extract it into {data_dir}"
    train = [read_cifar10_batch(_find(name, where, hint)) for name in CIFAR10_TRAIN_FILES]
    test_images, test_labels = read_cifar10_batch(_find(CIFAR10_TEST_FILE, where, hint))
    return Data(
        name="cifar10",
        train=_tensors(np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train])),
        test=_tensors(test_images, test_labels),
        input_shape=(3, 32, 32),
        num_classes=10,
        input_mean=255 * 0.5,
        input_std=255 * 0.25,
    )


def read_cifar10_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % CIFAR10_RECORD:
        raise DatasetError(
            f"{path} is not a CIFAR-10 binary batch: {raw.size} bytes is not a multiple of {CIFAR10_RECORD}"
        )
    records = raw.reshape(-1, CIFAR10_RECORD)
    labels = records[:, 0].astype(np.int64)
    if labels.max() > 9:
        raise DatasetError(f"{path} holds label {labels.max()}: CIFAR-10 labels are 0..9")
    return records[:, 1:].reshape(-1, 3, 32, 32).copy(), labels


def _find(name: str, where: list[Path], hint: str, gzipped_too: bool = False) -> Path:
    for folder in where:
        for candidate in (folder / name, folder / f"{name}.gz") if gzipped_too else (folder / name,):
            if candidate.is_file():
                return candidate
    searched = ", ".join(str(folder) for folder in where)
    raise DatasetError(f"dataset file {name} not found (looked in {searched}): {hint}")


def _tensors(inputs: np.ndarray, labels: np.ndarray) -> TensorDataset:
    return TensorDataset(torch.from_numpy(np.ascontiguousarray(inputs)), torch.from_numpy(labels))
