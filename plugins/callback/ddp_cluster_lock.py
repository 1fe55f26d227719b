"""Callback ``ddp_cluster_lock``: one site.yml at a time per cluster.

site.yml, and its stages run alone (``playbooks/*.yml``), take the cluster's lock on the controller
(:mod:`ddp_cluster.inventory.lock`: an exclusive flock on ``~/.ddp-cluster/locks/<inventory's hash>.lock``)
before their first play's first task and hold it until the process exits (the kernel releases it then, even
after a crash). A second run fails there, naming the run that holds it, before anything changes. train.yml,
jobs.yml and check.yml take none. Enabled in ansible.cfg (callbacks_enabled).

The lock is taken in ``set_play_context``: Ansible calls it for every callback before a play's first task
outside its callback error handler, so an AnsibleError raised there ends the run as Ansible's own errors do
(``ERROR!``, exit status 1); one raised in a ``v2_*`` method would only be printed as a warning, and the
playbook would go on.
"""

from __future__ import annotations

import shlex
import site
import sys
from pathlib import Path
from typing import Any

from ansible import context
from ansible.errors import AnsibleError
from ansible.plugins.callback import CallbackBase

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.inventory import lock


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "ddp_cluster_lock"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._playbook = ""

    def v2_playbook_on_start(self, playbook: Any) -> None:
        self._playbook = str(getattr(playbook, "_file_name", "") or "")

    def set_play_context(self, play_context: Any) -> None:
        if not self._playbook or not lock.takes_lock(self._playbook):
            return
        sources = [str(source) for source in context.CLIARGS.get("inventory") or ()]
        try:
            lock.acquire(sources, self._playbook, shlex.join(sys.argv))
        except lock.ClusterLocked as error:
            raise AnsibleError(str(error)) from None
