"""Which jobs run on a node, and a job stopped there: the one command that asks a node, and its answer.

The node answers with :mod:`ddp_cluster.supervisor.jobs` (in its container: the jobs' directories and the
processes that name them), whoever asks: the controller's check before a job starts (``ddp_job_node``: is the
node busy?), ``jobs.yml`` (the list; ``-e stop=ID``), the controller's wait when it stops a job (Ctrl-C, its
bound), and the supervisor looking for a free spare. So "which jobs run here" and "stop this job here" have
one implementation, in the node. So has the claim of a job's nodes that its start takes (one job per node,
:func:`claim_command`, read by :func:`parse_claim`). :func:`table` merges the nodes' answers into the lines
jobs.yml prints: each job (id, state, nodes, progress, started, restarts) and each node (free, busy with a
job, drained since when, by whom and why, down).
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddp_cluster.job import status as job_status
from ddp_cluster.job.transport import Transport, Unreachable, in_container
from ddp_cluster.text import visible

MODULE = "ddp_cluster.supervisor.jobs"
# The node image's environment (its Python, the package): docker exec starts no login shell.
NODE_ENV = "/etc/ddp-cluster/env.sh"
# A job's id: its directory's name on every node and under runs/ on the controller, checked whole
# (fullmatch: no trailing newline slips through) before it goes into a path or a command line. At most
# ID_MAX characters: names are made from it (<id>-preflight, .<id>.tmp, /tmp/ddp-cluster/<id>.last-words,
# Slurm's job name) and it is a column of jobs.yml's table, so 64 keeps each far inside its limit (a file
# name's 255 bytes, a terminal's width) and is three times what a generated id needs (20:
# YYYYmmdd-HHMMSS-xxxx). :func:`id_problem` says what is wrong with one that is not an id.
ID_MAX = 64
JOB_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{ID_MAX - 1}}}")
ID_RULE = f"letters, digits, _ . and - (a letter or digit first), at most {ID_MAX} characters"
# The characters a POSIX extended regular expression (pgrep's and pkill's -f) gives a meaning.
ERE_SPECIAL = frozenset("\\.[]()*+?{}|^$")


def id_problem(value: object, name: str = "job id") -> str:
    """What is wrong with ``value`` as a job id, '' when it is one: ``name`` is what the user set
    (``job_id=``, ``stop=``, ``--claim``)."""
    text = value if isinstance(value, str) else str(value)
    shown = repr(text) if len(text) <= 80 else f"{text[:40]!r}... ({len(text)} characters)"
    if len(text) > ID_MAX:
        return f"{name}={shown} is {len(text)} characters long: a job id is at most {ID_MAX}"
    if JOB_ID.fullmatch(text) is None:
        return f"{name}={shown} is not a job id: a job id is {ID_RULE}"
    return ""


def literal_pattern(text: str) -> str:
    """pgrep's and pkill's ``-f`` pattern (an extended regular expression) that matches ``text`` itself and
    nothing else: every character the syntax gives a meaning is escaped (job ``a.1``'s pattern never matches
    job ``a-1``), and the first is put in brackets (``[/]workspace/jobs/ID/``) so that the command line of
    the pgrep or pkill that holds the pattern does not match it."""
    if not text:
        return text
    if text[0] in "^\\":  # no bracket expression holds these alone; a path never starts with one
        raise ValueError(f"{text!r}: a process pattern's text must not start with {text[0]!r}")
    return f"[{text[0]}]{ere_escape(text[1:])}"


def ere_escape(text: str) -> str:
    """``text`` as an extended regular expression (pgrep's, pkill's) that matches it literally."""
    return "".join(f"\\{char}" if char in ERE_SPECIAL else char for char in text)


def literal_of(pattern: str) -> str:
    """The text :func:`literal_pattern` made ``pattern`` of (its inverse)."""
    if not pattern.startswith("[") or pattern[2:3] != "]":
        raise ValueError(f"{pattern!r} is not a process pattern ('[/]workspace/jobs/ID/')")
    return pattern[1] + re.sub(r"\\(.)", r"\1", pattern[3:])


def jobs_dir(job_dir: str) -> str:
    """The jobs' directory in the node (/workspace/jobs) of a job's directory (/workspace/jobs/ID)."""
    return job_dir.rstrip("/").rsplit("/", 1)[0]


def command(jobs: str, stop: str = "", reason: str | None = None) -> str:
    """The node's shell command: its report of the jobs (one JSON line); with ``stop``, job ``stop`` stopped
    there first (``reason``: what its status says; '' stops it as its time bound does, without one)."""
    line = f". {NODE_ENV} && python -m {MODULE} --jobs-dir {shlex.quote(jobs)}"
    if stop:
        line += f" --stop {shlex.quote(stop)}"
        if reason is not None:
            line += f" --reason {shlex.quote(reason)}"
    return line


def claim_command(jobs: str, job: str, nodes: Sequence[str], start: str = "") -> str:
    """The first node's shell command that claims ``nodes`` for ``job``, all or nothing (one JSON line
    says; :func:`parse_claim` reads it). Run in the first node's container: it reaches the others over the
    mesh. ``start``: this start's own mark (JobSpec.start_id): another start of the same id is refused."""
    line = (
        f". {NODE_ENV} && python -m {MODULE} --jobs-dir {shlex.quote(jobs)} --claim {shlex.quote(job)}"
        f" --nodes {shlex.quote(','.join(nodes))}"
    )
    return line + (f" --start {shlex.quote(start)}" if start else "")


