"""Where a run starts: from scratch, or from the newest checkpoint of its output directory.

Rank 0 alone reads the checkpoints (the other nodes need no shared filesystem) and tells every rank how the
run starts (:func:`agree_on_start`), so that all fail or go on together. A run without ``--resume`` refuses a
directory that already holds checkpoints; with it, the newest checkpoint is verified and loaded into the
unwrapped model and the optimizer before the DDP wrap (:func:`restore`). A mid-epoch checkpoint carries how
far its epoch got (:class:`EpochProgress`), so that the resumed run goes on in the same data order and logs
what an uninterrupted run logs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_cluster.errors import CheckpointError
from ddp_cluster.runtime import checkpoint as ckpt
from ddp_cluster.runtime.config import TrainConfig
from ddp_cluster.runtime.distenv import DistEnv
from ddp_cluster.runtime.metrics import Reporter


@dataclass(frozen=True)
class EpochProgress:
    """How far the epoch under way got, as a mid-epoch checkpoint records it: the batches done, and the loss
    sums over all ranks of those batches ([loss x samples, samples]), of the whole epoch so far and of the
    steps since the last step log, so that a run resumed from it logs what an uninterrupted run logs."""

    batch: int = 0
    loss_sum: float = 0.0
    samples: float = 0.0
    log_loss_sum: float = 0.0
    log_samples: float = 0.0

    def to_checkpoint(self) -> dict[str, Any]:
        sums = {"loss_sum": self.loss_sum, "samples": self.samples}
        return {
            "batch": self.batch,
            "epoch_sums": sums | {"log_loss_sum": self.log_loss_sum, "log_samples": self.log_samples},
        }

    @classmethod
    def from_checkpoint(cls, saved: dict[str, Any], batch: int) -> EpochProgress:
        sums = saved.get("epoch_sums") or {}
        return cls(
            batch, *(float(sums.get(k, 0.0)) for k in ("loss_sum", "samples", "log_loss_sum", "log_samples"))
        )


@dataclass
class Resumed:
    """Where a run starts: from scratch (all defaults) or from a checkpoint."""

    path: Path | None = None
    epoch: int = 0
    step: int = 0
    last_epoch_record: dict[str, Any] = field(default_factory=dict)
    # From a mid-epoch checkpoint: how far epoch ``epoch + 1`` got (``batch``: the batches to skip in this
    # run's layout), and the RNG states to go on with once the epoch's iterator is made.
    progress: EpochProgress | None = None
    rng: dict[str, Any] | None = None


def agree_on_start(config: TrainConfig, env: DistEnv) -> tuple[Path, bytes] | None:
    """Rank 0 decides how the run starts and tells every rank, so that all fail or go on together.

    Returns the checkpoint to resume from and its verified bytes, or None to start from scratch. Only rank 0
    reads the checkpoints folder: the other nodes need no shared filesystem.
    """
    decision: tuple[str, Any, Any] = ("fresh", None, None)
    if env.is_main:
        try:
            decision = _decide_start(config)
        except CheckpointError as error:
            decision = ("error", str(error), None)
    box: list[Any] = [decision]
    dist.broadcast_object_list(box, src=0)
    action, detail, payload = box[0]
    if action == "error":
        raise CheckpointError(detail)
    return (Path(detail), payload) if action == "resume" else None


def _decide_start(config: TrainConfig) -> tuple[str, Any, Any]:
    existing = ckpt.list_checkpoints(config.checkpoint_dir)
    if not config.resume:
        if existing:
            raise CheckpointError(
                f"{config.checkpoint_dir} already holds {len(existing)} checkpoint(s) of an earlier run: "
                "pass --resume to continue it, or use another --output-dir (or delete them) to start over"
            )
        return "fresh", None, None
    if not existing:
        return "fresh", None, None
    path = existing[-1][1]
    try:
        payload = ckpt.read_verified(path)
    except CheckpointError as error:
        older = f" to resume from {existing[-2][1].name}" if len(existing) > 1 else ""
        raise CheckpointError(f"{error}; delete it{older}, or start over in another --output-dir") from None
    return "resume", str(path), payload


def restore(
    raw_model: nn.Module,
    optimizer: torch.optim.Optimizer,
    path: Path,
    payload: bytes,
    config: TrainConfig,
    reporter: Reporter,
) -> Resumed:
    """Load a verified checkpoint into the unwrapped model and the optimizer, before the DDP wrap."""
    saved = ckpt.decode(payload, path)  # onto the cpu; load_state_dict copies onto the model's device
    saved_dataset = saved.get("config", {}).get("dataset")
    if saved_dataset != config.dataset:
        raise CheckpointError(
            f"checkpoint {path} was written by a run on dataset {saved_dataset!r}, this run asks for "
            f"{config.dataset!r}: use the same --dataset, or another --output-dir"
        )
    try:
        raw_model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    except (RuntimeError, ValueError, KeyError) as error:
        raise CheckpointError(f"checkpoint {path} does not fit this model: {error}") from error
    for group in optimizer.param_groups:
        group["lr"] = config.lr  # the command line wins over the checkpoint
    ckpt.restore_rng_state(saved["rng"])
    saved_layout = (saved.get("world_size"), saved.get("config", {}).get("batch_size"))
    layout = (dist.get_world_size(), config.batch_size)
    if saved_layout != layout:
        reporter.main_line(
            f"note: checkpoint {path.name} was written with world size {saved_layout[0]} and batch size "
            f"{saved_layout[1]}, this run has {layout[0]} and {layout[1]}: it goes on, "
            "but its data order and steps differ from those of an uninterrupted run"
        )
    resumed = Resumed(path, int(saved["epoch"]), int(saved["step"]), dict(saved.get("metrics", {})))
    batch = int(saved.get("batch") or 0)  # batches done of epoch ``epoch + 1``: 0 at an epoch's end
    if batch > 0:
        # The samples already trained, counted in batches of this run's layout (rounded down).
        saved_world, saved_batch_size = int(saved_layout[0] or layout[0]), int(saved_layout[1] or layout[1])
        skip = batch * saved_world * saved_batch_size // (layout[0] * layout[1])
        resumed.progress = EpochProgress.from_checkpoint(saved, skip)
        resumed.rng = saved["rng"]
    return resumed


def relative(path: Path | None, root: Path) -> str | None:
    """Paths in summary.json are relative to the output folder, which the launcher copies elsewhere."""
    if path is None:
        return None
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
