#!/usr/bin/env python3
"""Throughput of ``python -m ddp_cluster.train`` against a minimal hand-written DDP loop.

Both train the same model (``ddp_cluster.runtime.models.build_model``) on the same seeded synthetic
data with the same per-process batch, optimizer and data pipeline (DistributedSampler, one
tensor index per batch), on gloo/cpu, for 1 and 2 processes started with torchrun's
variables, each run in fresh processes. The runs alternate, and the order of the two flips
every round, so that the drifts of a shared machine fall on both alike. ddp_cluster runs as
a user runs it, and its summary.json's ``samples_per_s`` is the figure; the hand-written loop
times the same phase (training; ddp_cluster reports evaluation apart, as ``eval_seconds``).

The ratio measures what ddp_cluster adds to a bare loop: the loss all-reduced and logged every
``--log-every`` steps, metrics.jsonl, one fsync'd checkpoint per epoch, per-rank lines.

    python bench/bench_train.py                 # 7 rounds, 1 and 2 processes
    python bench/bench_train.py --rounds 3 --nprocs 2 --synthetic-samples 16384

Not a test: it prints figures. One thread per process (OMP_NUM_THREADS=1).
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
IMPLEMENTATIONS = ("hand-written", "ddp_cluster")


def hand_written_worker(args: argparse.Namespace) -> None:
    """The reference: the PyTorch DDP tutorial's loop, and nothing more.

    Rank 0 prints samples per second of wall time and per second of its CPU time."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")  # env://
    data, raw_model = same_data_and_model(args)
    model = DDP(raw_model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler: DistributedSampler[Any] = DistributedSampler(
        data.train,
        num_replicas=world,
        rank=rank,
        shuffle=True,
        seed=args.seed,
    )
    batches = BatchSampler(sampler, args.batch_size, drop_last=False)
    loader = DataLoader(data.train, sampler=batches, batch_size=None)
    start, start_cpu = time.perf_counter(), time.process_time()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(inputs), targets)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - start_cpu
    if rank == 0:
        samples = len(sampler) * world * args.epochs
        figures = {"samples_per_s": samples / seconds, "per_cpu_s": samples / cpu_seconds}
        print(json.dumps(figures), flush=True)
    # Let gloo retire the last gradient all-reduce first: a barrier issued at once can hold it,
    # and destroying the group then may deadlock on the GIL (seen with torch 2.13).
    time.sleep(0.2)
    dist.barrier()
    dist.destroy_process_group()


def same_data_and_model(args: argparse.Namespace) -> tuple[Any, Any]:
    """The data and the initial model that ddp_cluster.runtime.train builds for these flags."""
    from ddp_cluster.runtime.data import load_dataset
    from ddp_cluster.runtime.models import build_model
    from ddp_cluster.runtime.train import seed_everything

    data = load_dataset(
        "synthetic",
        Path("."),
        args.seed,
        args.synthetic_samples,
        args.synthetic_features,
    )
    seed_everything(args.seed)
    return data, build_model(data)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def launch(command: list[str], nproc: int, timeout: float) -> list[str]:
    """Start ``nproc`` ranks of ``command`` with torchrun's variables; their stdout."""
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(nproc),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS=THREADS,
        )
        pipe = subprocess.PIPE
        proc = subprocess.Popen(command, env=env, text=True, stdout=pipe, stderr=pipe)
        procs.append(proc)
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                what = f"{' '.join(command)} failed (rc {proc.returncode})"
                raise RuntimeError(f"{what}:\n{err[-3000:]}")
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return outputs


Figures = tuple[float, float]  # samples per second of wall time, per CPU second (rank 0)


def measure_ddp_cluster(args: argparse.Namespace, nproc: int, scratch: Path) -> Figures:
    out = Path(tempfile.mkdtemp(dir=scratch))
    command = [sys.executable, "-m", "ddp_cluster.train", "--dataset", "synthetic"]
    command += ["--output-dir", str(out), "--log-every", str(args.log_every)]
    launch([*command, *common_flags(args)], nproc, args.timeout)
    summary = json.loads((out / "summary.json").read_text())
    return summary["samples_per_s"], summary["samples"] / summary["train_cpu_seconds"]


def measure_hand_written(args: argparse.Namespace, nproc: int) -> Figures:
    command = [sys.executable, str(Path(__file__).resolve()), "--hand-written-worker"]
    outputs = launch([*command, *common_flags(args)], nproc, args.timeout)
    figures = json.loads(outputs[0].strip().splitlines()[-1])
    return figures["samples_per_s"], figures["per_cpu_s"]