def release_command(jobs: str, job: str, nodes: Sequence[str], start: str = "") -> str:
    """The first node's shell command that releases ``job``'s claim on ``nodes`` (another job's is kept;
    with ``start``, another start's of the same id too)."""
    line = (
        f". {NODE_ENV} && python -m {MODULE} --jobs-dir {shlex.quote(jobs)} --release {shlex.quote(job)}"
        f" --nodes {shlex.quote(','.join(nodes))}"
    )
    return line + (f" --start {shlex.quote(start)}" if start else "")


def busy_message(node: str, busy: Mapping[str, Sequence[str]]) -> str:
    """``node`` is another job's (job id -> its nodes): what the user sees, with the three ways on."""
    jobs = "; ".join(f"job {job} (nodes {', '.join(nodes) or '?'})" for job, nodes in busy.items())
    first = next(iter(busy))
    return (
        f"{node} runs another job: {jobs}. One job per node at a time: wait for it (-e wait=true waits,"
        f" within job_timeout), stop it (ansible-playbook jobs.yml -e stop={first}), or ask for other nodes"
        " (-e exclude=NODE or -e nodelist=...)."
    )


def twin_message(node: str, job: str, answer: Mapping[str, Any]) -> str:
    """Another start of the same id holds ``node`` (two train.yml of one job_id at once, or a second start
    while the first runs): what the refused start says."""
    at = answer.get("at")
    when = time.strftime("%H:%M:%S", time.localtime(float(at))) if isinstance(at, int | float) and at else "?"
    return (
        f"job {job} is being started by another train.yml already: {node} is claimed by that start (at"
        f" {when}), and one job id runs once. Nothing of this start was written. Follow that one"
        f" (ansible-playbook train.yml -e attach={job}), stop it (ansible-playbook jobs.yml -e stop={job}),"
        " or start this one under another job_id."
    )


def describe_drained(record: Mapping[str, Any]) -> str:
    """A node's drain record (:mod:`ddp_cluster.supervisor.drain`'s) as the list shows it: ``drained since
    TIME by WHO: REASON``."""
    return (
        f"drained since {record.get('since') or '?'} by {record.get('by') or '?'}:"
        f" {record.get('reason') or '(no reason given)'}"
    )


def drained_message(node: str, record: Mapping[str, Any]) -> str:
    """``node`` is drained: what the user sees when a job would take it, with the ways on."""
    return (
        f"{node} is {describe_drained(record)}. A drained node takes no new job: undrain it once it is"
        f" fixed (ansible-playbook jobs.yml -e undrain={node}), or ask for other nodes"
        " (-e exclude=NODE or -e nodelist=...)."
    )


