#!/usr/bin/env python3
"""Throughput of ``ddp_cluster.train`` against a minimal hand-written DDP loop.

Both train the same model (``ddp_cluster.models.build_model``) on the same seeded synthetic
data with the same per-process batch, optimizer and data pipeline (DistributedSampler, one
tensor index per batch), on gloo/cpu, for 1 and 2 processes started with torchrun's
variables. Inside the same worker processes the two alternate, run after run (the order
flips every round; a first round warms both up and is not counted), so that the noise of a
shared machine falls on both alike. ddp_cluster runs as a whole: ``ddp_cluster.train.main``
with its command line, process group, checkpoints, metrics.jsonl and summary.json, whose
``samples_per_s`` is the figure; the hand-written loop times the same phase (training, not
evaluation, which ddp_cluster reports apart as ``eval_seconds``).

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
RESULT = "BENCH_RESULT "  # prefix of the lines a worker reports on


def hand_written_loop(args: argparse.Namespace) -> tuple[float, float]:
    """The reference: the PyTorch DDP tutorial's loop, and nothing more.

    Returns (samples per second of wall time, per second of this process's CPU time)."""
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
    dist.barrier()
    dist.destroy_process_group()
    samples = len(sampler) * world * args.epochs
    return samples / seconds, samples / cpu_seconds


def same_data_and_model(args: argparse.Namespace) -> tuple[Any, Any]:
    """The data and the initial model that ddp_cluster.train builds for these flags."""
    from ddp_cluster.data import load_dataset
    from ddp_cluster.models import build_model
    from ddp_cluster.train import seed_everything

    data = load_dataset(
        "synthetic",
        Path("."),
        args.seed,
        args.synthetic_samples,
        args.synthetic_features,
    )
    seed_everything(args.seed)
    return data, build_model(data)


def ddp_cluster_run(args: argparse.Namespace, out: Path) -> tuple[float, float] | None:
    """One whole ``python -m ddp_cluster.train`` run, in this process; rank 0's figures."""
    from ddp_cluster.train import main as train_main

    flags = ["--dataset", "synthetic", "--output-dir", str(out)]
    flags += ["--log-every", str(args.log_every), *common_flags(args)]
    if train_main(flags) != 0:
        raise RuntimeError(f"ddp_cluster.train {' '.join(flags)} failed")
    if os.environ["RANK"] != "0":
        return None
    summary = json.loads((out / "summary.json").read_text())
    return summary["samples_per_s"], summary["samples"] / summary["train_cpu_seconds"]


def worker(args: argparse.Namespace) -> None:
    """One rank: alternate the two implementations for ``rounds + 1`` rounds."""
    base_port = int(os.environ["MASTER_PORT"])
    for round_number in range(args.rounds + 1):
        order = IMPLEMENTATIONS if round_number % 2 == 0 else IMPLEMENTATIONS[::-1]
        for impl in order:
            # a fresh rendezvous port per run: the last run's may linger in TIME_WAIT
            offset = 2 * round_number + IMPLEMENTATIONS.index(impl)
            os.environ["MASTER_PORT"] = str(base_port + offset)
            if impl == "ddp_cluster":
                world = os.environ["WORLD_SIZE"]
                out = Path(args.scratch) / f"world{world}-round{round_number}"
                figures = ddp_cluster_run(args, out)
            else:
                figures = hand_written_loop(args)
            if os.environ["RANK"] == "0" and round_number > 0:
                report = {"impl": impl, "round": round_number, "figures": figures}
                print(RESULT + json.dumps(report), flush=True)


def free_port_block(size: int) -> int:
    """A first port such that ``size`` consecutive ports are free now."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base: int = sock.getsockname()[1]
        if base + size < 65536 and all(_bindable(base + i) for i in range(size)):
            return base
    raise RuntimeError(f"no block of {size} free ports found")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def launch_workers(args: argparse.Namespace, nproc: int, scratch: str) -> list[str]:
    """Start ``nproc`` ranks of this script's worker with torchrun's variables."""
    port = free_port_block(2 * args.rounds + 2)
    command = [sys.executable, str(Path(__file__).resolve()), "--worker"]
    command += ["--scratch", scratch, "--rounds", str(args.rounds), "--log-every"]
    command += [str(args.log_every), *common_flags(args)]
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
            out, err = proc.communicate(timeout=args.timeout)
            if proc.returncode != 0:
                what = f"{' '.join(command)} failed (rc {proc.returncode})"
                raise RuntimeError(f"{what}:\n{err[-3000:]}")
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return outputs


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
    add("--rounds", type=int, default=7, help="counted runs of each (default 7)")
    add("--nprocs", default="1,2", help="comma-separated process counts (default 1,2)")
    add("--synthetic-samples", type=int, default=65536, help="training samples")
    add("--synthetic-features", type=int, default=32, help="input size")
    add("--epochs", type=int, default=2)
    add("--batch-size", type=int, default=64, help="per process")
    add("--lr", type=float, default=0.05)
    add("--seed", type=int, default=0)
    add("--log-every", type=int, default=10, help="ddp_cluster.train's --log-every")
    add("--timeout", type=float, default=1800, help="seconds for all rounds")
    add("--json", type=Path, help="also write the raw figures here")
    add("--worker", action="store_true", help=argparse.SUPPRESS)
    add("--scratch", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


Figures = tuple[float, float]  # samples per second of wall time, per CPU second
Results = dict[int, dict[str, list[Figures]]]  # processes -> implementation -> rounds


def collect(outputs: list[str]) -> dict[str, list[Figures]]:
    runs: dict[str, list[Figures]] = {name: [] for name in IMPLEMENTATIONS}
    for line in outputs[0].splitlines():
        if line.startswith(RESULT):
            report = json.loads(line[len(RESULT) :])
            wall, cpu = report["figures"]
            runs[report["impl"]].append((wall, cpu))
    return runs


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
    if args.worker:
        worker(args)
        return 0
    results: Results = {}
    with tempfile.TemporaryDirectory(prefix="bench_train-") as scratch:
        for nproc in [int(n) for n in args.nprocs.split(",")]:
            started = time.perf_counter()
            results[nproc] = collect(launch_workers(args, nproc, scratch))
            took = time.perf_counter() - started
            print(f"{nproc} process(es): {took:.0f} s", file=sys.stderr, flush=True)
    print_table(args, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
