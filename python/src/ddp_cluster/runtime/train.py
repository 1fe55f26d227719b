"""The DDP training entrypoint: ``python -m ddp_cluster.train --dataset digits --epochs 5 --output-dir DIR``.

Runs as one process per device under torchrun, mpirun (OpenMPI) or srun (Slurm), or alone. ``--batch-size``
is per process: the global batch is ``batch_size * world_size``. Writes ``DIR/metrics.jsonl``,
``DIR/summary.json``, ``DIR/checkpoints/`` and TensorBoard's event files (in ``$DDP_TENSORBOARD_DIR``, else
``DIR/tensorboard``) (rank 0 only); see :mod:`ddp_cluster.runtime.metrics` for what each rank prints and the
event files' tags.

Checkpoints: rank 0 writes ``checkpoints/epoch-NNNNN.ckpt`` at the end of each epoch (N epochs completed) and,
with ``--checkpoint-every STEPS``, ``checkpoints/epoch-NNNNN.step-SSSSSSSSS.ckpt`` every STEPS optimizer steps
within an epoch (S the global step; none at an epoch's last batch, which the epoch's own checkpoint covers),
so that a restart redoes at most STEPS steps. Each is written atomically and checksummed; the newest
``--checkpoint-keep`` of both kinds are kept (see :mod:`ddp_cluster.runtime.checkpoint`).

``--resume`` continues from the newest checkpoint and says which; without a checkpoint it says so and
starts from scratch; with ``--epochs`` at or below the checkpoint's epoch it stops with an error naming both
(``--epochs`` is the total to reach, and a resumed run that trains nothing is a mistake, not a success).
From a mid-epoch checkpoint it goes on with that epoch, in the same data order, past the batches already
trained (with another world size or batch size, past as many samples as were trained, rounded down), and
reports the epoch's loss and samples as an uninterrupted run does. A run without ``--resume`` refuses a
directory that already holds checkpoints.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

try:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset
except ImportError as missing:  # the controller installs the package without torch
    raise ImportError(
        f"ddp_cluster.train needs torch and numpy ({missing}): pip install 'ddp-cluster[train]'"
    ) from missing

from ddp_cluster.errors import CheckpointError, DdpClusterError
from ddp_cluster.runtime import checkpoint as ckpt
from ddp_cluster.runtime import config as run_config
from ddp_cluster.runtime.config import TrainConfig
from ddp_cluster.runtime.data import Data, load_dataset
from ddp_cluster.runtime.device import Placement, announce_binding, select_placement, where
from ddp_cluster.runtime.distenv import DistEnv, resolve_dist_env
from ddp_cluster.runtime.finish import exit_process
from ddp_cluster.runtime.group import process_group
from ddp_cluster.runtime.heartbeat import heartbeat, install_stack_dump
from ddp_cluster.runtime.metrics import Reporter, WriterFactory, tensorboard_dir, tensorboardx_writer
from ddp_cluster.runtime.models import build_model
from ddp_cluster.runtime.resume import EpochProgress, Resumed, agree_on_start, relative, restore
from ddp_cluster.runtime.secrets import load_secrets
from ddp_cluster.text import plain

# The run's settings and their command line are ddp_cluster.runtime.config's, where a run starts is
# ddp_cluster.runtime.resume's; the loop is this module's.
__all__ = ["TrainConfig", "main", "parse_args", "train"]

EVAL_BATCH_SIZE = 1024


@dataclass
class TrainState:
    model: DDP
    optimizer: torch.optim.Optimizer
    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps taken


def parse_args(argv: Sequence[str] | None = None) -> TrainConfig:
    """The run's settings from the command line; ``--help`` begins with this module's documentation."""
    return run_config.parse_args(argv, description=plain(__doc__))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class EpochBatches(BatchSampler):
    """One rank's batches of an epoch, from batch ``start`` on: a run resumed from a mid-epoch checkpoint
    skips the batches already trained without reading them. ``len()`` stays the epoch's whole count."""

    def __init__(self, shares: DistributedSampler[Any], batch_size: int) -> None:
        super().__init__(shares, batch_size=batch_size, drop_last=False)
        self.shares = shares
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Epoch ``epoch``'s shuffle (the same on every rank, and on a resume), from batch ``start`` on."""
        self.shares.set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[list[int]]:
        return itertools.islice(super().__iter__(), self.start, None)


