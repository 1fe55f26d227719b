"""A rank's process group: joined and left in one place, for the training loop and the health gate."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.runtime.device import Placement
from ddp_cluster.runtime.distenv import DistEnv
from ddp_cluster.runtime.store import hosted_store


@contextmanager
def process_group(env: DistEnv, placement: Placement, timeout_s: float) -> Iterator[None]:
    """Join the job's process group (:func:`joined`). Rank 0 of a job whose group starts its own rendezvous
    (mpirun's) first makes the store's server on MASTER_ADDR:MASTER_PORT only, which the rendezvous then uses
    (torch's own would listen on every address of the node: :mod:`ddp_cluster.runtime.store`); it is dropped
    after the group is destroyed."""
    with hosted_store(env, timeout_s), joined(env, placement, timeout_s):
        yield


@contextmanager
def joined(env: DistEnv, placement: Placement, timeout_s: float) -> Iterator[None]:
    """Join the job's process group; leave it with a barrier then destroy, in ``finally``.

    Measured with torch 2.13 and gloo: destroying the group without the barrier made one rank abort at exit
    in 1 run of 4. The barrier runs when every rank is known to be at the same point: after success, and
    after a DdpClusterError, which inside the group is only raised by all ranks together (rank 0 decides how
    to start and broadcasts it). After any other error a barrier could wait for ranks stuck in another
    collective, so the group is destroyed at once and the launcher stops the others.
    """
    timeout = timedelta(seconds=timeout_s)
    if env.world_size == 1:  # no rendezvous and no port needed
        store = dist.HashStore()  # type: ignore[attr-defined]
        dist.init_process_group(placement.backend, store=store, rank=0, world_size=1, timeout=timeout)
    else:
        init = f"{_init_scheme()}://{_host_for_url(env.master_addr)}:{env.master_port}"
        dist.init_process_group(
            placement.backend, init_method=init, rank=env.rank, world_size=env.world_size, timeout=timeout
        )
    in_step = False
    try:
        yield
        in_step = True
    except DdpClusterError:
        in_step = True
        raise
    finally:
        try:
            if in_step:
                dist.barrier(device_ids=placement.device_ids if placement.kind == "cuda" else None)
        finally:
            dist.destroy_process_group()


def _init_scheme() -> str:
    """``parallel`` under torch_npu_run (its agent's ParallelStore; torch_npu registers the scheme, as the
    vendor documents), else ``tcp``."""
    under_npu_run = os.environ.get("DDP_LAUNCHER") == "torch_npu_run"
    if os.environ.get("TORCH_NPU_ELASTIC_USE_AGENT_STORE") or under_npu_run:
        importlib.import_module("torch_npu")
        return "parallel"
    return "tcp"


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
