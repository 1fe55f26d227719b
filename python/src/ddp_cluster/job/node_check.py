"""Can a planned job start on this node? The check the controller makes on every node of a job before any of
its files is written (the ``ddp_job_node`` action), so that a refused job leaves nothing behind.

One command on the node's server (:func:`check_script`): the job's directory is not there yet (a job id names
one job: an id used before on this node is refused before anything is written); the node container answers
``docker exec``; the node runs no other job (one job per node at a time; the node's own answer,
:mod:`ddp_cluster.job.node_jobs`, names the other job and its nodes; with ``wait_for_nodes`` the check is
repeated until the node is free, within the job's time bound); on the first node the master port is free
and the kernel's listen backlog (``net.core.somaxconn``) holds every rank's connection to the store there;
before an npu health gate, each of the node's job devices reaches its counterpart on the next server
(``hccn_tool -i N -ping -g address IP``, as the Ascend multi-node checklist does); the node is not drained
(the plan skips drained nodes; one drained after the plan, or whose state the plan could not read, is refused
here, never waited for). :func:`problems` names the node, what is wrong and the fix.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ddp_cluster.job import node_jobs
from ddp_cluster.job.transport import Transport, in_container
from ddp_cluster.server import image_reset

HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"
PING_LINE = re.compile(r"^ping (\S+) (\S+) (\S+) ?(.*)$")
# Seconds between two checks of a busy node, with wait_for_nodes.
BUSY_POLL = 5.0
# The script's line when the job's directory is on the node already: its id was used there before.
EXISTS = "exists: "
# What the check says of a job's directory on the node already.
USED = "is there already"
# The first node's line: the listen backlog of its network namespace (the store's, rank 0's and mpirun's).
BACKLOG = "somaxconn: "
# Linux's largest listen backlog cluster_host sets (a larger job gets what the kernel allows: no refusal).
BACKLOG_MAX = 65535
# Nodes whose problems the check's failure spells out; the others are named after them.
NAMED_PROBLEMS = 20
# The reset's lines (server.image_reset): what it undid, could not put back, or why it did not look.
RESET_LINES = (image_reset.UNDONE, image_reset.REFUSED, image_reset.SKIPPED)
# What the first node runs to check every node (its container's Python; the commands in base64).
CHECK_MODULE = "ddp_cluster.supervisor.check"


def listening(port: int | None) -> str:
    """The first node's lines on its master port (``listening:``, what holds it) and its listen backlog."""
    if not port:
        return ""
    return (
        f"(ss -Htln 'sport = :{port}' | sed 's/^/listening: /');"
        f" echo {BACKLOG}$(cat /proc/sys/net/core/somaxconn); "
    )


def in_node(port: int | None, jobs: str) -> str:
    """What the check asks in a node: first the reset of the image's start files, unless a job runs there
    (:mod:`ddp_cluster.server.image_reset`: before any of the node's Pythons starts with its site), then on
    the first node (``port``) the master port and the backlog, the node's jobs (one JSON line) and ``up``."""
    return f"{image_reset.command(jobs)}; {listening(port)}({node_jobs.command(jobs)}); echo up"


def waits(
    node: str, found: Sequence[str], busy: Mapping[str, Any], plan: Mapping[str, Any], in_time: bool
) -> bool:
    """wait=true: a node busy with another job and nothing else wrong with it is waited for, within the job's
    time bound (its master port, taken, is that job's)."""
    others = [problem for problem in found if not problem.startswith(f"{node}: the master port")]
    return bool(busy and plan.get("wait_for_nodes") and len(others) == 1 and in_time)


