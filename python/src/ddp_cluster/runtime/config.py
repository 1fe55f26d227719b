"""A training run's settings: :class:`TrainConfig`, one field per option of ``python -m ddp_cluster.train``
(the parser is made from the fields by :mod:`ddp_cluster.runtime.cliargs`, so each default is declared once,
on its field), and :func:`parse_args`, which checks what a field's type cannot say.

Without torch: the options' choices are declared here (the datasets, the accelerators' device types and
backends), so ``--help`` reads on a machine without torch too (the controller).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddp_cluster import accelerators
from ddp_cluster.errors import DeviceError
from ddp_cluster.runtime.cliargs import add_dataclass_arguments, dataclass_from_args, option

DATASETS = ("digits", "synthetic", "mnist", "cifar10")
# The kinds' torch device types and their backends, from the registry (each kind's module declares its own).
DEFAULT_BACKEND = accelerators.DEVICE_BACKEND
DEVICE_CHOICES = ("auto", *DEFAULT_BACKEND)
BACKEND_CHOICES = (
    "auto",
    *dict.fromkeys(
        backend for device in DEFAULT_BACKEND for backend in accelerators.by_device(device).backends
    ),
)
# The job's device, exported by train.yml to every rank (and read by user scripts).
DEVICE_VARIABLE = "DDP_DEVICE"

# The options' lower bounds (the parser's error names the option).
MINIMUMS = {"epochs": 1, "batch_size": 1, "checkpoint_keep": 1, "checkpoint_every": 0, "log_every": 0}


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The run's settings; each field is the command line option of its name (``--batch-size``), in this
    order (:func:`parse_args`)."""

    dataset: str = field(default="digits", metadata=option(choices=DATASETS))
    epochs: int = field(
        default=10, metadata=option("train until this many epochs are done (default %(default)s)")
    )
    batch_size: int = field(default=32, metadata=option("per process (default %(default)s)"))
    lr: float = field(default=0.05, metadata=option("SGD learning rate (default %(default)s)"))
    momentum: float = field(default=0.9, metadata=option("SGD momentum (default %(default)s)"))
    output_dir: Path = field(metadata=option("metrics.jsonl, summary.json, checkpoints/"))
    resume: bool = field(default=False, metadata=option("continue from the newest checkpoint in OUTPUT_DIR"))
    seed: int = field(
        default=0, metadata=option("model init, data order and synthetic data (default %(default)s)")
    )
    backend: str = field(default="auto", metadata=option(choices=BACKEND_CHOICES))
    device: str = field(
        default="auto",
        metadata=option(
            "default: DDP_DEVICE (train.yml sets the cluster's accelerator), else auto",
            choices=DEVICE_CHOICES,
        ),
    )
    data_dir: Path = field(
        default=Path("data"), metadata=option("mnist/cifar10 files (default ./%(default)s)")
    )
    checkpoint_keep: int = field(
        default=3, metadata=option("keep the newest K checkpoints (default %(default)s)")
    )
    checkpoint_every: int = field(
        default=0,
        metadata=option(
            "also checkpoint every STEPS optimizer steps within an epoch; 0: only at epoch ends "
            "(default %(default)s)",
            metavar="STEPS",
        ),
    )
    synthetic_samples: int = field(default=4096, metadata=option("training samples of 'synthetic'"))
    synthetic_features: int = field(default=32, metadata=option("input size of 'synthetic'"))
    log_every: int = field(default=10, metadata=option("log the loss every N steps; 0: epochs only"))
    num_workers: int = field(default=0, metadata=option("DataLoader worker processes (default %(default)s)"))
    dist_timeout: float = field(default=1800.0, metadata=option("collective timeout in seconds"))

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoints"


def parse_args(argv: Sequence[str] | None = None, description: str | None = None) -> TrainConfig:
    """The run's settings from the command line (``description``: what ``--help`` says first)."""
    p = argparse.ArgumentParser(
        prog="python -m ddp_cluster.train",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # --device unset reads DDP_DEVICE, so its option has no default of its own.
    add_dataclass_arguments(p, TrainConfig, defaults={"device": None})
    args = p.parse_args(argv)
    for name, minimum in MINIMUMS.items():
        if getattr(args, name) < minimum:
            p.error(f"--{name.replace('_', '-')} must be at least {minimum}, not {getattr(args, name)}")
    if args.lr <= 0 or args.num_workers < 0 or args.dist_timeout <= 0:
        p.error("--lr and --dist-timeout must be positive, --num-workers not negative")
    if args.device is None:
        try:
            args.device = requested_device()
        except DeviceError as error:
            p.error(str(error))
    return dataclass_from_args(TrainConfig, args)


def requested_device(environ: Mapping[str, str] | None = None) -> str:
    """The job's device from DDP_DEVICE (train.yml exports it), else ``auto``; DeviceError for a bad value."""
    value = (os.environ if environ is None else environ).get(DEVICE_VARIABLE, "").strip()
    if not value:
        return "auto"
    if value not in DEVICE_CHOICES:
        raise DeviceError(f"{DEVICE_VARIABLE}={value!r} is not one of {', '.join(DEVICE_CHOICES)}")
    return value
