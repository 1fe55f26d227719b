"""Stand-in of torch_npu_run (``python -m torch_npu.distributed.run``): torchrun's arguments and agent.

The real module parses torchrun's arguments, sets ``rdzv_backend = "parallel"`` (its ParallelStore, faster
link set-up on large clusters) and runs torchrun's ``run``. The stand-in has no ParallelStore: it uses
torchrun's static rendezvous on the same master address and port, and exports what the real agent exports to
its workers (TORCH_NPU_ELASTIC_USE_AGENT_STORE), so scripts take the same path
(``init_method="parallel://..."``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from torch.distributed import run as torch_run
from torch.distributed.elastic.multiprocessing.errors import record

import torch_npu  # noqa: F401  (as the real launcher: fails without the driver libraries)


@record
def _main(args: Sequence[str] | None = None) -> None:
    parsed = torch_run.parse_args(args)
    parsed.rdzv_backend = "static"  # the real one: "parallel"
    os.environ.setdefault("TORCH_NPU_ELASTIC_USE_AGENT_STORE", "True")
    torch_run.run(parsed)


if __name__ == "__main__":
    _main()
