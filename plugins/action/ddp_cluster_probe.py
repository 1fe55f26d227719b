"""Action ``ddp_cluster_probe``: site.yml's warm path, run_once on the controller after ddp_cluster_compile.

``mode: probe`` asks every server of ``nodes`` at once for its actual state (one ssh command each, in threads,
no module upload: :mod:`ddp_cluster.server.state`, :mod:`ddp_cluster.inventory.fanout`), compares it and the
wanted digests with each node's state file (:mod:`ddp_cluster.inventory.drift`) and returns ``converge`` (the
nodes that go through the roles) and ``lines`` (why, one per node; printed in check mode, and the digests as a
diff), and the fact ``ddp_cluster_probed`` (the pinned host keys' digest it saw). ``force: true``
converges every node unasked. Read-only. ``mode: record`` (after the stages) asks the
``converged`` nodes again and writes their state files, and marks ``failed`` ones (``reason``) as not
converged; nothing in check mode.
"""

from __future__ import annotations

import site
from functools import partial
from pathlib import Path
from typing import Any

from ansible import constants as C
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import connection_loader
from ansible.utils.display import Display

site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.inventory import drift
from ddp_cluster.inventory.hostvars import plain
from ddp_cluster.server import state

display = Display()
PARSE = lambda out: (state.complete(out), state.digests(out), state.describe(out))  # noqa: E731


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("mode", "nodes", "force", "check", "converged", "failed", "reason"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result, args, variables = super().run(tmp, task_vars), self._task.args, task_vars or {}
        fact, hostvars, mode = variables["ddp_cluster"], variables["hostvars"], args.get("mode", "probe")
        nodes = [str(n) for n in (args.get("converged") if mode == "record" else args.get("nodes")) or []]
        force = mode == "probe" and bool(boolean(args.get("force", False)))
        records, entries = drift.records_dir(fact), {n: drift.read_entry(fact, n) for n in nodes}
        keep = drift.PROBE_NAMES  # a few names of each node's variables, each read once
        raw = {n: plain({k: v for k, v in hostvars.raw_get(n).items() if k in keep}) for n in nodes}
        for node, found in raw.items():  # an inventory's template, as Ansible templates it (rare)
            for name in [k for k, v in found.items() if isinstance(v, str) and "{{" in v]:
                found[name] = plain(hostvars[node][name])
        connection_loader.get("ssh", class_only=True)  # its settings are known once the plugin is loaded
        option = partial(C.config.get_config_value, plugin_type="connection", plugin_name="ssh")
        ssh = {name: option(name) or "" for name in ("ssh_args", "control_path_dir")}
        asked = [] if force else nodes
        timeout = int(C.config.get_config_value("DEFAULT_TIMEOUT"))
        probes = drift.probe_nodes(asked, raw, entries, state.script, PARSE, timeout=timeout, **ssh)
        states = {n: drift.read_state(records, n) for n in nodes}
        found = drift.survey(nodes, entries, fact, states, probes, meaning=state.MEANING, force=force)
        if mode == "record":
            if self._play_context.check_mode:
                return {**result, "changed": False, "skipped": True, "msg": "check mode: no state written"}
            failed = [str(n) for n in args.get("failed") or []]
            written = drift.record(records, found, states, failed, str(args.get("reason") or "failed"))
            return {**result, "changed": False, "written": written}
        lines = [] if force else found.lines()
        check = bool(boolean(args.get("check", False)))  # the run's; this task itself runs in check mode off
        for line in lines if check or display.verbosity > 0 else []:
            display.display(f"drifted: {line}")
        diff = found.diff(states) if self._play_context.diff and lines else {}
        return {
            **result,
            "changed": check and bool(lines),  # what a check run would change; a run changes nothing here
            "converge": found.converge,
            "lines": lines,
            "diff": diff,
            # What regroup.yml compares with (a fact: a stage's skipped compile.yml does not overwrite it).
            "ansible_facts": {"ddp_cluster_probed": {"known_hosts_sha256": fact.get("known_hosts_sha256")}},
        }