def parse_claim(output: str) -> tuple[bool, str]:
    """Whether :func:`claim_command` claimed every node, and else why, as the user reads it."""
    answer = parse(output)
    if answer is None or "claimed" not in answer:
        said = output.strip().splitlines()
        return (
            False,
            f"the claim of the job's nodes gave no answer ({(said[-1] if said else 'no output')[:200]})",
        )
    if answer["claimed"]:
        return True, ""
    node, other = str(answer.get("node") or "?"), str(answer.get("job") or "")
    if isinstance(answer.get("drained"), Mapping):
        return False, drained_message(node, answer["drained"])
    if answer.get("locked"):
        return False, str(answer.get("error") or f"{node}: its claim lock did not come free")
    if answer.get("twin"):
        return False, twin_message(node, other, answer)
    if other:
        nodes = answer.get("nodes")
        return False, busy_message(node, {other: [str(n) for n in nodes] if isinstance(nodes, list) else []})
    return False, (
        f"{node} did not answer the claim of its node over the cluster's ssh ({answer.get('error', '?')}):"
        " check that its container runs (ansible-playbook jobs.yml lists the nodes), bring it back with"
        " site.yml, or ask for other nodes (-e exclude=NODE or -e nodelist=...)."
    )


def parse(output: str) -> dict[str, Any] | None:
    """The node's report, from the command's output (its last JSON line); None when it gave none."""
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except ValueError:
                return None
            return report if isinstance(report, dict) else None
    return None


def busy(report: Mapping[str, Any], own: str = "") -> dict[str, list[str]]:
    """The jobs other than ``own`` whose processes run on the node: job id -> its nodes (its job.json's)."""
    jobs = report.get("jobs") or {}
    found: dict[str, list[str]] = {}
    for job in report.get("busy") or []:
        if job == own:
            continue
        item = jobs.get(job) if isinstance(jobs, Mapping) else None
        nodes = item.get("nodes") if isinstance(item, Mapping) else None
        found[str(job)] = [str(node) for node in nodes] if isinstance(nodes, list) else []
    return found


def ask(
    transport: Transport, container: str, jobs: str, stop: str = "", reason: str | None = None
) -> dict[str, Any]:
    """The node's report through ``transport`` (its server) as the ``ddp_jobs_node`` action returns it:
    ``report``, or ``down`` saying why there is none (a node whose container does not answer is no failure:
    the list shows it)."""
    done = transport.run(in_container(container, command(jobs, stop, reason), shell="/bin/bash"))
    report = parse(done.stdout) if done.rc == 0 else None
    if report is None:
        said = (done.stderr.strip() or done.stdout.strip() or f"rc {done.rc}").splitlines()
        return {"changed": False, "down": f"its container does not answer: {said[-1][:200]}"}
    return {"changed": bool(stop), "report": report}


DRAIN_MODULE = "ddp_cluster.supervisor.drain"


def workspace_jobs(records_dir: str, node: str) -> str:
    """The jobs' directory in ``node``'s container (/workspace/jobs), from what site.yml recorded of it."""
    workspace = "/workspace"
    try:
        record = json.loads(Path(records_dir, f"{node}.json").read_text(encoding="utf-8"))
        workspace = str(record.get("container_workspace") or workspace)
    except (OSError, ValueError, AttributeError):
        pass
    return f"{workspace}/jobs"


def drain_command(jobs: str, undrain: bool, reason: str, by: str, check: bool) -> str:
    """The node's shell command that drains (or undrains) it, then reports its jobs: two JSON lines, the
    drain's answer (:mod:`ddp_cluster.supervisor.drain`) and the node's report (which jobs run there)."""
    line = f". {NODE_ENV} && python -m {DRAIN_MODULE} --jobs-dir {shlex.quote(jobs)}"
    line += " --undrain" if undrain else f" --drain --reason {shlex.quote(reason)} --by {shlex.quote(by)}"
    line += " --check" if check else ""
    return f"{line}; {command(jobs)}"


def show_command(jobs: str, nodes: Sequence[str]) -> str:
    """The node's shell command that reads every node's drain record of ``nodes`` over the mesh, at once:
    one JSON line, ``drained`` (node -> record) and ``unknown`` (the nodes that did not answer)."""
    return (
        f". {NODE_ENV} && python -m {DRAIN_MODULE} --jobs-dir {shlex.quote(jobs)} --show"
        f" --nodes {shlex.quote(','.join(nodes))}"
    )


def gate_drain_command(jobs: str, job: str, by: str, check: bool) -> str:
    """The first node's shell command that drains the nodes health gate ``job``'s verdict names slow (over
    the mesh); one JSON line with ``lines``, as the report says them."""
    line = (
        f". {NODE_ENV} && python -m {DRAIN_MODULE} --jobs-dir {shlex.quote(jobs)} --gate {shlex.quote(job)}"
        f" --by {shlex.quote(by)}"
    )
    return line + (" --check" if check else "")


def _json_lines(output: str) -> list[dict[str, Any]]:
    found = []
    for line in output.splitlines():
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                found.append(value)
    return found


