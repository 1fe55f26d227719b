"""Action ``ddp_extra_vars``: refuse the command line's extra vars that are typos of a setting the playbook
knows (``-e stpo=ID`` for ``stop``), naming the one meant, before anything runs: Ansible would take them
without a word (:func:`ddp_cluster.job.request.misspelled`). Every role's settings are known too (the
inventory's, which any playbook may be given). Changes nothing.

    - ddp_extra_vars:
        playbook: jobs.yml
        known: [stop, logs, ...]
"""

from __future__ import annotations

import site
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.vars import load_extra_vars

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.job.request import USER_NAMES, misspelled, role_settings


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("playbook", "known"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        roles = Path(__file__).resolve().parents[2] / "roles"
        # the playbook's own, every role's, and train.yml's (given to jobs.yml out of habit: no typo)
        given = {str(name) for name in self._task.args.get("known") or []}
        known = given | role_settings(roles) | set(USER_NAMES.values())
        playbook = str(self._task.args.get("playbook") or "the playbook")
        if typos := misspelled(load_extra_vars(self._loader), known, playbook):
            return {**result, "failed": True, "msg": "; ".join(typos) + "; nothing was done"}
        return {**result, "changed": False}
