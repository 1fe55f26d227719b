"""A small user project run unmodified by train.yml -e workdir=... -e script=train.py: a package of its own, a
config file and a data file read relative to the working directory, --key=value arguments, results written
into the working directory."""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from tinyproj.data import load_points
from tinyproj.model import build
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--label", default="none")
    args = parser.parse_args()
    config = json.loads(Path("conf/config.json").read_text())
    features, targets = load_points("data/points.csv")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(config["seed"])
    model = DistributedDataParallel(build(features.shape[1]))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = (model(features).squeeze(1) - targets).pow(2).mean()
        loss.backward()
        optimizer.step()
    print(f"project rank {rank}/{world} cwd={os.getcwd()} rows={len(targets)} label={args.label}", flush=True)
    if rank == 0:
        Path("results").mkdir(exist_ok=True)
        result = {
            "label": args.label,
            "rows": len(targets),
            "lr": config["lr"],
            "loss": float(loss),
            "world": world,
        }
        Path("results/result.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
