"""Device and collective backend, chosen in one place from each kind's facts
(:mod:`ddp_cluster.accelerators`): npu -> hccl, cuda -> nccl, cpu -> gloo.

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
from dataclasses import dataclass, field

import torch

from ddp_cluster import accelerators
from ddp_cluster.accelerators.binding import announce_binding as bind_and_say
from ddp_cluster.errors import DeviceError
from ddp_cluster.runtime.config import BACKEND_CHOICES, DEFAULT_BACKEND, DEVICE_CHOICES
from ddp_cluster.runtime.distenv import DistEnv

# Which backends can move tensors of which device type.
SUPPORTED_BACKENDS = {device: accelerators.by_device(device).backends for device in DEFAULT_BACKEND}


@dataclass(frozen=True)
class Accelerators:
    """What this process can see, by torch device type: how many devices, and why a kind is unusable (its
    adapter did not import, or was not probed; or what torch warned, a driver too old for example)."""

    counts: Mapping[str, int] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)


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


# --device auto takes the first of these that sees a device (the registry's order), else cpu.
AUTO_ORDER = tuple(kind.device for kind in accelerators.REGISTRY.values() if kind.device != "cpu")
# Where a rank's devices are listed, for messages: every kind's variable.
VISIBLE_VARIABLES = " / ".join(
    accelerators.by_device(device).visible_variable
    for device in DEFAULT_BACKEND
    if accelerators.by_device(device).visible_variable
)
ON_PURPOSE = "or train on cpu on purpose (train.yml -e device=cpu, or --device cpu)"


def detect_accelerators(device: str) -> Accelerators:
    """What this process sees for ``device`` (auto: every kind). A kind whose adapter must be imported first
    (torch_npu) is probed only when asked for or for auto; the others always (torch knows them)."""
    counts: dict[str, int] = {}
    errors: dict[str, str] = {}
    for kind in accelerators.REGISTRY.values():
        if kind.device == "cpu":
            continue
        if kind.adapter:
            if device not in ("auto", kind.device):
                errors[kind.device] = "not probed"
                continue
            try:
                importlib.import_module(kind.adapter)  # registers torch.<device>
                counts[kind.device] = int(getattr(torch, kind.device).device_count())
            except Exception as error:  # an adapter raises more than ImportError when half installed
                errors[kind.device] = f"{type(error).__name__}: {error}"
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = getattr(torch, kind.device)
            counts[kind.device] = int(module.device_count()) if module.is_available() else 0
        warned = "; ".join(str(item.message).strip() for item in caught)
        if warned:
            errors[kind.device] = warned
    return Accelerators(counts=counts, errors=errors)


def choose_placement(device: str, backend: str, env: DistEnv, found: Accelerators) -> Placement:
    """Pure decision from the request and what was found; raises DeviceError or DistEnvError."""
    if device not in DEVICE_CHOICES:
        raise DeviceError(f"--device {device!r} is not one of {', '.join(DEVICE_CHOICES)}")
    if backend not in BACKEND_CHOICES:
        raise DeviceError(f"--backend {backend!r} is not one of {', '.join(BACKEND_CHOICES)}")
    kind = device
    if device == "auto":
        kind = next((auto for auto in AUTO_ORDER if found.counts.get(auto, 0) > 0), "cpu")
    accelerator = accelerators.by_device(kind)
    error = found.errors.get(kind)
    if accelerator.adapter and error is not None:
        raise DeviceError(
            f"device {kind} needs {accelerator.adapter} ({accelerator.adapter_about}), which did not import "
            f"({error}): {accelerator.adapter_fix}, {ON_PURPOSE}"
        )
    count = found.counts.get(kind, 0)
    if kind != "cpu" and count == 0:
        reason = f" ({error})" if error else ""
        raise DeviceError(
            f"device {kind} was asked for but no {kind} device is visible to this process{reason}: check the "
            f"driver, the container's devices and {VISIBLE_VARIABLES}, {ON_PURPOSE}"
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
    found = detect_accelerators(device)
    placement = choose_placement(device, backend, env, found)
    if placement.index is None:
        _share_cpu_cores(env)
    else:
        # The kind's own settings (HCCL's trust list off on npu), where the site chose none.
        for name, value in accelerators.by_device(placement.kind).rank_environment.items():
            os.environ.setdefault(name, value)
        getattr(torch, placement.kind).set_device(placement.device)
    return placement


def where(env: DistEnv | None, environ: Mapping[str, str] | None = None) -> str:
    """``node NAME rank R/W`` for messages: the node from DDP_NODE_NAME (node environment), else the host."""
    variables = os.environ if environ is None else environ
    node = variables.get("DDP_NODE_NAME") or socket.gethostname()
    return f"node {node} rank {env.rank}/{env.world_size}" if env is not None else f"node {node}"


def require_device(device: str, env: DistEnv) -> Placement:
    """Check that this process can use ``device`` (the job's accelerator) before a script runs; DeviceError
    with the reason when it cannot. Nothing is initialised: the script picks its device itself."""
    found = detect_accelerators(device)
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
