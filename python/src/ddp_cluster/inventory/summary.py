"""The line site.yml ends with when some servers did not converge: which, where and why.

After preflight, site.yml's stages (hosts, image, containers, mesh) go on without a server that fails or
cannot be reached (``max_fail_percentage``): Ansible leaves it out of the rest of the run, prints its failure
once among the others and a recap of counts. :class:`ConvergeSummary` gathers, from the callback
``plugins/callback/ddp_converge_summary.py``, each server's first failure (the stage, the task, the message)
and says at the end, in one line::

    site.yml: 1150 of 1152 servers converged; not: sim-server7 (containers: ...), sim-server9 (unreachable in
    hosts: ...); run site.yml again for them

Nothing on a clean run. Failures Ansible does not count (``ignore_errors``, a block's ``rescue``) are not
counted here either: the recap's own counts decide (:meth:`ConvergeSummary.line`). A run that stopped
(preflight's ``any_errors_fatal``, or more failed servers than ``max_fail_percentage`` allows) converged none.

No Ansible import: the callback passes what it has.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The playbooks that converge servers: site.yml and its stages run alone (playbooks/NAME.yml). Others
# (train.yml, jobs.yml, teardown.yml, ...) end without the line.
SITE = "site.yml"
STAGES_DIR = "playbooks"
STAGES = frozenset({"compile", "preflight", "hosts", "image", "containers", "regroup", "mesh", "record"})
NODES_GROUP = "nodes"
MESSAGE_CHARS = 300
# Past this many servers the line names the first ones and counts the rest: every failure was printed in full
# as it happened; the line is the list to act on, not a second log.
NAMED = 50
# Ansible 2.19 puts this before every task's failure message; the line says where already.
_TASK_FAILED = "Task failed: "
# Messages that say only that the output has the reason: the output's last lines say more.
_GENERIC = ("non-zero return code", "MODULE FAILURE", "One or more items failed")


def converges(playbook: str) -> str:
    """The name the line gives ``playbook`` (its path as ansible-playbook got it): ``site.yml`` or
    ``playbooks/STAGE.yml``; "" for a playbook that converges no server (no line at its end)."""
    path = Path(playbook)
    if path.name == SITE:
        return SITE
    if path.parent.name == STAGES_DIR and path.suffix == ".yml" and path.stem in STAGES:
        return f"{STAGES_DIR}/{path.name}"
    return ""


def stage_of(play_path: str, play_name: str) -> str:
    """The stage a play belongs to: its playbook's name under playbooks/ (``playbooks/containers.yml:2`` ->
    containers), else the play's own name."""
    path = Path(play_path.rpartition(":")[0] if re.search(r":\d+$", play_path) else play_path)
    if path.parent.name == STAGES_DIR and path.stem:
        return path.stem
    return play_name or path.stem or "?"


