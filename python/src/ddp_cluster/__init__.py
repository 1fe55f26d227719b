"""ddp_cluster: multi-node PyTorch DDP on Ascend NPU, NVIDIA GPU and CPU clusters.

Importing the package needs no torch: only ``ddp_cluster.train`` (and what it imports) does.
"""

__version__ = "0.1.0"