def check_script(
    container: str,
    port: int | None,
    tool: str,
    targets: Sequence[Mapping[str, Any]],
    jobs: str,
    job_dir: str = "",
) -> str:
    """The shell script the node's server runs: ``exists: DIR`` when the job's directory ``job_dir`` (on the
    server) is there already; ``listening:`` lines, the node's jobs (one JSON line) and ``up`` from the
    container (``down: RC`` when it does not answer), then a ``ping`` line per target. ``jobs``: the jobs'
    directory in the node (/workspace/jobs)."""
    lines = []
    if job_dir:
        lines.append(f"if [ -e {shlex.quote(job_dir)} ]; then echo {shlex.quote(EXISTS + job_dir)}; fi")
    lines.append(f"{in_container(container, in_node(port, jobs))} 2>&1 || echo down: $?")
    for target in targets:
        device, address = shlex.quote(str(target["device"])), shlex.quote(str(target["address"]))
        lines.append(
            f"out=$(timeout 60 {shlex.quote(tool)} -i {device} -ping -g address {address} 2>&1); rc=$?; "
            f'echo "ping {device} {address} $rc $(printf \'%s\\n\' "$out"'
            " | grep -E 'packets transmitted|error|not'"
            ' | tail -n 1)"'
        )
    return "\n".join(lines)


def busy_problem(node: str, busy: Mapping[str, Sequence[str]]) -> str:
    return node_jobs.busy_message(node, busy)


def busy_jobs(output: str, own: str) -> dict[str, list[str]]:
    """The other jobs whose processes run on the node, from the script's output: job id -> its nodes."""
    report = node_jobs.parse("\n".join(line for line in output.splitlines() if line.startswith("{")))
    return node_jobs.busy(report, own) if report else {}


def drained_record(output: str) -> dict[str, Any] | None:
    """The node's drain record, from the script's output (its report's ``drained``); None: not drained."""
    report = node_jobs.parse("\n".join(line for line in output.splitlines() if line.startswith("{")))
    drained = report.get("drained") if report else None
    return dict(drained) if isinstance(drained, Mapping) else None


def problems(
    node: str,
    container: str,
    output: str,
    port: int | None,
    targets: Sequence[Mapping[str, Any]],
    own: str = "",
    ranks: int = 0,
) -> list[str]:
    """What the script's output says is wrong on ``node``, each with its fix. ``ranks``: the job's world size,
    checked against the first node's listen backlog."""
    lines = output.splitlines()
    if "up" not in lines:
        said = " ".join(line for line in lines if not line.startswith("ping ")).strip()
        return [
            f"{node}: the node container {container} does not run ({said[:160]}): bring the cluster up with"
            " `ansible-playbook site.yml`, then run train.yml again."
        ]
    found = [
        f"{node}: the job's directory {line.removeprefix(EXISTS)} {USED}: job id {own} was used"
        " before on this node, and a job id names one job. Pick another job_id, or leave job_id out (a"
        " fresh one is made); the earlier job's files stay where they are (ansible-playbook jobs.yml lists"
        " it)."
        for line in lines
        if line.startswith(EXISTS)
    ]
    found += dict.fromkeys(  # the first node's reset runs twice (before the check module, and in it)
        f"{node}: {line.removeprefix(image_reset.REFUSED)}"
        for line in lines
        if line.startswith(image_reset.REFUSED)
    )
    if busy := busy_jobs(output, own):
        found.append(busy_problem(node, busy))
    if drained := drained_record(output):
        found.append(node_jobs.drained_message(node, drained))
    holders = [line.removeprefix("listening: ") for line in lines if line.startswith("listening: ")]
    if holders and not found:  # a busy node's job holds the port: the job is named already
        found.append(
            f"{node}: the master port {port} is taken ({'; '.join(holders)}): stop what listens there"
            " (an earlier job?), or pick another port with -e cluster_master_port=PORT."
        )
    if problem := backlog_problem(node, lines, ranks):
        found.append(problem)
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


def undone(node: str, output: str) -> list[str]:
    """What the reset of the image's start files undid on ``node`` (what an earlier job left), one line
    each, as the check says them."""
    return [
        f"{node}: undone what an earlier job left: {line.removeprefix(image_reset.UNDONE)}"
        for line in output.splitlines()
        if line.startswith(image_reset.UNDONE)
    ]


