"""``ddp-cluster report RUN_DIR``: everything a run says once its nodes' archives are back, in one place.

train.yml and check.yml call it (through the ``ddp_job_report`` action) after fetching one archive per node
into ``RUN_DIR/.incoming/``; a user can run it again on any run directory. In order:

1. the layout (:func:`ddp_cluster.job.results.lay_out`): each node's files under ``nodes/``, the first node's
   output under ``output/``, one log per rank under ``logs/``; what it left out of a node's archive (unsafe
   members), or an archive cut short, is a warning;
2. the status (:mod:`ddp_cluster.job.status`) and the plan (``plan.json``, :mod:`ddp_cluster.job.plan`);
3. a job's loss curve (``output/loss.png``, :mod:`ddp_cluster.job.plot`) and summary
   (``output/summary.json``);
4. a health gate's results (``output/health.json``, :mod:`ddp_cluster.health.judge`; a preflight gate's also
   kept as the job's ``runs/<id>/output/health.json``);
5. on failure, the node, the rank, the exit status, the failed rank's last lines and the doctor's likely
   causes (:mod:`ddp_cluster.job.doctor`);
6. the telemetry the supervisor sampled (``telemetry/NODE.jsonl``): drawn beside the loss curve
   (``output/telemetry.png``), and each device problem it saw named (node, device, what, when); a device
   that turned bad during the job ended its attempt as a device fault, which the status's reason names.

:func:`report` returns the lines to print, the warnings (what a step after the job could not do: never a
failure of a job that succeeded), the one-line failure (empty on success) and the exit status (0, or 1).

Every file it reads a job could have written (the job's directory is the job's): each is read in bounded
memory (metrics and telemetry a line at a time, the rest up to a size), one that cannot be read is a warning
naming the node and what is wrong (``node1: .../status.json is ... not UTF-8 ...``), never a traceback; and
every line it returns is shown, never obeyed (:func:`ddp_cluster.text.visible`: a rank's log tail, a reason,
a file's name hold no escape sequence a terminal would act on).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_cluster.health import judge as health
from ddp_cluster.job import doctor, plan, results, status
from ddp_cluster.job import sync as job_sync
from ddp_cluster.runtime.metrics import METRICS_FILE, SUMMARY_FILE
from ddp_cluster.text import visible

PLOT_FILE = "loss.png"
TELEMETRY_PLOT = "telemetry.png"
# A stop asked with jobs.yml -e stop=ID is not the job's failure (Ctrl-C in train.yml is: it exits non-zero).
STOPPED_BY_JOBS = "stopped with jobs.yml"
DOCTOR_WIDTH = 110
NO_STATUS = "no status from the supervisor"
UNREADABLE_STATUS = "its status.json cannot be read (the warning above says why)"
# The most of summary.json that is read: the entrypoint's is a few hundred bytes; a larger one is not read.
SUMMARY_MAX = 1024 * 1024


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    failure: str = ""  # one line; empty when the run succeeded
    gate_passed: bool = False

    @property
    def exit_status(self) -> int:
        return 1 if self.failure else 0


def _figure(summary: Mapping[str, Any], name: str, shape: str) -> str:
    value = summary.get(name)
    return shape % float(value) if isinstance(value, int | float) and not isinstance(value, bool) else "n/a"


def output_dir(run_dir: Path) -> Path:
    """Where a run's output is laid out (the first node's output/: summary, metrics, health, checkpoints)."""
    return run_dir / results.OUTPUT


def _summary(run_dir: Path, report: Report) -> dict[str, Any]:
    path = output_dir(run_dir) / SUMMARY_FILE
    if not path.is_file():
        return {}
    try:
        with open(path, "rb") as handle:
            raw = handle.read(SUMMARY_MAX + 1)
        if len(raw) > SUMMARY_MAX:
            raise ValueError(f"larger than {SUMMARY_MAX // 1024} KiB, which no summary is")
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        said = "not UTF-8" if isinstance(error, UnicodeDecodeError) else str(error)[:200]
        report.warnings.append(f"{SUMMARY_FILE} is not valid JSON ({said}): the figures below are missing")
        return {}
    return dict(data) if isinstance(data, Mapping) else {}


def _plot(run_dir: Path, report: Report, wanted: bool) -> None:
    metrics = output_dir(run_dir) / METRICS_FILE
    if not metrics.is_file():
        if wanted:
            report.warnings.append(
                "no loss curve: the job wrote no metrics.jsonl (a user script writes one only if it chooses"
                " to, into $DDP_JOB_DIR/output/)"
            )
        return
    loss = output_dir(run_dir) / PLOT_FILE
    # The job's own (a link is never written through); one a mid-run sync drew is drawn again, to the end.
    if (loss.exists() or loss.is_symlink()) and not job_sync.drawn_by_sync(run_dir):
        return
    try:
        from ddp_cluster.job import plot  # matplotlib, only when there is a curve to draw

        records = plot.read_metrics(metrics)
        if not records:
            raise plot.PlotError(f"{metrics} holds no records: the run logged nothing")
        plot.plot_metrics(records, loss, title=f"{run_dir.name}: loss")
    except Exception as error:  # no step after the job may fail it: said as a warning
        said = str(error).strip().splitlines()
        report.warnings.append(f"no loss curve: ddp-cluster plot: error: {said[-1] if said else repr(error)}")


def _telemetry(run_dir: Path, report: Report) -> list[str]:
    """The telemetry's lines (where it is, the devices' problems, each the first time it was seen), and
    output/telemetry.png drawn (a warning when it cannot be)."""
    folder = run_dir / results.TELEMETRY
    if not folder.is_dir() or folder.is_symlink():
        return []
    from ddp_cluster.job import plot  # matplotlib, only when there is telemetry to draw

    scanned = plot.scan_telemetry(folder)
    if not scanned:
        return []
    samples = sum(node.samples for node in scanned.values())
    drawn = output_dir(run_dir) / TELEMETRY_PLOT
    # a line needs two samples: with fewer on every node the plot would be an empty frame
    enough = any(node.samples >= 2 for node in scanned.values())
    where = (
        f"drawn: {drawn}"
        if enough
        else "not drawn: fewer than two samples on every node (the job was shorter than telemetry_interval)"
    )
    lines = [f"telemetry: {len(scanned)} node(s), {samples} sample(s): {folder} ({where})"]
    start = min(node.start for node in scanned.values())
    for name, node in sorted(scanned.items()):
        for (index, said), at in sorted(node.problems.items(), key=lambda item: (item[1], item[0])):
            lines.append(
                f"device problem: {name} device {index}: {said}"
                f" (first seen {(at - start) / 60:.1f} min into the job)"
            )
        if node.more_problems:
            lines.append(f"device problem: {name}: {node.more_problems} more sighting(s) of other problems")
        if node.skipped:
            report.warnings.append(
                f"{name}: {node.skipped} line(s) of its telemetry are no record (left out of the plot)"
            )
    found = {name: node.records for name, node in scanned.items()}
    if not enough:
        return lines
    if drawn.is_symlink() or drawn.is_dir():
        report.warnings.append(f"no telemetry plot: {drawn} is a link or a folder (never written through)")
        return lines
    try:
        plot.plot_telemetry(found, drawn, title=f"{run_dir.name}: telemetry")
    except Exception as error:  # no step after the job may fail it: said as a warning
        said_lines = str(error).strip().splitlines()
        report.warnings.append(f"no telemetry plot: {said_lines[-1] if said_lines else repr(error)}")
    return lines


def _failure_lines(
    label: str, run_dir: Path, found: status.Status | None, missing: str = NO_STATUS
) -> list[str]:
    found = found or status.Status(state="failed", reason=missing)
    if found.exit_code is not None:
        exit_line = f"exit code {found.exit_code}"
    elif found.signal_name:
        exit_line = f"signal {found.signal_name}"
    else:
        exit_line = "no exit status"
    leftover = json.dumps(dict(found.leftover)) if found.leftover else "none"
    if found.interrupted:  # stopped from the controller: no cause to look for
        progress = status.describe_progress(found.progress)
        return [
            f"{label}: {found.interrupted}",
            f"where it was: {progress}; ranks left running after the stop: {leftover}",
            f"all logs: {run_dir}",
        ]
    rank = found.failed_rank if found.failed_rank is not None else "unknown"
    lines = [
        f"{label} failed: {found.reason or missing}",
        f"node: {found.failed_node or 'unknown'}, rank: {rank},",
        exit_line,
        f"ranks left running after the stop: {leftover}",
        f"last lines of {found.log_file or 'the log'}:",
        *found.log_tail,
        "",
    ]
    try:
        lines += doctor.render(run_dir, doctor.diagnose(run_dir), DOCTOR_WIDTH).splitlines()
    except OSError as error:
        lines.append(f"ddp-cluster doctor could not read the logs: {error}")
    return [*lines, f"all logs: {run_dir}"]


def _statuses(run_dir: Path, first: str, out: Report) -> tuple[status.Status | None, bool]:
    """The run's status (the first node's, laid out as runs/<id>/status.json) and whether it is there but
    cannot be read; each node's status.json that cannot be read a warning naming the node, and the run's own
    too when it is not one of those."""
    found, problem = status.read_checked(run_dir / status.FILE, settled=True)
    named = set()
    for path in sorted((run_dir / results.NODES).glob(f"*/{status.FILE}")):
        if path.is_symlink() or not path.is_file():
            continue
        said = status.read_checked(path, settled=True)[1]
        if said:
            out.warnings.append(f"{path.parent.name}: {said}")
            named.add(path.parent.name)
    if problem and first not in named:
        out.warnings.append(f"{first or 'the first node'}: {problem}")
    return found, bool(problem)


def report(run_dir: Path) -> Report:
    """The report of a run directory whose plan.json the plan wrote (see the module's text), every line
    shown, never obeyed."""
    out = _report(run_dir)
    out.lines = [visible(line, newlines=False) for line in out.lines]
    out.warnings = [visible(warning, newlines=False) for warning in out.warnings]
    out.failure = visible(out.failure, newlines=False)
    return out


def _report(run_dir: Path) -> Report:
    out = Report()
    try:
        planned = plan.load(run_dir)
    except (OSError, ValueError) as error:
        out.failure = f"{run_dir} has no readable plan.json ({error}): not a run of train.yml or check.yml"
        out.lines.append(out.failure)
        return out
    kind, label = str(planned.get("kind", "train")), f"{planned.get('label', 'job')} {planned.get('id', '?')}"
    nodes = [str(node) for node in planned.get("nodes", [])]
    # a restart may have taken a spare: its results came back too
    came = sorted(path.name.removesuffix(".tar.gz") for path in (run_dir / ".incoming").glob("*.tar.gz"))
    nodes += [node for node in came if node not in nodes]
    # The first node's output is the run's: the node whose supervisor ended the job (the standby that took a
    # lost first node's job over), else the planned first node.
    waited = status.read(run_dir / status.FILE)
    first = (waited.supervisor_node if waited else "") or str(planned.get("first", nodes[0] if nodes else ""))
    if (run_dir / ".incoming").is_dir():
        try:
            torchrun = (
                int(planned["spec"]["nproc_per_node"]) if planned["spec"]["launcher"] != "mpirun" else None
            )
            laid = results.lay_out(run_dir, first, nodes, torchrun)
            out.warnings += [
                f"{node}: no archive came back (its results are missing)" for node in laid.missing
            ]
            out.warnings += laid.warnings
        except (OSError, ValueError, KeyError) as error:
            out.warnings.append(
                f"the results could not be laid out under {run_dir}: {str(error)[:300]} (the archives of the"
                f" nodes are in {run_dir}/.incoming)"
            )
    found, unreadable = _statuses(run_dir, first, out)
    missing = UNREADABLE_STATUS if unreadable else NO_STATUS
    succeeded = found is not None and found.succeeded
    restarts = [status.describe_restart(record) for record in (found.restarts if found else ())]
    if restarts:
        most = found.max_restarts if found else 0
        out.lines += [f"{label}: {len(restarts)} restart(s) of max_restarts={most}:"]
        out.lines += [f"  {line}" for line in restarts]
    watched = _telemetry(run_dir, out)
    if kind == "train":
        _plot(run_dir, out, wanted=succeeded)
        if succeeded:
            summary = _summary(run_dir, out)
            resumed = planned.get("resume_checkpoint")
            gate = (
                f"health gate: passed before the job, {output_dir(run_dir) / health.HEALTH_FILE}"
                if planned.get("preflight")
                else "health gate: not run (-e preflight=true runs it first)"
            )
            last = list(found.nodes) if found and found.nodes else nodes
            out.lines += [
                f"{label}: succeeded in {found.elapsed if found else '?'} s",
                f"nodes: {', '.join(last)}; ranks: {planned['spec']['nproc_per_node'] * len(last)}"
                f" ({planned['spec']['launcher']})",
                f"final loss: {_figure(summary, 'final_loss', '%.4g')};"
                f" accuracy: {_figure(summary, 'accuracy', '%.4f')}",
                f"samples/s: {_figure(summary, 'samples_per_s', '%.0f')}; training seconds:"
                f" {_figure(summary, 'seconds', '%.2f')}",
                f"resumed from {resumed}" if resumed else "started fresh",
                gate,
                f"results: {run_dir} (the job's output: {output_dir(run_dir)})",
                *watched,
            ]
            return out
    elif succeeded:
        out.lines += watched
        return _gate(run_dir, label, kind, out)
    out.lines += [*_failure_lines(label, run_dir, found, missing), *watched]
    if found is not None and found.interrupted.startswith(STOPPED_BY_JOBS):
        out.lines.append(f"{label}: stopped as asked ({found.interrupted}); what there was: {run_dir}")
        return out
    if found is not None and found.interrupted:
        out.failure = f"{label}: {found.interrupted}; what there was is in {run_dir}"
        return out
    out.failure = (
        f"{label} failed: {found.reason if found and found.reason else missing}"
        f" (node {found.failed_node if found and found.failed_node else 'unknown'});"
        f" the report above names the likely cause; all logs: {run_dir}"
    )
    return out


def _gate(run_dir: Path, label: str, kind: str, out: Report) -> Report:
    not_started = "; the job was not started" if kind == "preflight" else ""
    results_file = output_dir(run_dir) / health.HEALTH_FILE
    try:
        found = health.load(results_file)
    except ValueError as error:
        out.failure = f"{label} failed: {error}{not_started}"
        out.lines.append(out.failure)
        return out
    out.lines += [*health.render(found).splitlines(), f"results: {results_file}"]
    if kind == "preflight":  # kept as the job's, in its output (the job's own output is laid out over it)
        kept = output_dir(run_dir.parent) / health.HEALTH_FILE
        kept.parent.mkdir(exist_ok=True)
        kept.unlink(missing_ok=True)
        shutil.copyfile(results_file, kept)
    verdict = found.get("verdict", {})
    if verdict.get("passed"):
        out.gate_passed = True
        return out
    problems = "; ".join(str(problem) for problem in verdict.get("problems", [])) or "the verdict is failed"
    out.failure = f"{label} failed: {problems}{not_started}; the report above has the figures: {results_file}"
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ddp-cluster report",
        description="Lay out a run's results and print its report (summary, health gate, failure, likely"
        " cause); exit 1 when the job or the gate failed.",
    )
    parser.add_argument(
        "run_dir", type=Path, help="a run directory, runs/<job-id>/ (or runs/<job-id>/preflight)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(None if argv is None else list(argv))
    if not args.run_dir.is_dir():
        print(f"ddp-cluster report: {args.run_dir} is not a directory: give runs/<job-id>/", file=sys.stderr)
        return 2
    try:
        plan.load(args.run_dir)
    except (OSError, ValueError):  # a directory, but not a run: bad input, not a failed job
        said = visible(str(args.run_dir), newlines=False)
        print(f"ddp-cluster report: {said} holds no readable plan.json: give runs/<job-id>/", file=sys.stderr)
        return 2
    done = report(args.run_dir)
    if args.json:
        print(json.dumps({**done.__dict__, "exit_status": done.exit_status}, indent=2))
    else:
        for warning in done.warnings:
            print(f"[WARNING] {warning}")
        print("\n".join(done.lines))
        if done.failure:
            print(done.failure, file=sys.stderr)
    return done.exit_status
