"""Accelerator kinds (cpu, gpu, npu): device kind, collective backend, visible-devices variable, topology.

Runs anywhere (controller, node, rank) with no torch: imports only the base modules (errors, files).
"""

# The accelerator kinds an inventory names (cluster_accelerator).
ACCELERATORS = ("cpu", "gpu", "npu")
# The collective backend that goes with a torch device type.
DEVICE_BACKEND = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
