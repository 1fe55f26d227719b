"""Callback ``ddp_controller_counts``: what a playbook run costs the controller per server, as JSON lines in
the file DDP_CONTROLLER_COUNTS names (bench/bench_controller.py, tests/unit/test_controller_flat.py read
them).

- task slots: host x task pairs Ansible started (``v2_runner_on_start``: skipped ones too, a run_once task
  once, on the play's first host), counted in the main process, one ``{"slots": {host: n}, "plays": [[play,
  {host: n}], ...], ...}`` line at the end with each host's changed and failed counts from the recap;
- hostvars reads: calls of ``HostVars.raw_get`` (``hostvars[h]`` goes through it: an uncached get_vars). Most
  are made in the forked workers, so the method is wrapped here, before they fork, and each worker writes one
  ``{"reads": n, "host": h}`` line when its task's result is ready (before it is sent: the run cannot end
  first); reads in the main process are in the last line, under ``main_reads``.
"""

from __future__ import annotations

import collections
import functools
import json
import os
from typing import Any

from ansible.executor.task_executor import TaskExecutor
from ansible.plugins.callback import CallbackBase
from ansible.vars.hostvars import HostVars

_reads = [0]
_original_raw_get = HostVars.raw_get
_original_run = TaskExecutor.run


def _write(line: dict[str, Any]) -> None:
    path = os.environ.get("DDP_CONTROLLER_COUNTS")
    if not path:
        return
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(
            descriptor, (json.dumps(line) + "\n").encode()
        )  # one write: whole with workers writing at once
    finally:
        os.close(descriptor)


@functools.wraps(_original_raw_get)
def _counted_raw_get(self: HostVars, host_name: str) -> Any:
    _reads[0] += 1
    return _original_raw_get(self, host_name)


@functools.wraps(_original_run)
def _counted_run(self: TaskExecutor) -> Any:
    # In a forked worker: its own copy of the counter, from zero for this task.
    _reads[0] = 0
    try:
        return _original_run(self)
    finally:
        _write({"host": self._host.name, "task": self._task.get_name(), "reads": _reads[0]})


HostVars.raw_get = _counted_raw_get  # type: ignore[method-assign]
TaskExecutor.run = _counted_run  # type: ignore[method-assign]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ddp_controller_counts"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots: collections.Counter[str] = collections.Counter()
        self._plays: dict[str, collections.Counter[str]] = {}
        self._play = ""
        self._main_reads_at_start = _reads[0]

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._play = play.get_name()
        self._plays.setdefault(self._play, collections.Counter())

    def v2_runner_on_start(self, host: Any, task: Any) -> None:
        self._slots[host.get_name()] += 1
        self._plays[self._play][host.get_name()] += 1

    def v2_playbook_on_stats(self, stats: Any) -> None:
        hosts = sorted(stats.processed)
        _write(
            {
                "slots": dict(self._slots),
                "plays": [[play, dict(slots)] for play, slots in self._plays.items()],
                "main_reads": _reads[0] - self._main_reads_at_start,
                "changed": {host: stats.summarize(host)["changed"] for host in hosts},
                "failed": {
                    host: stats.summarize(host)["failures"] + stats.summarize(host)["unreachable"]
                    for host in hosts
                },
            }
        )
