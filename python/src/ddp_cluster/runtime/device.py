"""Device and collective backend, chosen in one place: npu -> hccl, cuda -> nccl, cpu -> gloo.

``auto`` picks npu when torch_npu imports and sees devices, else cuda when available, else cpu. ``--device``
and ``--backend`` override; a combination that cannot work (hccl on cpu, npu without torch_npu) is refused
with a plain message before any process group starts.

A job started by ``train.yml`` never relies on ``auto``: it exports the cluster's device as ``DDP_DEVICE``
(cpu, cuda or npu; cpu on an accelerator cluster only when the user asked for it), which is the entrypoint's
default and which :func:`require_device` checks before a user's script runs, so a rank that cannot use the
accelerator fails naming its node, its rank and the reason instead of training on cpu.
"""

from __future__ import annotations

import importlib
import os
import socket
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ddp_cluster import accelerators
from ddp_cluster.accelerators.binding import announce_binding as bind_and_say
from ddp_cluster.errors import DeviceError
from ddp_cluster.runtime.distenv import DistEnv

# The kinds' torch device types and their backends, from the registry (each kind's module declares its own).
DEFAULT_BACKEND = accelerators.DEVICE_BACKEND
DEVICE_CHOICES = ("auto", *DEFAULT_BACKEND)
BACKEND_CHOICES = (
    "auto",
    *dict.fromkeys(
        backend for device in DEFAULT_BACKEND for backend in accelerators.by_device(device).backends
    ),
)
# The job's device, exported by train.yml to every rank (and read by user scripts); DDP_BACKEND likewise.
DEVICE_VARIABLE = "DDP_DEVICE"
BACKEND_VARIABLE = "DDP_BACKEND"
# Which backends can move tensors of which device type.
SUPPORTED_BACKENDS = {device: accelerators.by_device(device).backends for device in DEFAULT_BACKEND}


@dataclass(frozen=True)
class Accelerators:
    """What this process can see: device counts, and why torch_npu is unusable when it is."""

    cuda_count: int
    npu_count: int
    npu_error: str | None  # None when torch_npu imported
    cuda_error: str | None = None  # why CUDA is unusable, as torch warned it (a driver too old, for example)


@dataclass(frozen=True)
class Placement:
    kind: str  # cpu | cuda | npu
    index: int | None  # device index for accelerators, None on cpu
    backend: str

    @property
    def device(self) -> torch.device:
        return torch.device(self.kind if self.index is None else f"{self.kind}:{self.index}")

    @property
    def device_ids(self) -> list[int] | None:
        """What DistributedDataParallel wants as ``device_ids``."""
        return None if self.index is None else [self.index]


def detect_accelerators(probe_npu: bool) -> Accelerators:
    npu_count, npu_error = 0, None
    if probe_npu:
        try:
            importlib.import_module(accelerators.by_device("npu").adapter)  # registers torch.npu
            npu_count = int(torch.npu.device_count())  # type: ignore[attr-defined]
        except Exception as error:  # torch_npu raises more than ImportError when CANN is half installed
            npu_error = f"{type(error).__name__}: {error}"
    else:
        npu_error = "not probed"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cuda_error = "; ".join(str(item.message).strip() for item in caught) or None
    return Accelerators(
        cuda_count=cuda_count, npu_count=npu_count, npu_error=npu_error, cuda_error=cuda_error
    )