def make_loader(
    dataset: TensorDataset, env: DistEnv, config: TrainConfig, pin: bool
) -> tuple[DataLoader[Any], EpochBatches]:
    """Each rank reads its 1/world_size share; a batch is read with one tensor index, not sample by sample."""
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=config.seed, drop_last=False
    )
    batches = EpochBatches(sampler, config.batch_size)
    loader: DataLoader[Any] = DataLoader(
        dataset, sampler=batches, batch_size=None, num_workers=config.num_workers, pin_memory=pin
    )
    return loader, batches


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float32, device=device)  # float32: see loss_sums
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [float(v) for v in tensor.tolist()]


def run_batch(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: Any, targets: Any) -> torch.Tensor:
    """One optimizer step; returns the batch's mean loss, detached (still on the device: no sync here)."""
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(inputs), targets)
    loss.backward()  # type: ignore[no-untyped-call]  # DDP averages the gradients across ranks here
    optimizer.step()
    return loss.detach()


@dataclass(frozen=True)
class LogWindow:
    """The steps this run trained since the last log (or the epoch's start): what their speed is made of."""

    seconds: float  # wall time on this rank, up to when the window's last step was issued
    steps: int
    samples: int  # over all ranks (every rank's share of a batch has the same size: the sampler pads)
    lr: float  # the optimizer's, at the window's end


@dataclass
class PendingLog:
    """A step log whose loss is being all-reduced in the background: training does not wait for it."""

    work: Any  # the collective's handle
    sums: torch.Tensor  # [sum of loss x samples, samples], reduced in place
    epoch: int
    step: int
    batch: int
    window: LogWindow
    carried: tuple[float, float] = (0.0, 0.0)  # the reduced sums of the window's steps before a checkpoint

    def report(self, reporter: Reporter, epochs: int, batches: int) -> None:
        self.work.wait()
        loss_sum, count = self.sums.tolist()
        loss_sum, count = self.carried[0] + loss_sum, self.carried[1] + count
        mean = loss_sum / max(count, 1.0)
        seconds = max(self.window.seconds, 1e-9)
        reporter.progress(self.epoch, epochs, self.batch, batches, mean)
        reporter.record(
            {
                "kind": "step",
                "epoch": self.epoch,
                "step": self.step,
                "loss": mean,
                "samples": int(count),
                "lr": self.window.lr,
                "samples_per_s": self.window.samples / seconds,
                "step_time_s": seconds / max(self.window.steps, 1),
            }
        )


@dataclass(frozen=True)
class EpochResult:
    loss: float  # mean over all ranks and the whole epoch (batches before a resume included)
    samples: float  # over all ranks, the whole epoch
    trained_samples: float  # over all ranks, by this run (less than ``samples`` in an epoch resumed midway)
    batches: int  # this rank's batches trained by this run
    local_loss: float  # this rank's mean over those batches


