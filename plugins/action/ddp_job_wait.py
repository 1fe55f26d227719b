"""Action ``ddp_job_wait``: wait for a supervised job, printing its progress as it goes, within a bound.

Reads the supervisor's status.json on the host (the node's workspace directory is a host directory) every
``poll`` seconds through the host's own connection, prints a line whenever the progress changes, and returns
the final status. Fails only when the bound passes with the job still running (the caller stops it then).
"""

from __future__ import annotations

import contextlib
import json
import shlex
import time
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


def describe(progress: Any) -> str:
    if isinstance(progress, dict):
        keys = ("epoch", "step", "loss", "test_accuracy", "samples_per_s")
        parts = [
            f"{key} {progress[key]:.4g}" if isinstance(progress[key], float) else f"{key} {progress[key]}"
            for key in keys
            if progress.get(key) is not None
        ]
        return ", ".join(parts) or json.dumps(progress)[:200]
    return str(progress)[:200] if progress else "starting"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("status_file", "timeout", "poll", "label"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = self._task.args
        status_file = args["status_file"]
        timeout = float(args.get("timeout", 1800))
        poll = float(args.get("poll", 5))
        label = args.get("label", "job")
        deadline = time.monotonic() + timeout
        shown = None
        status: dict[str, Any] = {}
        while True:
            done = self._low_level_execute_command(f"cat {shlex.quote(status_file)}")
            if done["rc"] == 0:
                with contextlib.suppress(ValueError):  # a partial read: the next poll sees the whole file
                    status = json.loads(done["stdout"])
            state = status.get("state", "starting")
            line = f"{label}: {state} after {status.get('elapsed', 0):.0f} s: {describe(status.get('progress'))}"
            if state != "running" and state != "starting":
                display.display(line)
                result.update(changed=True, status=status, state=state)
                return result
            if line.split(": ", 2)[2] != shown:
                display.display(line)
                shown = line.split(": ", 2)[2]
            if time.monotonic() >= deadline:
                result.update(
                    failed=True,
                    status=status,
                    state="timeout",
                    msg=f"{label} still {state} after the {timeout:g} s bound: stopping it",
                )
                return result
            time.sleep(poll)