def common_flags(args: argparse.Namespace) -> list[str]:
    return [
        *("--seed", str(args.seed), "--epochs", str(args.epochs)),
        *("--batch-size", str(args.batch_size), "--lr", str(args.lr)),
        *("--synthetic-samples", str(args.synthetic_samples)),
        *("--synthetic-features", str(args.synthetic_features)),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add = parser.add_argument
    add("--rounds", type=int, default=7, help="runs of each (default 7)")
    add("--nprocs", default="1,2", help="comma-separated process counts (default 1,2)")
    add("--synthetic-samples", type=int, default=65536, help="training samples")
    add("--synthetic-features", type=int, default=32, help="input size")
    add("--epochs", type=int, default=2)
    add("--batch-size", type=int, default=64, help="per process")
    add("--lr", type=float, default=0.05)
    add("--seed", type=int, default=0)
    add("--log-every", type=int, default=10, help="ddp_cluster.runtime.train's --log-every")
    add("--timeout", type=float, default=300, help="seconds per run")
    add("--json", type=Path, help="also write the raw figures here")
    add("--hand-written-worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


Results = dict[int, dict[str, list[Figures]]]  # processes -> implementation -> rounds


def print_table(args: argparse.Namespace, results: Results) -> None:
    print(
        f"\nsynthetic {args.synthetic_samples} samples x {args.synthetic_features} "
        f"features, MLP, batch {args.batch_size}/process, {args.epochs} epochs, "
        f"gloo on cpu, {THREADS} thread/process, median of {args.rounds} rounds\n"
    )
    header = ("processes", "hand-written", "ddp_cluster", "ratio", "paired", "cpu ratio")
    print("{:>9}  {:>14}  {:>14}  {:>6}  {:>17}  {:>9}".format(*header))
    table: list[dict[str, Any]] = []
    for nproc, runs in results.items():
        hand_runs, our_runs = runs["hand-written"], runs["ddp_cluster"]
        hand, ours = [w for w, _ in hand_runs], [w for w, _ in our_runs]
        ratio = statistics.median(ours) / statistics.median(hand)
        paired = [o / h for o, h in zip(ours, hand, strict=True)]
        cpu_hand = statistics.median(c for _, c in hand_runs)
        cpu_ratio = statistics.median(c for _, c in our_runs) / cpu_hand
        spread = f"{min(paired):.3f}-{max(paired):.3f}"
        print(
            f"{nproc:>9}  {statistics.median(hand):>10.0f} s/s  "
            f"{statistics.median(ours):>10.0f} s/s  {ratio:>6.3f}  "
            f"{statistics.median(paired):.3f} {spread}  {cpu_ratio:>9.3f}"
        )
        row = {"nproc": nproc, "hand_written": hand_runs, "ddp_cluster": our_runs}
        table.append(row | {"ratio": ratio, "paired": paired, "cpu_ratio": cpu_ratio})
    print(
        "\nratio: median ddp_cluster / median hand-written samples/s (target >= 0.97)"
        "\npaired: median (range) of the ratio within each round (back to back runs)"
        "\ncpu ratio: the same from samples per CPU second of rank 0"
    )
    if args.json:
        raw = {"args": vars(args) | {"json": str(args.json)}, "results": table}
        args.json.write_text(json.dumps(raw, indent=2))


def main() -> int:
    args = parse_args()
    if args.hand_written_worker:
        hand_written_worker(args)
        return 0
    nprocs = [int(n) for n in args.nprocs.split(",")]
    results: Results = {n: {name: [] for name in IMPLEMENTATIONS} for n in nprocs}
    with tempfile.TemporaryDirectory(prefix="bench_train-") as scratch:
        for round_number in range(args.rounds):
            for nproc in nprocs:
                flip = round_number % 2 == 1
                for impl in IMPLEMENTATIONS[::-1] if flip else IMPLEMENTATIONS:
                    if impl == "ddp_cluster":
                        figures = measure_ddp_cluster(args, nproc, Path(scratch))
                    else:
                        figures = measure_hand_written(args, nproc)
                    results[nproc][impl].append(figures)
                    where = f"round {round_number + 1}/{args.rounds} nproc {nproc}"
                    wall, cpu = f"{figures[0]:8.0f}", f"{figures[1]:8.0f}"
                    line = f"{where} {impl:<12} {wall} samples/s, {cpu} per CPU s"
                    print(line, file=sys.stderr, flush=True)
    print_table(args, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
