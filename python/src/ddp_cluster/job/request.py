"""A job's request: the ``ddp_job`` role's variables (train.yml's extra vars through the role's defaults),
checked against the role's ``meta/argument_specs.yml``, the one declaration of each setting's type, choices
and default.

:func:`with_defaults` fills what the request leaves out from argument_specs' defaults, :func:`check_request`
checks every value against its option's type and choices, and each problem names what the user sets
(:func:`user_name`: the extra var, or the role's variable). The rules between values, and those argument_specs
cannot state (a number's range), are the plan's (:mod:`ddp_cluster.job.plan`).

Standard library only.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.inventory import envnames
from ddp_cluster.job import node_jobs

PREFIX = "ddp_job_"
# The extra var a user types for each of the role's variables (ddp_job_<name>: what its default in
# defaults/main.yml reads); the others are named in full. tests/unit/test_settings.py holds them equal.
USER_NAMES = {
    "nodes": "nodes",
    "launcher": "launcher",
    "device": "device",
    "script": "script",
    "workdir": "workdir",
    "script_args": "script_args",
    "resume": "resume",
    "resume_from": "resume_from",
    "timeout": "job_timeout",
    "id": "job_id",
    "preflight": "preflight",
    "hccl_init": "cluster_hccl_init",
    "nproc_per_node": "cluster_nproc_per_node",
    "master_port": "cluster_master_port",
    "launcher_ports": "cluster_launcher_ports",
    "max_restarts": "max_restarts",
    "min_nodes": "min_nodes",
    "detach": "detach",
    "attach": "attach",
    "wait_for_nodes": "wait",
    "nodelist": "nodelist",
    "exclude": "exclude",
    "partition": "partition",
    "qos": "qos",
    "queue_timeout": "queue_timeout",
    "checkpoint_replicas": "checkpoint_replicas",
    "checkpoint_dir": "checkpoint_dir",
    "liveness_timeout": "liveness_timeout",
    "stall_timeout": "stall_timeout",
    "stall_start_timeout": "stall_start_timeout",
    "stop_grace": "stop_grace",
    "telemetry_interval": "telemetry_interval",
    "results_max_gb": "results_max_gb",
    "secret_env": "secret_env",
    "workdir_follow_links": "workdir_follow_links",
}
FLAGS = ("true", "false", "yes", "no", "1", "0")
# How alike an unknown extra var must be to a known one to be taken for its typo (difflib's ratio).
TYPO_CUTOFF = 0.75
NUMBER = re.compile(r"^[0-9]+([.][0-9]+)?$")
WHOLE = re.compile(r"^[0-9]+$")
HEALTH_SETTINGS = (
    "fraction",
    "floor_gbps",
    "min_bytes",
    "max_bytes",
    "factor",
    "seconds_per_size",
    "timeout",
)
# The options of the package's entrypoint (python -m ddp_cluster.train) that the launcher sets itself
# (JobSpec.program), and what a user sets instead. argparse takes any unambiguous prefix (--out, --res).
LAUNCHER_OWNED = {
    "--output-dir": "the launcher sets it to the job's output directory, collected into runs/ID/output/ on"
    " the controller: remove it (a script of your own reads $DDP_JOB_DIR/output)",
    "--resume": "the launcher sets it: resume with -e resume=true (the newest checkpoint) or"
    " -e resume_from=JOB_ID",
}


class PlanError(DdpClusterError, ValueError):
    """What is wrong with the request, every problem named; nothing was started or written."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = [str(problem).rstrip(".") for problem in problems]
        super().__init__("; ".join(self.problems) + ".")


def user_name(name: str) -> str:
    """The name a user sets for the role's variable ``name`` (without ddp_job_): the extra var, or the
    variable."""
    return USER_NAMES.get(name, PREFIX + name)


