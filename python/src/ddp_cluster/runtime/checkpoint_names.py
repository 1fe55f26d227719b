"""The checkpoints' file names, without torch: what the ranks write, the supervisor resumes from and the
controller's planner finds.

``epoch-NNNNN.ckpt`` at the end of an epoch, N the epochs completed, and ``epoch-NNNNN.step-SSSSSSSSS.ckpt``
in the middle of one (``--checkpoint-every``), after N completed epochs and S optimizer steps in all. Both are
zero-padded, so sorting the names as plain strings (as :mod:`ddp_cluster.server.pack` does, which ships
alone to the servers and spells the pattern as the glob ``epoch-*.ckpt``) and sorting by (epoch, step) give
the same order, the order of training: ``epoch-00003.ckpt`` < ``epoch-00003.step-000000150.ckpt`` <
``epoch-00004.ckpt``.
A temporary file (a hidden name, a suffix after ``.ckpt``) is never a checkpoint.

Standard library only: the supervisor and the controller read these names and import no torch.
"""

from __future__ import annotations

import re

# epoch-NNNNN.ckpt (group 1: epochs completed) or epoch-NNNNN.step-SSSSSSSSS.ckpt (group 2: global step)
NAME = re.compile(r"^epoch-(\d+)(?:\.step-(\d+))?\.ckpt$")
# The folder under a job's output directory that holds them.
FOLDER = "checkpoints"


def checkpoint_name(epoch: int, step: int | None = None) -> str:
    """``epoch-NNNNN.ckpt`` after ``epoch`` completed epochs; with ``step``, the mid-epoch checkpoint taken
    at that global step, ``epoch-NNNNN.step-SSSSSSSSS.ckpt``."""
    if step is None:
        return f"epoch-{epoch:05d}.ckpt"
    return f"epoch-{epoch:05d}.step-{step:09d}.ckpt"


def checkpoint_order(name: str) -> tuple[int, int] | None:
    """(epoch, step) of a checkpoint's file name, step 0 for an epoch-end one; None for any other name."""
    match = NAME.match(name)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else None


def is_checkpoint(name: str) -> bool:
    return NAME.match(name) is not None
