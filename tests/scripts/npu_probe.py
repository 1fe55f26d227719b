"""A user's script for the simulated Ascend servers: every rank imports torch_npu and reports what it sees.

Prints one line per rank, `npu-probe {json}`, with the node, the rank, whether torch_npu imported (and why
not), the NPU count it reports, and the variables a CANN image sets in its ENV; then an all-reduce over gloo
proves the ranks form one job. There are no chips on the sim: the collective runs on cpu.
"""

import json
import os
import socket

import torch
import torch.distributed as dist

WATCHED = ("LD_LIBRARY_PATH", "PATH", "RANK_TABLE_FILE", "DDP_DEVICE", "DDP_BACKEND", "DDP_LAUNCHER")


def probe() -> dict[str, object]:
    report: dict[str, object] = {"node": socket.gethostname(), "rank": int(os.environ["RANK"])}
    try:
        import torch_npu  # registers torch.npu

        report["torch_npu"] = torch_npu.__version__
        report["npu_count"] = torch.npu.device_count()  # type: ignore[attr-defined]
    except ImportError as error:
        report["torch_npu"] = None
        report["error"] = str(error)
    report["env"] = {name: os.environ.get(name) for name in WATCHED}
    report["env"] |= {name: value for name, value in sorted(os.environ.items()) if name.startswith("ASCEND_")}
    return report


def main() -> int:
    report = probe()
    dist.init_process_group("gloo")
    total = torch.tensor([1.0 if report["torch_npu"] else 0.0])
    dist.all_reduce(total)
    report["ranks_with_torch_npu"] = int(total.item())
    report["world_size"] = dist.get_world_size()
    print("npu-probe " + json.dumps(report, sort_keys=True), flush=True)
    # A barrier before the destroy: without it gloo in torch 2.13 aborts one rank at exit now and then.
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