def choose_placement(device: str, backend: str, env: DistEnv, found: Accelerators) -> Placement:
    """Pure decision from the request and what was found; raises DeviceError or DistEnvError."""
    if device not in DEVICE_CHOICES:
        raise DeviceError(f"--device {device!r} is not one of {', '.join(DEVICE_CHOICES)}")
    if backend not in BACKEND_CHOICES:
        raise DeviceError(f"--backend {backend!r} is not one of {', '.join(BACKEND_CHOICES)}")
    kind = device
    if device == "auto":
        kind = (
            "npu"
            if found.npu_error is None and found.npu_count > 0
            else "cuda"
            if found.cuda_count
            else "cpu"
        )
    if kind == "npu" and found.npu_error is not None:
        raise DeviceError(
            "device npu needs torch_npu (the Ascend adapter for PyTorch, with CANN), which did not import "
            f"({found.npu_error}): check the CANN base image and the driver mounts (LD_LIBRARY_PATH), "
            "or train "
            "on cpu on purpose (train.yml -e device=cpu, or --device cpu)"
        )
    count = {"cpu": 0, "cuda": found.cuda_count, "npu": found.npu_count}[kind]
    if kind != "cpu" and count == 0:
        reason = f" ({found.cuda_error})" if kind == "cuda" and found.cuda_error else ""
        raise DeviceError(
            f"device {kind} was asked for but no {kind} device is visible to this process{reason}: check the "
            "driver, the container's devices and CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES, "
            "or train on "
            "cpu on purpose (train.yml -e device=cpu, or --device cpu)"
        )
    chosen = DEFAULT_BACKEND[kind] if backend == "auto" else backend
    if chosen not in SUPPORTED_BACKENDS[kind]:
        raise DeviceError(
            f"--backend {chosen} cannot run on {kind} tensors; use {' or '.join(SUPPORTED_BACKENDS[kind])} "
            f"with --device {kind}, or --backend auto"
        )
    if kind == "cpu":
        return Placement("cpu", None, chosen)
    env.check_local_device(count, kind)
    return Placement(kind, env.local_rank, chosen)


def select_placement(device: str, backend: str, env: DistEnv) -> Placement:
    """Choose the placement for this process and make its device the current one."""
    found = detect_accelerators(probe_npu=device in ("auto", "npu"))
    placement = choose_placement(device, backend, env, found)
    if placement.index is None:
        _share_cpu_cores(env)
    else:
        # The kind's own settings (HCCL's trust list off on npu), where the site chose none.
        for name, value in accelerators.by_device(placement.kind).rank_environment.items():
            os.environ.setdefault(name, value)
        getattr(torch, placement.kind).set_device(placement.device)
    return placement


def requested_device(environ: Mapping[str, str] | None = None) -> str:
    """The job's device from DDP_DEVICE (train.yml exports it), else ``auto``; DeviceError for a bad value."""
    value = (os.environ if environ is None else environ).get(DEVICE_VARIABLE, "").strip()
    if not value:
        return "auto"
    if value not in DEVICE_CHOICES:
        raise DeviceError(f"{DEVICE_VARIABLE}={value!r} is not one of {', '.join(DEVICE_CHOICES)}")
    return value


def where(env: DistEnv | None, environ: Mapping[str, str] | None = None) -> str:
    """``node NAME rank R/W`` for messages: the node from DDP_NODE_NAME (node environment), else the host."""
    variables = os.environ if environ is None else environ
    node = variables.get("DDP_NODE_NAME") or socket.gethostname()
    return f"node {node} rank {env.rank}/{env.world_size}" if env is not None else f"node {node}"


def require_device(device: str, env: DistEnv) -> Placement:
    """Check that this process can use ``device`` (the job's accelerator) before a script runs; DeviceError
    with the reason when it cannot. Nothing is initialised: the script picks its device itself."""
    found = detect_accelerators(probe_npu=device in ("auto", "npu"))
    return choose_placement(device, "auto", env, found)


def _share_cpu_cores(env: DistEnv) -> None:
    """Split the node's cores between its processes (as torchrun does) unless OMP_NUM_THREADS is set."""
    if env.local_world_size > 1 and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // env.local_world_size))


def announce_binding(env: DistEnv) -> None:
    """Bind this rank to its device's CPUs where the node asks for it
    (:func:`ddp_cluster.accelerators.binding.bind_rank`), and say so in its log."""
    bind_and_say(env.local_rank, where(env))
