"""A user's own torchrun-style DDP script, unmodified: it reads only the torchrun variables.

Trains a tiny linear model on random data with gloo and prints one line per rank. With FAIL_RANK=N in the
environment (or --fail-rank N), rank N exits with status 3 after the first step, to test failure handling.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--fail-rank", type=int, default=-1)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        if step == 0 and rank == args.fail_rank:
            print(f"user-script rank {rank}: failing on purpose", flush=True)
            sys.exit(3)
    weights = model.module.weight.detach().clone()
    dist.all_reduce(weights)
    same = torch.allclose(weights / world, model.module.weight.detach())
    print(f"user-script rank {rank}/{world} local {local_rank} on {os.uname().nodename}: identical={same}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