def option_defaults(options: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The defaults argument_specs states, by name without ddp_job_ (an option taken from a cluster setting
    states none: the cluster role's argument_specs has it)."""
    return {
        option.removeprefix(PREFIX): spec["default"] for option, spec in options.items() if "default" in spec
    }


def with_defaults(request: Mapping[str, Any], options: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The request, with argument_specs' default for each option it leaves out."""
    return option_defaults(options) | dict(request)


def _choices(values: Sequence[Any]) -> str:
    shown = [str(value) for value in values]
    return ", ".join(shown[:-1]) + " or " + shown[-1] if len(shown) > 1 else shown[0]


def check_request(request: Mapping[str, Any], options: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The request's values against the role's argument_specs options (``ddp_job_<name>``: type, choices):
    one problem per value that does not fit, naming what the user sets. ``raw`` options are checked by the
    plan, but for two rules of one value each: env's names are shell names, and a training job's
    script_args leave the entrypoint's launcher its own options (:data:`LAUNCHER_OWNED`)."""
    problems = []
    for option, spec in options.items():
        name = option.removeprefix(PREFIX)
        if name not in request:
            continue
        value, kind, shown = request[name], spec.get("type", "str"), user_name(name)
        if spec.get("choices") and value not in spec["choices"]:
            problems.append(f"{shown}={value} must be {_choices(spec['choices'])}")
        elif kind == "list" and (isinstance(value, str) or not isinstance(value, Sequence)):
            problems.append(f"{shown} must be a list, not {value!r}")
        elif kind == "dict" and not isinstance(value, Mapping):
            problems.append(f"{shown} must be a mapping of names to values, not {value!r}")
        elif kind in ("int", "float") and not NUMBER.match(str(value).strip()):
            problems.append(f"{shown}={value} must be a {'whole ' if kind == 'int' else ''}number")
        elif kind == "int" and not WHOLE.match(str(value).strip()):
            problems.append(f"{shown}={value} must be a whole number")
        elif kind in ("str", "path") and not isinstance(value, str | int | float):
            problems.append(f"{shown} must be a string, not {value!r}")
    if isinstance(request.get("env"), Mapping):
        problems += envnames.name_problems(request["env"], user_name("env"))
    return problems + id_problems(request) + launcher_owned_problems(request)


def role_settings(roles: Path) -> set[str]:
    """Every setting a role of ROLES declares (each entry point's options in its meta/argument_specs.yml): the
    inventory's settings, which a command line may give any playbook (``-e cluster_ssh_port=2222``)."""
    import yaml  # the controller's (Ansible's dependency)

    names: set[str] = set()
    for specs in sorted(roles.glob("*/meta/argument_specs.yml")):
        data = yaml.safe_load(specs.read_text(encoding="utf-8")) or {}
        for entry in (data.get("argument_specs") or {}).values():
            names.update((entry or {}).get("options") or {})
    return names


def misspelled(given: Iterable[str], known: Collection[str], playbook: str) -> list[str]:
    """The extra vars in GIVEN (the command line's ``-e`` names) that PLAYBOOK does not know but that are
    close to one it does (``-e node=2``, ``-e max_restart=1``): each a problem naming the one meant. Ansible
    would take them without a word and the job would run without them. A name close to none is left alone
    (the inventory's own variables may be given too)."""
    problems = []
    for name in sorted(set(given) - set(known)):
        if name.startswith("ansible_"):
            continue
        if close := difflib.get_close_matches(name, sorted(known), n=1, cutoff=TYPO_CUTOFF):
            problems.append(
                f"-e {name}: {playbook} has no setting {name!r}; did you mean -e {close[0]}=...? (a setting"
                " it does not know would be ignored)"
            )
    return problems


def id_problems(request: Mapping[str, Any]) -> list[str]:
    """The job id the request names (job_id, attach), checked whole and for its length
    (:func:`ddp_cluster.job.node_jobs.id_problem`); empty: none asked (one is made)."""
    problems = []
    for name in ("id", "attach"):
        value = request.get(name)
        if value not in (None, "") and (problem := node_jobs.id_problem(value, user_name(name))):
            problems.append(problem)
    return problems


def owned_option(argument: str) -> str:
    """The entrypoint option the launcher owns that ``argument`` sets (``--output-dir``, ``--out=X``,
    ``--resume``), '' when none."""
    name = argument.split("=", 1)[0]
    if len(name) < 3 or not name.startswith("--"):
        return ""
    return next((option for option in LAUNCHER_OWNED if option.startswith(name)), "")


def launcher_owned_problems(request: Mapping[str, Any]) -> list[str]:
    """The entrypoint's options that a training job's script_args set although the launcher owns them (a
    script of the user's own owns all its options)."""
    if request.get("kind", "train") != "train" or request.get("script") or "script_args" not in request:
        return []
    try:
        args = split_args(request["script_args"])
    except PlanError:  # the plan's own split names it
        return []
    owned: dict[str, str] = {}  # option -> the first argument that sets it
    for argument in args:
        if argument == "--":  # what follows is no option
            break
        if (option := owned_option(argument)) and option not in owned:
            owned[option] = argument
    return [
        f"script_args sets {option}{f' ({argument})' if argument != option else ''}, which the entrypoint's"
        f" launcher owns: {LAUNCHER_OWNED[option]}"
        for option, argument in owned.items()
    ]


def whole_number(value: Any, name: str, minimum: int = 1) -> tuple[int | None, str]:
    """A ``raw`` option read as a whole number of at least ``minimum``: (the number, '') or (None, the
    problem)."""
    text = str(value).strip()
    if isinstance(value, bool) or not WHOLE.match(text) or int(text) < minimum:
        return (
            None,
            f"{user_name(name)}={value} must be a whole number{' of seconds above 0' if minimum else ''}",
        )
    return int(text), ""


def flag(value: Any, name: str, problems: list[str]) -> bool:
    """A ``raw`` option read as Ansible reads a boolean; a value that is none adds a problem."""
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() not in FLAGS:
        problems.append(f"{user_name(name)}={value} must be true or false")
        return False
    return str(value).strip().lower() in ("true", "yes", "1")


def split_args(value: Any) -> list[str]:
    """A script's arguments as a list: a list stays, a string is split the way a shell would."""
    if value is None or value == "":
        return []
    if isinstance(value, list | tuple):
        return [str(part) for part in value]
    try:
        return shlex.split(str(value))
    except ValueError as error:
        raise PlanError([f"script_args={value!r} cannot be split like a shell would: {error}"]) from None


def health_args(request: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The gate's arguments from the ddp_job_health_* settings, and the problems with their ranges (their
    types are argument_specs', checked by :func:`check_request`)."""
    text = {name: str(request.get(f"health_{name}", "")).strip() for name in HEALTH_SETTINGS}
    value = {name: float(shown) for name, shown in text.items() if NUMBER.match(shown)}
    rules = {
        "fraction": (
            0 < value.get("fraction", 1) <= 1,
            "a number above 0 and at most 1 (0.5: half the median)",
        ),
        "min_bytes": (value.get("min_bytes", 4) >= 4, "a whole number of bytes, 4 or more"),
        "max_bytes": (
            value.get("max_bytes", 4) >= value.get("min_bytes", 4),
            f"at least ddp_job_health_min_bytes={text['min_bytes']}",
        ),
        "factor": (value.get("factor", 2) >= 2, "a whole number of 2 or more"),
        "seconds_per_size": (value.get("seconds_per_size", 1) > 0, "a number of seconds above 0"),
        "timeout": (value.get("timeout", 1) > 0, "a whole number of seconds above 0"),
    }
    problems = [
        f"ddp_job_health_{name}={text[name]} must be {rule}" for name, (ok, rule) in rules.items() if not ok
    ]
    ignore = request.get("health_ignore") or []
    args = ["--min-bytes", text["min_bytes"], "--max-bytes", text["max_bytes"], "--factor", text["factor"]]
    args += ["--seconds-per-size", text["seconds_per_size"], "--fraction", text["fraction"]]
    args += ["--floor-gbps", text["floor_gbps"]]
    if ignore and isinstance(ignore, list | tuple):
        args += ["--ignore", ",".join(str(item) for item in ignore)]
    return args, problems
