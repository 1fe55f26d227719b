"""Action ``ddp_job_node``: check, on one node of a planned job, that the job can start there; changes
nothing.

One command on the node's server (its own connection, no module): the node container answers ``docker
exec``; on the first node the master port is free; before an npu health gate, each of the node's job devices
reaches its counterpart on the next server (``hccn_tool -i N -ping -g address IP``, seed 002). A failure
names the node, what is wrong and the fix. The job's files are written only after every node passed (by
``ddp_job_wait``, on the first node), so a refused job leaves nothing behind.

    - ddp_job_node:
        plan: "{{ _ddp_job_plan }}"
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.plugins.action import ActionBase

HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"
PING_LINE = re.compile(r"^ping (\S+) (\S+) (\S+) ?(.*)$")


def check_script(container: str, port: int | None, tool: str, targets: Sequence[Mapping[str, Any]]) -> str:
    """The shell script the node's server runs: ``up``/``listening:``/``ping`` lines (see
    :func:`problems`)."""
    lines = [
        f"docker exec {shlex.quote(container)} /bin/sh -c {shlex.quote(_in_node(port))} 2>&1 || echo down: $?"
    ]
    for target in targets:
        device, address = shlex.quote(str(target["device"])), shlex.quote(str(target["address"]))
        lines.append(
            f"out=$(timeout 60 {shlex.quote(tool)} -i {device} -ping -g address {address} 2>&1); rc=$?; "
            f'echo "ping {device} {address} $rc $(printf \'%s\\n\' "$out"'
            " | grep -E 'packets transmitted|error|not'"
            ' | tail -n 1)"'
        )
    return "\n".join(lines)


def _in_node(port: int | None) -> str:
    listening = f"ss -Htln 'sport = :{port}' | sed 's/^/listening: /'; " if port else ""
    return f"{listening}echo up"


def problems(
    node: str, container: str, output: str, port: int | None, targets: Sequence[Mapping[str, Any]]
) -> list[str]:
    """What the script's output says is wrong on ``node``, each with its fix."""
    lines = output.splitlines()
    if "up" not in lines:
        said = " ".join(line for line in lines if not line.startswith("ping ")).strip()
        return [
            f"{node}: the node container {container} does not run ({said[:160]}): bring the cluster up with"
            " `ansible-playbook site.yml`, then run train.yml again."
        ]
    found = []
    listening = [line.removeprefix("listening: ") for line in lines if line.startswith("listening: ")]
    if listening:
        found.append(
            f"{node}: the master port {port} is taken ({'; '.join(listening)}): stop what listens there"
            " (an earlier job?), or pick another port with -e cluster_master_port=PORT."
        )
    peer = targets[0]["peer"] if targets else ""
    failed = [
        f"device {match.group(1)} -> {peer} at {match.group(2)} (rc {match.group(3)}: {match.group(4)})"
        for match in map(PING_LINE.match, lines)
        if match and match.group(3) != "0"
    ]
    if failed:
        found.append(
            f"{node}: hccn_tool -ping failed for {'; '.join(failed)}. These device NICs cannot reach each"
            " other: check their cabling or switch ports, the addresses (hccn_tool -i N -ip -g), their link"
            " (-link -g) and health (-net_health -g); site.yml sets and checks them."
        )
    return found


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("plan",))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        variables = task_vars or {}
        plan = self._task.args["plan"]
        node = str(variables["inventory_hostname"])
        container = node
        port = int(plan["master_port"]) if node == plan["first"] else None
        targets = list((plan.get("ping") or {}).get(node) or [])
        tool = str(self._templar.template(variables.get("hccn_network_tool")) or HCCN_TOOL)
        done = self._low_level_execute_command(check_script(container, port, tool, targets))
        found = problems(node, container, str(done.get("stdout", "")), port, targets)
        if found:
            return {**result, "failed": True, "msg": " ".join(found)}
        return {**result, "changed": False, "pinged": len(targets)}