def run_epoch(
    state: TrainState,
    loader: DataLoader[Any],
    device: torch.device,
    config: TrainConfig,
    reporter: Reporter,
    start: EpochProgress | None = None,
    rng: dict[str, Any] | None = None,
    checkpoint: Callable[[EpochProgress], None] | None = None,
) -> EpochResult:
    """Train one epoch, or its rest after ``start.batch`` batches (the loader skips those).

    Every ``log_every`` steps the losses since the last log are all-reduced asynchronously and reported at
    the next log point (or the epoch's end), so logging costs no wait on the other ranks; with them the
    window's speed (samples/s, seconds a step: wall time as this rank saw it, so a checkpoint written within
    the window counts). With
    ``checkpoint_every``, every that many global steps but at the epoch's last batch, every rank reports the
    pending log (so no step record up to the checkpoint is lost with a killed run), all-reduces the loss
    sums so far, and calls ``checkpoint`` with the epoch's progress (rank 0 writes it). ``rng``: the RNG
    states to restore once the epoch's iterator is made (making it draws a seed from the torch RNG, which
    the run that wrote the mid-epoch checkpoint did before it).
    """
    state.model.train()  # type: ignore[no-untyped-call]
    start = start or EpochProgress()
    batches = len(loader)
    carried = (start.loss_sum, start.samples)  # reduced sums of the epoch's batches before ``losses``
    log_carried = (start.log_loss_sum, start.log_samples)  # ... of the unlogged steps before ``losses``
    local_carried = (0.0, 0.0)  # this rank's sums of the batches of this run before ``losses``
    losses: list[torch.Tensor] = []
    sizes: list[int] = []
    logged = 0  # entries of losses/sizes already logged
    pending: PendingLog | None = None
    trained = 0
    window_start, window_steps, window_samples = time.perf_counter(), 0, 0
    world_size = dist.get_world_size()
    iterator = iter(loader)
    if rng is not None:
        ckpt.restore_rng_state(rng)
    for batch, (inputs, targets) in enumerate(iterator, start=start.batch + 1):
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        losses.append(run_batch(state.model, state.optimizer, inputs, targets))
        sizes.append(int(targets.shape[0]))
        state.step += 1
        trained += 1
        window_steps += 1
        window_samples += sizes[-1]
        heartbeat()  # a step is progress, however rarely it is logged (at most one touch a second)
        if config.log_every and state.step % config.log_every == 0:
            if pending is not None:
                pending.report(reporter, config.epochs, batches)
            sums = loss_sums(losses[logged:], sizes[logged:], device)
            work = dist.all_reduce(sums, op=dist.ReduceOp.SUM, async_op=True)
            now = time.perf_counter()
            window = LogWindow(
                now - window_start, window_steps, window_samples * world_size, current_lr(state.optimizer)
            )
            window_start, window_steps, window_samples = now, 0, 0
            pending = PendingLog(work, sums, state.epoch + 1, state.step, batch, window, log_carried)
            log_carried = (0.0, 0.0)
            logged = len(losses)
        if (
            checkpoint
            and config.checkpoint_every
            and state.step % config.checkpoint_every == 0
            and batch < batches
        ):
            if pending is not None:
                pending.report(reporter, config.epochs, batches)
                pending = None
            sums = torch.cat(
                [loss_sums(losses, sizes, device), loss_sums(losses[logged:], sizes[logged:], device)]
            )
            local_sum, local_count = sums[:2].tolist()
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
            epoch_sum, epoch_count, log_sum, log_count = sums.tolist()
            carried = (carried[0] + epoch_sum, carried[1] + epoch_count)
            log_carried = (log_carried[0] + log_sum, log_carried[1] + log_count)
            local_carried = (local_carried[0] + local_sum, local_carried[1] + local_count)
            losses, sizes, logged = [], [], 0
            checkpoint(EpochProgress(batch, *carried, *log_carried))
    if pending is not None:
        pending.report(reporter, config.epochs, batches)
    sums = loss_sums(losses, sizes, device)
    local_sum, local_count = sums.tolist()
    local_sum, local_count = local_carried[0] + local_sum, local_carried[1] + local_count
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    total_sum, total_count = sums.tolist()
    total_sum, total_count = carried[0] + total_sum, carried[1] + total_count
    return EpochResult(
        loss=total_sum / max(total_count, 1.0),
        samples=total_count,
        trained_samples=total_count - start.samples,
        batches=trained,
        local_loss=local_sum / max(local_count, 1.0),
    )


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    """The first parameter group's learning rate (the entrypoint's model has one group)."""
    return float(optimizer.param_groups[0]["lr"])


def loss_sums(losses: list[torch.Tensor], sizes: list[int], device: torch.device) -> torch.Tensor:
    """[sum of loss x batch size, samples] as one float32 tensor on the device, ready to all-reduce.

    float32: HCCL on Atlas training products reduces no float64."""
    if not losses:
        return torch.zeros(2, dtype=torch.float32, device=device)
    weights = torch.tensor(sizes, dtype=torch.float32, device=device)
    return torch.stack([(torch.stack(losses).float() * weights).sum(), weights.sum()])


@torch.no_grad()
def evaluate(
    model: nn.Module, dataset: TensorDataset, env: DistEnv, device: torch.device
) -> tuple[float, float]:
    """(loss, accuracy) on the whole test set: rank r takes samples r, r+W, ..., so none is counted twice."""
    model.eval()
    inputs_all, targets_all = dataset.tensors
    mine = torch.arange(env.rank, len(targets_all), env.world_size)
    loss_sum, correct = 0.0, 0.0
    for chunk in mine.split(EVAL_BATCH_SIZE):  # type: ignore[no-untyped-call]
        inputs, targets = inputs_all[chunk].to(device), targets_all[chunk].to(device)
        logits = model(inputs)
        loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
        correct += float((logits.argmax(dim=1) == targets).sum())
    loss_sum, correct, count = all_reduce_sum([loss_sum, correct, float(len(mine))], device)
    return loss_sum / max(count, 1.0), correct / max(count, 1.0)