def drain_result(node: str, undrain: bool, check: bool, output: str, rc: int) -> dict[str, Any]:
    """The ``ddp_jobs_drain`` action's result from :func:`drain_command`'s output: ``msg`` (what was done,
    and what it means for a job that runs there), ``changed``; ``failed`` when the node refused or did not
    answer."""
    answers = _json_lines(output)
    answer = next((item for item in answers if "drained" in item or "error" in item), None)
    report = next((item for item in answers if "busy" in item), None)
    if answer is None:
        said = output.strip().splitlines()
        return {
            "failed": True,
            "msg": f"{node} did not answer the {'undrain' if undrain else 'drain'} (rc {rc}:"
            f" {(said[-1] if said else 'no output')[:200]}): check that its container runs (site.yml brings"
            " it up), then run jobs.yml again",
        }
    if answer.get("error"):
        return {"failed": True, "msg": f"{node}: {answer['error']}"}
    was, now = answer.get("was"), answer.get("drained")
    would = "would be " if check else ""
    if undrain:
        if not isinstance(was, Mapping):
            return {"changed": False, "msg": f"{node} is not drained: nothing to undrain"}
        msg = f"{node} {would}undrained (it was {describe_drained(was)}); the next jobs may take it again"
        return {"changed": not check, "msg": msg}
    if not isinstance(now, Mapping):
        return {"failed": True, "msg": f"{node} gave no drain record back: {output.strip()[-200:]}"}
    same = isinstance(was, Mapping) and was == now
    msg = f"{node} {would}drained: {now.get('reason')}"
    if same:
        msg = f"{node} is {describe_drained(now)} already: nothing changed"
    elif isinstance(was, Mapping):
        msg += f" (it was {describe_drained(was)}: the record says the latest reason)"
    running = [str(job) for job in (report or {}).get("busy") or []]
    if running:
        msg += (
            f". It runs job {', '.join(running)}: the job goes on; the drain keeps {node} out of the next"
            " jobs and of a restart's spares"
        )
    else:
        msg += f". The next jobs skip it; ansible-playbook jobs.yml -e undrain={node} gives it back"
    return {"changed": not check and not same, "msg": msg, "drained": now, "busy": running}


def drain_node(
    transport: Transport,
    node: str,
    jobs: str,
    undrain: bool,
    reason: str,
    by: str,
    check: bool,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """The ``ddp_jobs_drain`` action on ``node``: drain (or undrain) it with :func:`drain_command`, say what
    was done (:func:`drain_result`); its result."""
    line = drain_command(jobs, undrain, reason, by, check)
    try:
        done = transport.run(in_container(node, line, shell="/bin/bash"))
    except Unreachable as error:
        return {"unreachable": True, "msg": f"{node}'s server does not answer: {error}"}
    answer = drain_result(node, undrain, check, done.stdout, done.rc)
    if not answer.get("failed"):
        say(str(answer["msg"]))
    return answer


def read_drained(
    transport: Transport, via: str, jobs: str, nodes: Sequence[str], warn: Callable[[str], None]
) -> dict[str, Any]:
    """Every node's drain record, asked through the node ``via`` over the cluster's mesh
    (:func:`show_command`): ``drained`` (node -> record) and ``unknown`` (the nodes that did not answer).
    When ``via`` cannot be asked, ``drained`` is absent and ``warn`` says why (no failure: each node's own
    check before the start refuses a drained node)."""
    listed = [str(node) for node in nodes]
    try:
        done = transport.run(in_container(via, show_command(jobs, listed), shell="/bin/bash"))
    except Unreachable as error:
        warn(f"the drained nodes could not be read through {via}: {error}")
        return {"changed": False, "nodes": listed}
    answer = parse(done.stdout)
    if answer is None or not isinstance(answer.get("drained"), dict):
        warn(f"the drained nodes could not be read through {via}: {done.said(200)}")
        return {"changed": False, "nodes": listed}
    return {"changed": False, "nodes": listed, "drained": answer["drained"], "unknown": answer.get("unknown")}


def drain_after_gate(
    transport: Transport,
    plan: Mapping[str, Any],
    node: str,
    by: str,
    check: bool,
    say: Callable[[str], None],
    warn: Callable[[str], None],
) -> dict[str, Any]:
    """After health gate ``plan``, from its first node ``node``: the nodes its verdict names slow drained
    (:func:`gate_drain_command`), each said as ``drained: NODE (reason)``. Never a failure (the report says
    the gate's verdict): what could not be done is a warning."""
    job = str(plan["id"])
    line = gate_drain_command(jobs_dir(str(plan["job_dir"])), job, by, check)
    try:
        done = transport.run(in_container(node, line, shell="/bin/bash"))
    except Unreachable as error:
        warn(f"health gate {job}: its failing nodes could not be drained: {error}")
        return {"changed": False, "lines": []}
    answer = parse(done.stdout) or {}
    lines = [str(text) for text in answer.get("lines") or []]
    for text in lines:
        say(text)
    if not answer:
        warn(f"health gate {job}: the drain of its failing nodes gave no answer ({done.said(200)})")
    return {"changed": bool(answer.get("changed")), "lines": lines}


def _started(found: Mapping[str, Any]) -> str:
    updated, elapsed = found.get("updated") or 0, found.get("elapsed") or 0
    if not updated:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(updated) - float(elapsed)))