def backlog_problem(node: str, lines: Sequence[str], ranks: int) -> str:
    """The first node's listen backlog when it is smaller than the job's ranks: each rank connects to the
    store there at the start, and the kernel drops connections past ``net.core.somaxconn`` (ranks then time
    out)."""
    said = [line.removeprefix(BACKLOG).strip() for line in lines if line.startswith(BACKLOG)]
    if not said or not said[-1].isdigit() or int(said[-1]) >= min(ranks, BACKLOG_MAX):
        return ""
    wanted = min(BACKLOG_MAX, max(4096, 2 * ranks))
    return (
        f"{node}: net.core.somaxconn is {said[-1]}, fewer than the job's {ranks} ranks, which all connect to"
        f" the store on this node at the start: the kernel would drop connections and ranks time out. Raise"
        f" it on the node's server: `ansible-playbook site.yml --tags cluster_host` sizes it to the cluster"
        f" (or -e cluster_host_somaxconn={wanted}), or run fewer ranks."
    )


def check_node(
    plan: Mapping[str, Any],
    node: str,
    transport: Transport,
    tool: str = HCCN_TOOL,
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Check ``node`` for the job ``plan`` (waiting while another job runs there, with wait_for_nodes); the
    action's result: ``failed`` and ``msg`` naming every problem, or ``pinged`` and ``waited``."""
    port = int(plan["master_port"]) if node == plan["first"] else None
    targets = list((plan.get("ping") or {}).get(node) or [])
    own = str(plan["id"])
    ranks = int(plan.get("world_size") or 0)
    job_dir = str((plan.get("host_dirs") or {}).get(node) or "")
    script = check_script(node, port, tool, targets, node_jobs.jobs_dir(str(plan["job_dir"])), job_dir)
    deadline = clock() + float(plan["timeout"])
    waited = False
    while True:
        output = transport.run(script).stdout
        found = problems(node, node, output, port, targets, own=own, ranks=ranks)
        reset = undone(node, output)
        for line in reset:
            say(line)
        busy = busy_jobs(output, own)
        if not waits(node, found, busy, plan, clock() < deadline):
            break
        if not waited:
            say(f"{node}: runs job {', '.join(busy)}: waiting for it (wait=true)")
            waited = True
        sleep(BUSY_POLL)
    if found:
        return {"failed": True, "msg": " ".join(found), **({"reset": reset} if reset else {})}
    passed: dict[str, Any] = {"changed": bool(reset), "pinged": len(targets), "waited": waited}
    return {**passed, "reset": reset} if reset else passed


def node_script(port: int | None, jobs: str, job_dir: str) -> str:
    """The check's command in a node (run by the first node: :mod:`ddp_cluster.supervisor.check`): what
    :func:`check_script` asks of the node container, without the server's ``docker exec`` (``exists:`` names
    the job's directory as the node sees it). The job's directory never appears whole in the command
    line: the node's answer of which jobs run there (:mod:`ddp_cluster.supervisor.jobs`) counts every
    process whose command line holds ``JOBS/ID``, so two jobs' checks at once would each take the other's
    shell for a job."""
    job = shlex.quote(job_dir.rstrip("/").rsplit("/", 1)[-1])
    exists = f'd={shlex.quote(jobs)}; if [ -e "$d/"{job} ]; then echo "{EXISTS}$d/"{job}; fi; '
    return f"{exists}{in_node(port, jobs)}"


def encode(command: str) -> str:
    return base64.b64encode(command.encode()).decode()


def fanout_command(
    first: str, nodes: Sequence[str], port: int, jobs: str, job_dir: str, port_everywhere: bool = False
) -> str:
    """The first node's server's command: the first node's container checks ``nodes`` (itself included) and
    prints one JSON line, node -> its check's output. ``port_everywhere``: every node is asked about the
    master port (a Slurm job: any of them may be its first node)."""
    words = (
        "--me", first,
        "--nodes", ",".join(nodes),
        "--first", encode(node_script(port, jobs, job_dir)),
        "--command", encode(node_script(port if port_everywhere else None, jobs, job_dir)),
    )  # fmt: skip
    # The first node's start files reset before its Python starts with its site (the check module's).
    line = f". {node_jobs.NODE_ENV} && python -m {CHECK_MODULE} {' '.join(map(shlex.quote, words))}"
    return in_container(first, f"{image_reset.command(jobs)}; {line}", shell="/bin/bash")


def fanout_answers(output: str, nodes: Sequence[str]) -> dict[str, str] | None:
    """Node -> its check's output from the first node's JSON line; None when there is none (the first node
    could not answer: its container does not run)."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                answers = json.loads(line).get("answers")
            except (ValueError, AttributeError):
                continue
            if isinstance(answers, dict):
                return {node: str(answers.get(node, "")) for node in nodes}
    return None


def check_nodes(
    plan: Mapping[str, Any],
    transport: Transport,
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Check every node of the job ``plan`` from its first node: one command on the first node's server,
    whatever the node count (the first node asks the others over the mesh). With wait_for_nodes, the nodes
    busy with another job are asked again until free, within the job's time bound. The action's result:
    ``failed`` and ``msg`` naming every problem of every node, or ``checked`` and ``waited``."""
    first, nodes = str(plan["first"]), [str(node) for node in plan["nodes"]]
    port, own = int(plan["master_port"]), str(plan["id"])
    if plan.get("slurm"):
        # A job Slurm schedules: every node it may be given is asked whether the job's id was used there
        # and whether something that is no job holds the master port (any of them may be its first node;
        # its image's start files are put back); which of them are free is Slurm's to say, and the nodes
        # it gives are checked whole where it starts the job (ddp_cluster.supervisor.allocation).
        nodes = list(dict.fromkeys([*nodes, *(str(node) for node in plan.get("host_dirs") or {})]))
    ranks = int(plan.get("world_size") or 0)
    jobs = node_jobs.jobs_dir(str(plan["job_dir"]))
    deadline = clock() + float(plan["timeout"])
    found: dict[str, list[str]] = {}
    reset: list[str] = []  # what the reset of each node's start files undid
    pending, announced = list(nodes), set[str]()
    while pending:
        done = transport.run(
            fanout_command(first, pending, port, jobs, str(plan["job_dir"]), bool(plan.get("slurm")))
        )
        said = done.stdout + ("\n" + done.stderr if done.stderr else "")
        answers = fanout_answers(said, pending)
        if answers is not None and first in answers:  # what the reset before the check module said
            early = [line for line in said.splitlines() if line.startswith(RESET_LINES)]
            answers[first] = "\n".join([*early, answers[first]])
        if answers is None:  # the first node could not ask (its container is down): nothing else is known
            found[first] = problems(first, first, said, port, [], own=own, ranks=ranks)
            break
        busy_now: list[str] = []
        for node in pending:
            node_port = port if node == first or plan.get("slurm") else None
            # the job's directory named as on the node's server (its workspace), as the user finds it
            where = str((plan.get("host_dirs") or {}).get(node) or plan["job_dir"])
            answer = answers[node].replace(EXISTS + str(plan["job_dir"]), EXISTS + where)
            problems_here = problems(node, node, answer, node_port, [], own=own, ranks=ranks)
            if plan.get("slurm"):  # a port held by another job is that job's, and Slurm's to wait for
                problems_here = [
                    problem
                    for problem in problems_here
                    if USED in problem or problem.startswith(f"{node}: the master port")
                ]
            for line in undone(node, answer):
                say(line)
                reset.append(line)
            busy = {} if plan.get("slurm") else busy_jobs(answer, own)
            if waits(node, problems_here, busy, plan, clock() < deadline):
                busy_now.append(node)
                if node not in announced:
                    say(f"{node}: runs job {', '.join(busy)}: waiting for it (wait=true)")
                    announced.add(node)
                continue
            if problems_here:
                found[node] = problems_here
        pending = busy_now
        if pending:
            sleep(BUSY_POLL)
    if found:
        named = [node for node in nodes if node in found]
        spelled = [problem for node in named[:NAMED_PROBLEMS] for problem in found[node]]
        rest = named[NAMED_PROBLEMS:]
        if rest:  # a thousand nodes' lines say less than a count
            listed = ", ".join(rest) if len(rest) <= 8 else f"{', '.join(rest[:4])}, ..., {rest[-1]}"
            spelled.append(f"And {len(rest)} more node(s) with problems: {listed}.")
        return {"failed": True, "msg": " ".join(spelled), **({"reset": reset} if reset else {})}
    passed: dict[str, Any] = {"changed": bool(reset), "checked": len(nodes), "waited": bool(announced)}
    return {**passed, "reset": reset} if reset else passed
