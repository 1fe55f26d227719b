#!/usr/bin/env python3
"""Throughput of ``python -m ddp_cluster.train`` against a minimal hand-written DDP loop, side by side.

Both train the same model (``ddp_cluster.models.build_model``) on the same seeded synthetic data with the
same per-process batch, optimizer and data pipeline (DistributedSampler, one tensor index per batch), on
gloo/cpu, for 1 and 2 processes started as torchrun would start them. Runs are interleaved (the order of the
two flips every repeat) so that drifts of the machine hit both alike; the table gives the median
samples/s of each and their ratio. The ratio measures what ddp_cluster adds to a bare loop: the loss
all-reduced and logged every ``--log-every`` steps, metrics.jsonl, one checkpoint per epoch (fsync'd),
progress lines. Evaluation is outside both measurements (ddp_cluster times it apart, in ``eval_seconds``).

    python bench/bench_train.py                 # defaults: 5 repeats, 1 and 2 processes
    python bench/bench_train.py --repeats 3 --nprocs 2 --synthetic-samples 16384

Not a test: it prints figures. One thread per process (OMP_NUM_THREADS=1) so that 2 processes fit 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

THREADS = "1"


def hand_written_worker(args: argparse.Namespace) -> None:
    """The reference: what a user writes from the PyTorch DDP tutorial, and nothing more."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

    from ddp_cluster.data import load_dataset
    from ddp_cluster.models import build_model

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")  # env://
    data = load_dataset("synthetic", Path("."), args.seed, args.synthetic_samples, args.synthetic_features)
    torch.manual_seed(args.seed)
    model = DDP(build_model(data))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler = DistributedSampler(data.train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(data.train, sampler=BatchSampler(sampler, args.batch_size, drop_last=False), batch_size=None)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
    seconds = time.perf_counter() - start
    if rank == 0:
        samples = len(sampler) * world * args.epochs
        print(json.dumps({"samples_per_s": samples / seconds, "seconds": seconds}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def launch(command: list[str], nproc: int, timeout: float) -> list[str]:
    """Start ``nproc`` ranks of ``command`` with torchrun's variables; return their stdout."""
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "SLURM_"))}
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(nproc),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS=THREADS,
        )
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed (rc {proc.returncode}):\n{err[-2000:]}")
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return outputs


def common_flags(args: argparse.Namespace) -> list[str]:
    return ["--seed", str(args.seed), "--epochs", str(args.epochs), "--batch-size", str(args.batch_size)] + [
        "--lr", str(args.lr), "--synthetic-samples", str(args.synthetic_samples), "--synthetic-features", str(args.synthetic_features)
    ]  # fmt: skip


def measure_ddp_cluster(args: argparse.Namespace, nproc: int, scratch: Path) -> float:
    out = Path(tempfile.mkdtemp(dir=scratch))
    command = [sys.executable, "-m", "ddp_cluster.train", "--dataset", "synthetic", "--output-dir", str(out)]
    launch([*command, *common_flags(args), "--log-every", str(args.log_every)], nproc, args.timeout)
    summary = json.loads((out / "summary.json").read_text())
    value: float = summary["samples_per_s"]
    return value


def measure_hand_written(args: argparse.Namespace, nproc: int) -> float:
    command = [sys.executable, str(Path(__file__).resolve()), "--hand-written-worker", *common_flags(args)]
    outputs = launch(command, nproc, args.timeout)
    value: float = json.loads(outputs[0].strip().splitlines()[-1])["samples_per_s"]
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nprocs", default="1,2", help="comma-separated process counts (default 1,2)")
    parser.add_argument("--synthetic-samples", type=int, default=65536, help="training samples")
    parser.add_argument("--synthetic-features", type=int, default=32, help="input size")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=10, help="ddp_cluster.train's --log-every")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--hand-written-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hand_written_worker:
        hand_written_worker(args)
        return 0

    nprocs = [int(n) for n in args.nprocs.split(",")]
    results: dict[str, dict[int, list[float]]] = {"hand-written": {}, "ddp_cluster": {}}
    with tempfile.TemporaryDirectory(prefix="bench_train-") as scratch:
        for repeat in range(args.repeats):
            for nproc in nprocs:
                order = ["hand-written", "ddp_cluster"] if repeat % 2 == 0 else ["ddp_cluster", "hand-written"]
                for impl in order:
                    if impl == "ddp_cluster":
                        value = measure_ddp_cluster(args, nproc, Path(scratch))
                    else:
                        value = measure_hand_written(args, nproc)
                    results[impl].setdefault(nproc, []).append(value)
                    print(f"repeat {repeat + 1}/{args.repeats} nproc {nproc} {impl:<12} {value:10.0f} samples/s",
                          file=sys.stderr, flush=True)  # fmt: skip

    print(
        f"\nsynthetic {args.synthetic_samples} samples x {args.synthetic_features} features, MLP, batch {args.batch_size}/process, "
        f"{args.epochs} epochs, gloo on cpu, {THREADS} thread/process, median of {args.repeats} runs\n"
    )
    print(f"{'processes':>9}  {'hand-written':>14}  {'ddp_cluster':>14}  {'ratio':>6}  {'ratio range':>13}")
    table: list[dict[str, Any]] = []
    for nproc in nprocs:
        hand, ours = results["hand-written"][nproc], results["ddp_cluster"][nproc]
        ratio = statistics.median(ours) / statistics.median(hand)
        paired = [o / h for o, h in zip(ours, hand, strict=True)]
        print(
            f"{nproc:>9}  {statistics.median(hand):>10.0f} s/s  {statistics.median(ours):>10.0f} s/s  "
            f"{ratio:>6.3f}  {min(paired):.3f}-{max(paired):.3f}"
        )
        table.append({"nproc": nproc, "hand_written": hand, "ddp_cluster": ours, "ratio_of_medians": ratio})
    print("\nratio = ddp_cluster / hand-written samples/s (target >= 0.97); range: per-repeat pairs")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": table}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
