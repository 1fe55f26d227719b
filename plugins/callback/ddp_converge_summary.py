"""Callback ``ddp_converge_summary``: site.yml's last line names the servers that did not converge.

After preflight a server that fails or cannot be reached is left out and the others go on
(``max_fail_percentage``); at the end of site.yml, or of a stage run alone (``playbooks/STAGE.yml``), one
line after the recap says which servers did not converge, in which stage and why, e.g. ``site.yml: 1 of 2
servers converged; not: sim-server1 (unreachable in containers: ...); run site.yml again for them``.
Nothing on a clean run, nor after other playbooks. The logic is :mod:`ddp_cluster.inventory.summary`; this
shim hands it Ansible's events. Enabled in ansible.cfg (callbacks_enabled).
"""

from __future__ import annotations

import site
from pathlib import Path
from typing import Any

from ansible import constants as C
from ansible.plugins.callback import CallbackBase

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.inventory import summary


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ddp_converge_summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._summary: summary.ConvergeSummary | None = None

    def v2_playbook_on_start(self, playbook: Any) -> None:
        name = summary.converges(str(getattr(playbook, "_file_name", "") or ""))
        self._summary = None
        if name:
            # Imported playbooks' plays included: fewer started than these means the run stopped early.
            plays = {str(play._uuid) for play in playbook.get_plays()}
            self._summary = summary.ConvergeSummary(name, plays=len(plays))

    def v2_playbook_on_play_start(self, play: Any) -> None:
        if self._summary is None:
            return
        nodes: list[str] = []
        hosts: list[str] = []
        try:
            # The inventory's nodes this run can reach (--limit applied), whatever the play's own hosts: a
            # warm run's stages see only the servers that drifted, the line counts the cluster. The play's
            # own hosts: the inventory is restricted to them while it runs.
            inventory = play.get_variable_manager()._inventory
            nodes = [host.name for host in inventory.get_hosts(summary.NODES_GROUP, ignore_restrictions=True)]
            hosts = [host.name for host in inventory.get_hosts(play.hosts)]
        except Exception:
            # An inventory Ansible cannot match the group in: the line counts the failed servers.
            nodes = []
        percentage = play.max_fail_percentage
        self._summary.play(
            summary.stage_of(str(play.get_path() or ""), str(play.get_name() or "")),
            nodes,
            None if percentage is None else float(percentage),
            bool(play.any_errors_fatal),
            hosts,
            str(play._uuid),
        )

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        if self._summary is None or ignore_errors:
            return
        self._summary.failed(result._host.get_name(), result._task.get_name(), result._result)

    def v2_runner_on_unreachable(self, result: Any) -> None:
        if self._summary is None:
            return
        host, task = result._host.get_name(), result._task.get_name()
        self._summary.failed(host, task, result._result, unreachable=True)

    def v2_playbook_on_no_hosts_remaining(self) -> None:
        if self._summary is not None:
            self._summary.no_hosts_remaining()

    def v2_playbook_on_stats(self, stats: Any) -> None:
        if self._summary is None:
            return
        line = self._summary.line(stats.failures, stats.dark, stats.rescued)
        if line:
            self._display.display(line, color=C.config.get_config_value("COLOR_ERROR"), stderr=False)