def params_digest(model: nn.Module) -> str:
    """SHA-256 of every parameter and buffer, in order: equal digests mean bitwise equal models."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def prepare(
    config: TrainConfig, env: DistEnv, placement: Placement, data: Data, reporter: Reporter
) -> tuple[TrainState, Resumed]:
    """Model and optimizer, from scratch or from the newest checkpoint, then the DDP wrap."""
    seed_everything(config.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    raw_model = build_model(data).to(placement.device)
    optimizer = torch.optim.SGD(raw_model.parameters(), lr=config.lr, momentum=config.momentum)
    resumed = Resumed()
    found = agree_on_start(config, env)
    if found is not None:
        resumed = restore(raw_model, optimizer, *found, config, reporter)
        if resumed.epoch >= config.epochs:
            # Every rank restored the same checkpoint, so every rank stops here together.
            raise CheckpointError(
                f"--epochs {config.epochs} is not above the checkpoint's epoch {resumed.epoch} "
                f"({relative(resumed.path, config.output_dir)}): --epochs is the total to reach, so nothing "
                f"would train; ask for --epochs {resumed.epoch + 1} or more to continue"
            )
        reporter.line(f"resuming from {resumed.path} (epoch {resumed.epoch}, step {resumed.step})")
        if resumed.progress is not None:
            reporter.main_line(
                f"epoch {resumed.epoch + 1} goes on after its first {resumed.progress.batch} batches"
            )
    elif config.resume:
        reporter.main_line(f"--resume: no checkpoint in {config.checkpoint_dir}, starting from scratch")
    model = DDP(raw_model, device_ids=placement.device_ids)
    return TrainState(model, optimizer, resumed.epoch, resumed.step), resumed


def summary_writer() -> WriterFactory | None:
    """The event files' writer: tensorboardX's (the image's), else torch.utils.tensorboard's (it needs the
    ``tensorboard`` package, which a base such as NVIDIA's PyTorch container brings); None: neither."""
    found = tensorboardx_writer()
    if found is not None:
        return found
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch without the tensorboard package
        return None
    # typed here: without torch installed, mypy reads SummaryWriter as Any
    writer: WriterFactory = SummaryWriter
    return writer


def train(config: TrainConfig, env: DistEnv, placement: Placement, data: Data) -> dict[str, Any]:
    """Train to ``config.epochs`` in an initialised process group; returns the summary (rank 0 writes it)."""
    device = placement.device
    reporter = Reporter(
        env.rank,
        env.world_size,
        config.output_dir,
        tensorboard=tensorboard_dir(config.output_dir),
        writer_factory=summary_writer,
    )
    reporter.line(
        f"started by {env.launcher}: local rank {env.local_rank}/{env.local_world_size}, "
        f"node {env.node_rank}, master {env.master_addr}:{env.master_port}, "
        f"device {device}, backend {placement.backend}"
    )
    state, resumed = prepare(config, env, placement, data, reporter)
    loader, batches = make_loader(data.train, env, config, pin=placement.kind == "cuda")
    reporter.open_metrics(keep_until_step=state.step if resumed.path else None)
    reporter.main_line(
        f"training {data.name} ({len(data.train)} samples) epochs {state.epoch + 1}..{config.epochs}, "
        f"global batch {config.batch_size * env.world_size}"
    )
    last_record, checkpoint = resumed.last_epoch_record, resumed.path
    samples_trained, busy_seconds, busy_cpu_seconds, eval_seconds = 0.0, 0.0, 0.0, 0.0

    def save_mid_epoch(progress: EpochProgress) -> None:
        nonlocal checkpoint
        if env.is_main:
            snapshot = _snapshot(state, config, env, last_record) | progress.to_checkpoint()
            checkpoint = ckpt.save_checkpoint(
                config.checkpoint_dir, state.epoch, snapshot, config.checkpoint_keep, step=state.step
            )

    progress, rng = resumed.progress, resumed.rng  # for the first epoch only
    loop_start = time.perf_counter()
    try:
        for epoch in range(state.epoch, config.epochs):
            # a new shuffle each epoch, the same on every rank; an epoch resumed midway skips what it trained
            batches.set_epoch(epoch, progress.batch if progress else 0)
            start, start_cpu = time.perf_counter(), time.process_time()
            result = run_epoch(state, loader, device, config, reporter, progress, rng, save_mid_epoch)
            progress, rng = None, None
            trained, trained_cpu = time.perf_counter(), time.process_time()
            test_loss, accuracy = evaluate(state.model.module, data.test, env, device)
            evaluated, evaluated_cpu = time.perf_counter(), time.process_time()
            state.epoch = epoch + 1
            last_record = {
                "kind": "epoch",
                "epoch": state.epoch,
                "step": state.step,
                "loss": result.loss,
                "test_loss": test_loss,
                "test_accuracy": accuracy,
                "samples": int(result.samples),
                "seconds": trained - start,
                "samples_per_s": result.trained_samples / (trained - start),
            }
            if env.is_main:
                snapshot = _snapshot(state, config, env, last_record)
                checkpoint = ckpt.save_checkpoint(
                    config.checkpoint_dir, state.epoch, snapshot, config.checkpoint_keep
                )
            reporter.record(last_record)
            reporter.main_line(
                f"epoch {state.epoch}/{config.epochs} loss {result.loss:.4f} test_loss {test_loss:.4f} "
                f"test_accuracy {accuracy:.4f} {last_record['samples_per_s']:.0f} samples/s"
            )
            reporter.line(
                f"epoch {state.epoch} done: {result.batches} batches, local loss {result.local_loss:.4f}"
            )
            samples_trained += result.trained_samples
            eval_seconds += evaluated - trained
            # busy: training, checkpoint and logs, not evaluation
            busy_seconds += time.perf_counter() - start - (evaluated - trained)
            busy_cpu_seconds += time.process_time() - start_cpu - (evaluated_cpu - trained_cpu)
        seconds = time.perf_counter() - loop_start
        digest = params_digest(state.model.module)
        reporter.line(f"done: epoch {state.epoch}, step {state.step}, params sha256 {digest}")
        summary = {
            "dataset": config.dataset,
            "epochs": state.epoch,
            "world_size": env.world_size,
            "batch_size": config.batch_size,
            "global_batch_size": config.batch_size * env.world_size,
            "lr": config.lr,
            "steps": state.step,
            "final_loss": last_record.get("loss"),
            "accuracy": last_record.get("test_accuracy"),
            "test_loss": last_record.get("test_loss"),
            "samples": int(samples_trained),
            "samples_per_s": samples_trained / busy_seconds if busy_seconds > 0 else None,
            "seconds": seconds,
            "train_seconds": busy_seconds,
            "train_cpu_seconds": busy_cpu_seconds,  # of this process (rank 0): immune to other load
            "eval_seconds": eval_seconds,
            "device": placement.kind,
            "backend": placement.backend,
            "launcher": env.launcher,
            "checkpoint": relative(checkpoint, config.output_dir),
            "resumed_from": relative(resumed.path, config.output_dir),
            "params_sha256": digest,
        }
        reporter.write_summary(summary)
        return summary
    finally:
        reporter.close()


def _snapshot(state: TrainState, config: TrainConfig, env: DistEnv, record: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint holds at an epoch's end (``batch`` 0); a mid-epoch one adds its EpochProgress."""
    return {
        "model": state.model.module.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "epoch": state.epoch,
        "step": state.step,
        "rng": ckpt.capture_rng_state(),
        "config": config.to_dict(),
        "world_size": env.world_size,
        "metrics": record,  # the last completed epoch's record
        "batch": 0,
    }


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    env: DistEnv | None = None
    try:
        load_secrets()  # the job's secrets (JOB/secrets.json) into the environment, before anything reads it
        env = resolve_dist_env()
        install_stack_dump(env.rank)  # SIGUSR2 dumps the stacks: the progress watchdog's, on a stall
        announce_binding(env)
        placement = select_placement(config.device, config.backend, env)
        data = load_dataset(
            config.dataset, config.data_dir, config.seed, config.synthetic_samples, config.synthetic_features
        )
        with process_group(env, placement, config.dist_timeout):
            train(config, env, placement, data)
    except DdpClusterError as error:
        print(f"ddp_cluster.train: {where(env)}: error: {error}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    exit_process(main())  # no interpreter finalization after the collectives (see ddp_cluster.runtime.finish)
