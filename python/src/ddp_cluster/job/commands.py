"""Short job commands on the controller, as ``squeue``/``scancel``/``sky logs`` are short: each one runs the
playbook that does the work (``jobs.yml`` or ``train.yml``), with the same behaviour, output and exit status.

    ddp-cluster jobs                          ansible-playbook jobs.yml
    ddp-cluster logs ID [-f] [-n N] [--rank R] [--node NODE]
                                              ansible-playbook jobs.yml -e logs=ID [-e follow=true ...]
    ddp-cluster stop ID                       ansible-playbook jobs.yml -e stop=ID
    ddp-cluster sync ID                       ansible-playbook jobs.yml -e sync=ID
    ddp-cluster drain NODE --reason TEXT      ansible-playbook jobs.yml -e drain=NODE -e reason=TEXT
    ddp-cluster undrain NODE                  ansible-playbook jobs.yml -e undrain=NODE
    ddp-cluster attach ID                     ansible-playbook train.yml -e attach=ID
    ddp-cluster submit [-N NODES] [--detach] [--check] [-e NAME=VALUE ...] [SCRIPT [ARGS ...]]
                                              ansible-playbook train.yml -e nodes=NODES ...

Every command takes ``-i INVENTORY`` (else ``ansible.cfg``'s) and ``--print`` (say the command, run nothing).
The playbooks are found in the ddp-cluster checkout that holds the current directory, else in
``$DDP_CLUSTER_HOME``. The playbook replaces this process, so Ctrl-C, the output and the exit status are the
playbook's own. ``ddp-cluster completion`` prints a bash completion script (``source <(ddp-cluster
completion)``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

HOME_VARIABLE = "DDP_CLUSTER_HOME"
# the commands, in the order ``ddp-cluster --help`` lists them, with their one line
JOB_COMMANDS = {
    "jobs": "list the jobs (queued, running, ended) and every node's state",
    "submit": "start a job (train.yml): ddp-cluster submit -N 2 [SCRIPT [ARGS...]]",
    "logs": "every rank's log of a job, [NODE rank R] lines; -f follows",
    "stop": "stop a job (a queued one is cancelled) and collect it",
    "attach": "follow a job to its end and collect it",
    "sync": "bring runs/ID/ up to date while the job runs",
    "drain": "keep a node out of the next jobs: ddp-cluster drain NODE --reason TEXT",
    "undrain": "give a drained node back",
    "completion": "print a bash completion script: source <(ddp-cluster completion)",
}
PLAYBOOKS = ("jobs.yml", "train.yml")


class CommandError(Exception):
    """Input the command cannot run with: one line, exit 2."""


def checkout(start: Path, environ: Mapping[str, str]) -> Path:
    """The checkout that holds START (its jobs.yml, train.yml, ansible.cfg), else $DDP_CLUSTER_HOME."""
    for folder in (start, *start.parents):
        if all((folder / name).is_file() for name in (*PLAYBOOKS, "ansible.cfg")):
            return folder
    home = environ.get(HOME_VARIABLE, "")
    if home:
        folder = Path(home).expanduser()
        if all((folder / name).is_file() for name in PLAYBOOKS):
            return folder
        raise CommandError(f"{HOME_VARIABLE}={home} holds no jobs.yml and train.yml: set it to the checkout")
    raise CommandError(
        f"{start} is not inside a ddp-cluster checkout (no jobs.yml, train.yml and ansible.cfg above it): "
        f"run the command there, or set {HOME_VARIABLE} to the checkout"
    )


def ansible_playbook() -> str:
    """ansible-playbook beside this Python (the project's virtualenv), else on PATH."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("ansible-playbook")
    if not found:
        raise CommandError(
            "ansible-playbook is not installed here: run `make venv` in the checkout (.venv/bin/ddp-cluster)"
        )
    return found


def extra(name: str, value: object) -> list[str]:
    """``-e NAME=VALUE``; JSON where the value holds a space or a quote (Ansible splits NAME=VALUE there)."""
    text = str(value)
    if text and not any(c.isspace() or c in "'\"\\=" for c in text):
        return ["-e", f"{name}={text}"]
    return ["-e", json.dumps({name: text})]


def named_extra(text: str) -> list[str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not name.replace("_", "a").isalnum():
        raise CommandError(f"-e {text!r} is not NAME=VALUE (e.g. -e max_restarts=1)")
    return extra(name.strip(), value)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="ddp-cluster",
        description="Short job commands: each runs jobs.yml or train.yml, with its output and exit status.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-i", "--inventory", help="the inventory (default: ansible.cfg's)")
    common.add_argument("--print", action="store_true", dest="dry", help="print the command, run nothing")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("jobs", parents=[common], help=JOB_COMMANDS["jobs"])
    logs = sub.add_parser("logs", parents=[common], help=JOB_COMMANDS["logs"])
    logs.add_argument("job")
    logs.add_argument("-f", "--follow", action="store_true", help="follow the log as it grows (Ctrl-C ends)")
    logs.add_argument("-n", "--tail", type=int, metavar="N", help="the last N lines (default 20)")
    logs.add_argument("--rank", type=int, help="only this rank")
    logs.add_argument("--node", help="only this node")
    for name in ("stop", "sync", "attach"):
        sub.add_parser(name, parents=[common], help=JOB_COMMANDS[name]).add_argument("job")
    drain = sub.add_parser("drain", parents=[common], help=JOB_COMMANDS["drain"])
    drain.add_argument("node")
    drain.add_argument("--reason", required=True, help="why (kept with the node's state in Slurm)")
    sub.add_parser("undrain", parents=[common], help=JOB_COMMANDS["undrain"]).add_argument("node")
    submit = sub.add_parser(
        "submit",
        parents=[common],
        help=JOB_COMMANDS["submit"],
        description="Start a job: train.yml with these settings. Without SCRIPT, the package's entrypoint.",
    )
    submit.add_argument("-N", "--nodes", type=int, help="how many nodes (default: train.yml's)")
    submit.add_argument("--job-id", help="the job's id (default: made up)")
    submit.add_argument("--detach", action="store_true", help="return once every rank runs")
    submit.add_argument(
        "--check", action="store_true", help="a dry run: plan the job and check its nodes, start nothing"
    )
    submit.add_argument(
        "-e",
        dest="extras",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other train.yml setting (docs/jobs.md), repeatable: -e max_restarts=1 -e exclude=node0",
    )
    submit.add_argument(
        "script", nargs="?", help="your training script (default: python -m ddp_cluster.train)"
    )
    submit.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    sub.add_parser("completion", help=JOB_COMMANDS["completion"])
    return top


def command(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The playbook and its extra-var arguments for parsed ARGS."""
    name = args.command
    if name == "jobs":
        return "jobs.yml", []
    if name == "logs":
        more = extra("logs", args.job)
        for option in ("tail", "rank", "node"):
            if getattr(args, option) is not None:
                more += extra(option, getattr(args, option))
        return "jobs.yml", more + (extra("follow", "true") if args.follow else [])
    if name in ("stop", "sync"):
        return "jobs.yml", extra(name, args.job)
    if name == "attach":
        return "train.yml", extra("attach", args.job)
    if name == "drain":
        return "jobs.yml", extra("drain", args.node) + extra("reason", args.reason)
    if name == "undrain":
        return "jobs.yml", extra("undrain", args.node)
    more = []
    if args.nodes is not None:
        more += extra("nodes", args.nodes)
    if args.job_id:
        more += extra("job_id", args.job_id)
    if args.detach:
        more += extra("detach", "true")
    if args.script:
        more += extra("script", here(args.script))
    if args.args:
        more += extra("script_args", shlex.join(args.args))
    for text in args.extras:
        more += named_extra(text)
    return "train.yml", more + (["--check"] if args.check else [])


COMPLETION = """# bash completion for ddp-cluster: source <(ddp-cluster completion)
_ddp_cluster() {
  local cur=${COMP_WORDS[COMP_CWORD]}
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "%(commands)s" -- "$cur"))
  elif [ "$COMP_CWORD" -eq 2 ] && [[ " logs stop sync attach doctor " == *" ${COMP_WORDS[1]} "* ]]; then
    COMPREPLY=($(compgen -W "$(ls runs 2>/dev/null)" -- "$cur"))  # the job ids collected here
  else
    COMPREPLY=($(compgen -f -- "$cur"))
  fi
}
complete -F _ddp_cluster ddp-cluster
"""


def here(path: str | None) -> str | None:
    """PATH as the user meant it from the current directory (the playbook runs in the checkout)."""
    if path and not Path(path).is_absolute() and Path(path).exists():
        return str(Path(path).resolve())
    return path


def main(
    argv: Sequence[str] | None = None,
    run: Callable[[str, list[str]], None] | None = None,
    tools: Sequence[str] = (),
) -> int:
    """Parse ARGV, then hand the process to ansible-playbook (RUN: os.execv, or a stand-in in tests); TOOLS:
    ddp-cluster's other commands, for the completion."""
    args = parser().parse_args(argv)
    if args.command == "completion":
        print(COMPLETION % {"commands": " ".join([*JOB_COMMANDS, *tools])}, end="")
        return 0
    try:
        root = checkout(Path.cwd(), os.environ)
        playbook, more = command(args)
        program = ansible_playbook() if not args.dry else "ansible-playbook"
    except CommandError as error:
        print(f"ddp-cluster {args.command}: {error}", file=sys.stderr)
        return 2
    inventory = here(args.inventory)
    argv_out = [program, *(["-i", inventory] if inventory else []), playbook, *more]
    if args.dry:
        print(shlex.join(argv_out))
        return 0
    os.chdir(root)
    sys.stdout.flush()
    (run or os.execv)(argv_out[0], argv_out)
    return 0
