"""Callback ``ddp_job_interrupt``: Ctrl-C while train.yml waits for a job stops the job, not the playbook;
while jobs.yml follows a job's logs (``ddp_jobs_logs``), it stops the following, never the job.

Ansible receives SIGINT in the playbook's own process (its workers run in sessions of their own) and, by
default, kills the workers and leaves: the job would go on with no word. While a ``ddp_job_wait`` task runs,
this callback's handler takes the first SIGINT instead: it leaves the file the wait looks for
(:func:`ddp_cluster.job.control.interrupt_file`), and the wait stops the job on every node, waits for its
supervisor's last word, and the play goes on to collect what there is and report it (train.yml then exits
non-zero). A second SIGINT is Ansible's own: it leaves at once. Enabled in ansible.cfg (callbacks_enabled).
"""

from __future__ import annotations

import os
import signal
import site
from pathlib import Path
from typing import Any

from ansible.plugins.callback import CallbackBase

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job.control import interrupt_file

WAITING_ACTIONS = ("ddp_job_wait", "ddp_jobs_logs")
# What the first Ctrl-C does, said as it is taken: the wait stops the job; a follow of logs stops following.
FIRST_CTRL_C = {
    "ddp_job_wait": (
        "Ctrl-C: stopping the job on every node, then collecting what there is (Ctrl-C again leaves at once;"
        " the job is still stopped)"
    ),
    "ddp_jobs_logs": "Ctrl-C: no more following (the job goes on; Ctrl-C again leaves at once)",
}


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "ddp_job_interrupt"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting = False
        self._action = ""
        self._asked = False
        self._previous: Any = None

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._action = str(task.action).rsplit(".", 1)[-1]
        self._waiting = self._action in WAITING_ACTIONS
        current = signal.getsignal(signal.SIGINT)
        if self._waiting and current != self._on_sigint:
            self._previous = current
            signal.signal(signal.SIGINT, self._on_sigint)
        elif not self._waiting and current == self._on_sigint:
            signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if not self._waiting or self._asked or not callable(self._previous):
            signal.signal(signal.SIGINT, self._previous)
            if callable(self._previous):
                self._previous(signum, frame)
            else:
                raise KeyboardInterrupt
            return
        self._asked = True
        interrupt_file(os.getpid()).touch()
        self._display.display(FIRST_CTRL_C[self._action])

    def v2_playbook_on_stats(self, stats: Any) -> None:
        interrupt_file(os.getpid()).unlink(missing_ok=True)
