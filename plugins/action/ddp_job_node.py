"""Action ``ddp_job_node``: check, on one node of a planned job, that the job can start there; changes
nothing.

One command on the node's server (its own connection, no module): the node container answers ``docker
exec``; the node runs no other job (one job per node at a time: a process of another job's directory names
that job and its nodes; with ``wait_for_nodes`` the check is repeated until the node is free, within the
job's time bound); on the first node the master port is free; before an npu health gate, each of the node's
job devices reaches its counterpart on the next server (``hccn_tool -i N -ping -g address IP``, seed 002).
A failure names the node, what is wrong and the fix. The job's files are written only after every node
passed (by ``ddp_job_wait``, on the first node), so a refused job leaves nothing behind.

    - ddp_job_node:
        plan: "{{ _ddp_job_plan }}"
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"
PING_LINE = re.compile(r"^ping (\S+) (\S+) (\S+) ?(.*)$")
BUSY_LINE = re.compile(r"^busy: (\S+) ?(.*)$")
# Seconds between two checks of a busy node, with wait_for_nodes.
BUSY_POLL = 5.0


def check_script(
    container: str, port: int | None, tool: str, targets: Sequence[Mapping[str, Any]], jobs: str = ""
) -> str:
    """The shell script the node's server runs: ``up``/``listening:``/``busy:``/``ping`` lines (see
    :func:`problems`). ``jobs``: the jobs' directory in the node (/workspace/jobs)."""
    lines = [
        f"docker exec {shlex.quote(container)} /bin/sh -c {shlex.quote(_in_node(port, jobs))} 2>&1"
        " || echo down: $?"
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


def _in_node(port: int | None, jobs: str = "") -> str:
    listening = f"ss -Htln 'sport = :{port}' | sed 's/^/listening: /'; " if port else ""
    busy = ""
    if jobs:
        # The jobs' directory is split so that this shell's own command line does not match it.
        head, tail = jobs.rstrip("/").rsplit("/", 1)
        where = f"d={shlex.quote(head)}; j={shlex.quote(tail)}; "
        busy = (
            where + 'for id in $(pgrep -af -- "[/]${d#/}/$j/" | grep -o "$d/$j/[A-Za-z0-9_.-]*"'
            " | sort -u | sed 's#.*/##'); do"
            ' echo "busy: $id $(tr -d \'\\n\' < "$d/$j/$id/job.json" 2>/dev/null'
            ' | grep -o \'"nodes": *\\[[^]]*\\]\')"; done; '
        )
    return f"{listening}{busy}echo up"


def busy_jobs(output: str, own: str) -> dict[str, list[str]]:
    """The other jobs whose processes run on the node (``busy:`` lines): job id -> its nodes."""
    found: dict[str, list[str]] = {}
    for match in map(BUSY_LINE.match, output.splitlines()):
        if not match or match.group(1) == own:
            continue
        try:
            nodes = json.loads("{" + match.group(2) + "}").get("nodes", []) if match.group(2) else []
        except ValueError:
            nodes = []
        found[match.group(1)] = [str(node) for node in nodes]
    return found


def busy_problem(node: str, busy: Mapping[str, Sequence[str]]) -> str:
    jobs = "; ".join(f"job {job} (nodes {', '.join(nodes) or '?'})" for job, nodes in busy.items())
    first = next(iter(busy))
    return (
        f"{node} runs another job: {jobs}. One job per node at a time: wait for it (-e wait=true waits,"
        f" within job_timeout), stop it (ansible-playbook jobs.yml -e stop={first}), or ask for other nodes."
    )


def problems(
    node: str,
    container: str,
    output: str,
    port: int | None,
    targets: Sequence[Mapping[str, Any]],
    own: str = "",
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
    if busy := busy_jobs(output, own):
        found.append(busy_problem(node, busy))
    listening = [line.removeprefix("listening: ") for line in lines if line.startswith("listening: ")]
    if listening and not found:  # a busy node's job holds the port: the job is named already
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
        jobs = str(plan["job_dir"]).rstrip("/").rsplit("/", 1)[0]
        script = check_script(container, port, tool, targets, jobs)
        deadline = time.monotonic() + float(plan["timeout"])
        waited = False
        while True:
            output = str(self._low_level_execute_command(script).get("stdout", ""))
            found = problems(node, container, output, port, targets, own=str(plan["id"]))
            busy = busy_jobs(output, str(plan["id"]))
            # wait=true: a node busy with another job is waited for (its master port is that job's)
            waiting = [problem for problem in found if not problem.startswith(f"{node}: the master port")]
            if not (
                busy and plan.get("wait_for_nodes") and len(waiting) == 1 and time.monotonic() < deadline
            ):
                break
            if not waited:
                display.display(f"{node}: runs job {', '.join(busy)}: waiting for it (wait=true)")
                waited = True
            time.sleep(BUSY_POLL)
        if found:
            return {**result, "failed": True, "msg": " ".join(found)}
        return {**result, "changed": False, "pinged": len(targets), "waited": waited}
