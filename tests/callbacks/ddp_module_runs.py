"""Test callback ``ddp_module_runs``: one JSON line per module run (host, task, role, module) to the file
named by DDP_MODULE_RUNS, for the tests that count what a stage costs per node.

A module run is a call of ``ActionBase._execute_module``: an action that runs two modules (template: stat,
then copy) counts two, a controller-only action (assert, set_fact, include_tasks) none. Ansible's workers
are forked from the process that loads this callback, so wrapping the method here reaches every worker; each
line is one ``write`` to a file opened for appending, whole even with workers writing at once.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.plugins.callback import CallbackBase

_original = ActionBase._execute_module


@functools.wraps(_original)
def _counted(self: ActionBase, module_name: str | None = None, *args: Any, **kwargs: Any) -> Any:
    path = os.environ.get("DDP_MODULE_RUNS")
    if path:
        task_vars = kwargs.get("task_vars") or (args[2] if len(args) > 2 else None) or {}
        role = self._task._role.get_name() if self._task._role else ""
        line = json.dumps(
            {
                "host": task_vars.get("inventory_hostname", ""),
                "task": self._task.get_name(),
                "role": role,
                "module": module_name or self._task.action,
            }
        )
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, (line + "\n").encode())
        finally:
            os.close(descriptor)
    return _original(self, module_name, *args, **kwargs)


ActionBase._execute_module = _counted  # type: ignore[method-assign]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ddp_module_runs"
    CALLBACK_NEEDS_ENABLED = True