def one_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` on one line, at most ``limit`` characters (an ellipsis where it was cut)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def message_of(result: Mapping[str, Any]) -> str:
    """What a failed (or unreachable) task's result says, on one line of at most 300 characters: its ``msg``,
    with the last lines of the command's output where ``msg`` only says the command failed; for a loop, the
    first failed item's (named)."""
    items = result.get("results")
    if isinstance(items, list):
        for item in items:
            if isinstance(item, Mapping) and item.get("failed") and not item.get("skipped"):
                label = item.get("_ansible_item_label", item.get("item", ""))
                return one_line(f"item {one_line(str(label), 60)}: {message_of(item)}")
    msg = str(result.get("msg") or "").strip().removeprefix(_TASK_FAILED)
    output = ""
    for key in ("stderr", "module_stderr", "stdout", "module_stdout"):
        text = str(result.get(key) or "").strip()
        if text:
            output = " / ".join(text.splitlines()[-3:])
            break
    if not msg or msg in _GENERIC:
        rc = result.get("rc")
        detail = " ".join(part for part in (f"rc {rc}" if rc not in (None, "") else "", output) if part)
        msg = f"{msg}: {detail}" if msg and detail else msg or detail or "failed (no message)"
    return one_line(msg)


@dataclass(frozen=True)
class Failure:
    """A server's failure in one stage: the first one it had, or the one that stopped it."""

    node: str
    stage: str
    task: str
    message: str
    unreachable: bool = False

    def describe(self) -> str:
        where = f"unreachable in {self.stage}" if self.unreachable else self.stage
        task = f"{self.task}: " if self.task and not self.unreachable else ""
        return f"{self.node} ({where}: {task}{self.message})"


@dataclass
class ConvergeSummary:
    """Each server's failures of one run, in order, and the servers the run was for."""

    playbook: str  # converges(...): the name the line gives the run
    # The playbook's plays, imported ones included (0: not known). A run that started fewer stopped early:
    # Ansible ends the playbook when every server of a play failed (a run_once task's failure fails them all).
    plays: int = 0
    stage: str = ""  # the stage now running
    nodes: list[str] = field(default_factory=list)  # the inventory's nodes in this run (--limit applied)
    failures: dict[str, list[Failure]] = field(default_factory=dict)
    # Set when Ansible said no hosts remain (any_errors_fatal, max_fail_percentage): the stage and why.
    stopped: tuple[str, str] | None = None
    _stop_reason: str = ""
    _batch: list[str] = field(default_factory=list)  # the servers of the play now running
    _started: set[str] = field(default_factory=set)

    def play(
        self,
        stage: str,
        nodes: Iterable[str],
        max_fail_percentage: float | None,
        fatal: bool,
        hosts: Iterable[str] = (),
        key: str = "",
    ) -> None:
        """A play started: its stage, the inventory's nodes the run can reach, what stops every server there,
        the play's own hosts and a key of the play (its id: a play started in batches counts once)."""
        self.stage = stage
        for node in nodes:
            if node not in self.nodes:
                self.nodes.append(node)
        self._batch = list(hosts)
        self._started.add(key or f"{len(self._started)}")
        if fatal:
            self._stop_reason = "one failure there stops every server"
        elif max_fail_percentage is not None:
            self._stop_reason = (
                f"more than {max_fail_percentage:g}% of its servers failed (max_fail_percentage; -e"
                " max_fail_percent=N allows more)"
            )
        else:
            self._stop_reason = ""

    def failed(self, node: str, task: str, result: Mapping[str, Any], unreachable: bool = False) -> None:
        """A task failed on ``node`` (ignored failures are not passed), or ``node`` could not be reached."""
        failure = Failure(node, self.stage, one_line(task, 80), message_of(result), unreachable)
        self.failures.setdefault(node, []).append(failure)

    def no_hosts_remaining(self) -> None:
        """Ansible stopped every server in this stage (any_errors_fatal, max_fail_percentage, or every server
        of the stage failed)."""
        if self.stopped is None:
            self.stopped = (self.stage, self._stop_reason)

    def first_failures(
        self,
        failures: Mapping[str, int],
        unreachable: Mapping[str, int],
        rescued: Mapping[str, int],
    ) -> list[Failure]:
        """Each server's failure that counts, from the recap's counts: a server Ansible counts neither failed
        nor unreachable has none (its failures were all rescued); a rescued failure comes before the one that
        stopped the server (a rescued server goes on), so the first ``rescued`` of its failures are passed
        over."""
        kept: list[Failure] = []
        for node, seen in self.failures.items():
            if not failures.get(node) and not unreachable.get(node):
                continue
            passed_over = int(rescued.get(node) or 0)
            counted: list[Failure] = []
            for failure in seen:
                if not failure.unreachable and passed_over:
                    passed_over -= 1
                    continue
                # An unreachable ignored (ignore_unreachable) or a failure of a server Ansible counts only
                # unreachable is not the one that stopped it.
                if unreachable.get(node) if failure.unreachable else failures.get(node):
                    counted.append(failure)
            kept.append((counted or seen)[0])
        return kept

    def line(
        self,
        failures: Mapping[str, int],
        unreachable: Mapping[str, int],
        rescued: Mapping[str, int] | None = None,
    ) -> str:
        """The run's last line from the recap's counts (node -> count): "" when every server converged."""
        counted = self.first_failures(failures, unreachable, rescued or {})
        stopped = self.stopped
        if stopped is None and self.plays and len(self._started) < self.plays:
            stopped = (self.stage, self._stop_reason)
        if not counted and stopped is None:
            return ""
        # The servers are the inventory's nodes; a failure of another host (a play on localhost) is named but
        # not counted as a server. Without the group, the failed hosts are all there is to count.
        names = {failure.node for failure in counted if failure.node in self.nodes or not self.nodes}
        total = len(self.nodes) or len(names)
        named = ", ".join(failure.describe() for failure in counted[:NAMED])
        if len(counted) > NAMED:
            named += f", and {len(counted) - NAMED} more (their failures are printed above)"
        if stopped is not None:
            # Stopped with them: the servers of the play where the run stopped (every node when not known);
            # the others were not in it (a warm run's servers in sync) and are as the run found them.
            batch = [node for node in self._batch if node in self.nodes] or self.nodes
            others = len([node for node in batch if node not in names])
            stage, why = stopped
            stop = f"the run stopped in {stage}" + (f": {why}" if why else "")
            parts = [f"{self.playbook}: {total - len(names) - others} of {total} servers converged ({stop})"]
            if named:
                parts.append(f"failed: {named}")
            if others > 0:
                parts.append(f"{others} other{'s' if others != 1 else ''} stopped with them")
            parts.append(f"fix the failures and run {self.playbook} again")
            return "; ".join(parts)
        return (
            f"{self.playbook}: {total - len(names)} of {total} servers converged; not: {named}; run"
            f" {self.playbook} again for them"
        )
