"""The ``ddp-cluster`` command: one subcommand per tool, each module owning its own arguments.

Every tool's entry function has one shape, ``main(argv: Sequence[str] | None = None) -> int`` (its exit
status), whether ``ddp-cluster SUBCOMMAND`` or ``python -m MODULE`` calls it. Subcommands are imported
lazily, so a controller without torch can run every one of them.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence

# subcommand -> (module, one-line help); the module's entry function is ``main``
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "plot": (
        "ddp_cluster.job.plot",
        "draw the loss curve of a run (runs/<id>/output/metrics.jsonl) to a PNG",
    ),
    "ip-plan": ("ddp_cluster.ascend.ipplan", "check an NPU device-IP plan against the product's rules"),
    "rank-table": (
        "ddp_cluster.ascend.ranktable",
        "print the HCCL rank table (version 1.0) of an IP plan",
    ),
    "report": (
        "ddp_cluster.job.report",
        "lay out a run's results and print its report (summary, gate, failure, likely cause)",
    ),
    "doctor": (
        "ddp_cluster.job.doctor",
        "name the likely cause of a failed job from its logs (runs/<job-id>/)",
    ),
    "health": (
        "ddp_cluster.health.judge",
        "print a health gate's results (runs/<id>/output/health.json); exit 1 if it failed",
    ),
    "workdir": (
        "ddp_cluster.job.workdir",
        "pack a project directory for every node of a job (train.yml -e workdir)",
    ),
    "hccn": (
        "ddp_cluster.ascend.cli",
        "what hccn_network would set on this server's NPU NICs (diff), or their health",
    ),
}


def entry(module_name: str) -> Callable[[Sequence[str]], int]:
    """The entry function of a subcommand's module."""
    module = importlib.import_module(module_name)
    found: Callable[[Sequence[str]], int] = module.main
    return found


def usage() -> str:
    from ddp_cluster.job.commands import JOB_COMMANDS

    lines = ["usage: ddp-cluster COMMAND [ARGS...]", "", "job commands (each runs jobs.yml or train.yml):"]
    lines += [f"  {name:<12} {help_text}" for name, help_text in JOB_COMMANDS.items()]
    lines += ["", "tools:"]
    lines += [f"  {name:<12} {help_text}" for name, (_, help_text) in SUBCOMMANDS.items()]
    lines += ["", "training runs as: python -m ddp_cluster.train --help"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    from ddp_cluster.job import commands

    if name in commands.JOB_COMMANDS:
        return commands.main([name, *rest], tools=list(SUBCOMMANDS))
    if name not in SUBCOMMANDS:
        print(f"ddp-cluster: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        result: int = entry(SUBCOMMANDS[name][0])(rest)
        sys.stdout.flush()
    except BrokenPipeError:  # `ddp-cluster doctor RUN | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    return result


if __name__ == "__main__":
    raise SystemExit(main())