def table(reports: Mapping[str, Any], down: Mapping[str, str] | None = None) -> list[str]:
    """The lines jobs.yml prints, from each node's :func:`node_report` (``down``: node -> why no report)."""
    down = dict(down or {})
    jobs: dict[str, dict[str, Any]] = {}
    busy: dict[str, list[str]] = {}
    for node, report in sorted(reports.items()):
        for job in report.get("busy", []):
            busy.setdefault(node, []).append(job)
        for job, item in report.get("jobs", {}).items():
            entry = jobs.setdefault(job, {"nodes": item.get("nodes", []), "status": None})
            if item.get("status"):
                entry.update(status=item["status"], first=node, supervisor=item.get("supervisor"))
            elif item.get("status_problem"):  # its first node has a status.json that is no status
                entry.update(problem=f"{node}: {item['status_problem']}")
            entry["max_restarts"] = item.get("max_restarts", 0)
    rows = [("job", "state", "nodes", "progress", "started", "restarts")]
    order = sorted(jobs.items(), key=lambda pair: (pair[1].get("status") or {}).get("updated") or 0)
    for job, entry in order:
        found = entry.get("status") or {}
        state = str(found.get("state") or "")
        if not found and entry.get("problem"):
            state = "unknown (its status.json is no status: below)"
        elif not found:  # status.json is on the job's first node: it did not answer, or never ran it
            state = "unknown (no status: its first node did not answer)"
        elif state in ("starting", "running") and not entry.get("supervisor"):
            state = f"{state}, no supervisor on {entry.get('first')}"
        nodes = found.get("nodes") or entry.get("nodes") or []
        progress = job_status.describe_progress(found.get("progress")) if found else "?"
        restarts = f"{len(found.get('restarts') or [])}/{entry.get('max_restarts', 0)}"
        rows.append((job, state, ",".join(nodes), progress[:60], _started(found) if found else "?", restarts))
    widths = [max(len(str(row[index])) for row in rows) for index in range(len(rows[0]))]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    if len(rows) == 1:
        lines.append("(no job on these nodes)")
    lines.append("")
    for node in sorted(set(reports) | set(down)):
        drained = reports.get(node, {}).get("drained")
        if node in down:
            lines.append(f"{node}: down ({down[node][:120]})")
        elif busy.get(node):
            lines.append(f"{node}: busy: {', '.join(busy[node])}")
        elif not isinstance(drained, Mapping):
            lines.append(f"{node}: free")
        if isinstance(drained, Mapping) and node not in down:
            # a drained node that runs a job: the job goes on, the drain keeps the node out of the next ones
            lines.append(f"{node}: {describe_drained(drained)}")
        strays = reports.get(node, {}).get("strays")
        if isinstance(strays, Mapping) and strays and node not in down:
            left = "; ".join(f"job {job} (pids {', '.join(map(str, pids))})" for job, pids in strays.items())
            lines.append(f"{node}: stray processes of ended jobs, ended by the next job's claim: {left}")
    for job, entry in order:
        for record in (entry.get("status") or {}).get("restarts") or []:
            lines.append(f"{job}: {job_status.describe_restart(record)}")
        if entry.get("problem"):
            lines.append(f"{job}: {entry['problem']}")
    # what a node reported (a job's status, its progress, a cause) reaches the terminal as text, one line each
    return [visible(line, newlines=False) for line in lines]
