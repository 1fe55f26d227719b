"""CPU nodes: torch's cpu device and gloo; no device to list, no topology tool, no host role (the local
inventory and the sim run on it)."""

from __future__ import annotations

from ddp_cluster.accelerators.base import Accelerator

CPU = Accelerator(name="cpu", device="cpu", backends=("gloo",))
