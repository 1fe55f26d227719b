"""A job's secrets: the variables a user names with ``train.yml -e secret_env=NAME,NAME``, whose values come
from the controller's environment, never from a command line or a file the controller keeps.

The plan checks the names (:func:`name_problems`: shell names, none that the launcher sets or that
``ddp_job_env`` sets too) and that each is set on the controller (:func:`missing`); plan.json and job.json
hold the names only. The start reads the values again (:func:`values`) and puts them in one file on the first
node, ``JOB/secrets.json`` (:data:`FILE`, mode 0600, in a job directory of mode 0700); the supervisor gives it
to every other node with the job's files, and each rank's wrapper (:mod:`ddp_cluster.runtime.secrets`) reads
it into its environment. What the supervisor writes from a rank's output (status.json's log tails and
progress) has every value of :data:`MIN_MASKED` characters or more replaced by :data:`MASK` (:func:`mask`,
:func:`mask_all`): a shorter one would mask ordinary words. A value that spans lines is also masked line by
line (logs are read and shown by the line), and :func:`forms` gives the byte strings a node masks in files
(each value and its JSON-escaped form), whatever else the file holds (a NUL byte does not make a log binary).

The values together are at most :data:`MAX_BYTES` as ``secrets.json`` holds them (:func:`values` refuses
more, naming the largest): every node that masks reads the file whole, within its bound (``server.pack``
and ``supervisor.sync`` read up to 1 MiB), so no node ever meets a secrets file too large to mask with.

Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddp_cluster.errors import DdpClusterError

FILE = "secrets.json"
MASK = "***"
MIN_MASKED = 4
# secrets.json's largest size: far below what each node's masking reads of it (1 MiB), far above a token.
MAX_BYTES = 64 << 10
SHELL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What the launcher, the rank wrapper or torchrun set in a rank's environment: a secret may not replace it.
# The job's own DDP_* variables and those of MPI, torchrun and Slurm are refused by prefix.
LAUNCHER_NAMES = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "NODE_RANK",
        "PATH",
        "PYTHONUNBUFFERED",
        "RANK_TABLE_FILE",
        "ASCEND_PROCESS_LOG_PATH",
        "TORCH_DEVICE_BACKEND_AUTOLOAD",
    }
)
LAUNCHER_PREFIXES = ("DDP_", "OMPI_", "PMIX_", "TORCHELASTIC_", "SLURM_")


class SecretError(DdpClusterError, ValueError):
    """A secret that cannot be used (a bad name, a value the controller's environment lacks); the message
    names it."""


def parse_names(value: Any) -> tuple[list[str], list[str]]:
    """``secret_env`` as names: a list, or a string of names separated by commas (blanks around them
    dropped); (the names, the problems with the value's form)."""
    if value is None or value == "":
        return [], []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()], []
    if isinstance(value, Sequence) and all(isinstance(item, str) for item in value):
        return [str(item).strip() for item in value if str(item).strip()], []
    return [], [f"secret_env={value!r} must be names of variables, a list or a comma-separated string"]


def launcher_owns(name: str, owned: Iterable[str] = ()) -> bool:
    """Whether the launcher (or the rank wrapper, torchrun, MPI) sets ``name``; ``owned``: what this job's
    launcher sets besides (:meth:`ddp_cluster.job.spec.JobSpec.variables`)."""
    return name in LAUNCHER_NAMES or name in set(owned) or name.startswith(LAUNCHER_PREFIXES)


def name_problems(names: Sequence[str], env: Iterable[str] = (), owned: Iterable[str] = ()) -> list[str]:
    """One problem per name that cannot carry a secret: not a shell name, named twice, set by the launcher,
    or also a key of ``env`` (``ddp_job_env``)."""
    problems = []
    env_names, owned_names = set(env), set(owned)
    for index, name in enumerate(names):
        if not SHELL_NAME.match(name):
            problems.append(
                f"secret_env: {name!r} is not a variable name (letters, digits and _, not a digit first)"
            )
        elif name in names[:index]:
            problems.append(f"secret_env names {name} twice")
        elif launcher_owns(name, owned_names):
            problems.append(
                f"secret_env: {name} is set by the job's launcher; give the secret another name (the launcher"
                f" owns {', '.join(sorted(LAUNCHER_NAMES))} and names starting"
                f" {', '.join(LAUNCHER_PREFIXES)})"
            )
        elif name in env_names:
            problems.append(
                f"secret_env: {name} is also a key of ddp_job_env; a variable comes from one of them"
            )
    return problems


def missing(names: Iterable[str], environ: Mapping[str, str]) -> list[str]:
    """The names whose value the controller's environment ``environ`` lacks (unset or empty)."""
    return [name for name in names if not environ.get(name)]


def missing_message(names: Sequence[str]) -> str:
    shown = ", ".join(names)
    return (
        f"secret_env names {shown} but the controller's environment has no value for"
        f" {'it' if len(names) == 1 else 'them'}: export {names[0]}=... in the shell that runs"
        " ansible-playbook (the value never goes on a command line)"
    )


def values(names: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """Each name's value in ``environ`` (the controller's environment at the start); SecretError naming
    those it lacks."""
    if absent := missing(names, environ):
        raise SecretError(missing_message(absent))
    found = {name: environ[name] for name in names}
    if len(dumps(found)) > MAX_BYTES:
        largest = max(found, key=lambda name: len(found[name]))
        raise SecretError(
            f"secret_env: the values of {', '.join(names)} come to {len(dumps(found))} bytes, more than the"
            f" {MAX_BYTES} a job's secrets may hold ({largest} alone is {len(found[largest])} characters):"
            " secret_env is for tokens and passwords; put a larger secret (a key file) where the job reads it"
            " (a node_container_volumes mount) and pass its path"
        )
    return found


def dumps(secrets: Mapping[str, str]) -> bytes:
    """``JOB/secrets.json``'s content."""
    return (json.dumps(dict(secrets), sort_keys=True) + "\n").encode()


def read(job_dir: Path) -> dict[str, str]:
    """The secrets in ``job_dir``/secrets.json, {} when there is none (or it cannot be read: the supervisor
    then masks nothing, and the ranks, whose wrapper names the problem, fail)."""
    try:
        with open(job_dir / FILE, "rb") as handle:
            data = json.loads(handle.read(MAX_BYTES + 1).decode("utf-8"))
    except (OSError, ValueError):  # a file cut at the bound does not parse either
        return {}
    if not isinstance(data, Mapping):
        return {}
    return {str(name): str(value) for name, value in data.items()}


def maskable(secrets: Iterable[str]) -> list[str]:
    """The values to mask, longest first (a value that holds another is masked whole); a value of several
    lines also each of its lines (a log shows it line by line)."""
    found = set()
    for value in secrets:
        found.add(value)
        if "\n" in value or "\r" in value:
            found.update(value.splitlines())
    return sorted({value for value in found if len(value) >= MIN_MASKED}, key=len, reverse=True)


def forms(secrets: Iterable[str]) -> list[bytes]:
    """The byte strings a node masks in a job's files and logs: each value (and each of its lines) and its
    JSON-escaped form (status.json quotes a rank's lines), UTF-8, longest first."""
    values = maskable(secrets)
    return sorted(
        {form.encode() for value in values for form in (value, json.dumps(value)[1:-1])},
        key=len,
        reverse=True,
    )


def mask(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every value of ``secrets`` of MIN_MASKED characters or more replaced by MASK."""
    for value in maskable(secrets):
        text = text.replace(value, MASK)
    return text


def mask_all(data: Any, secrets: Sequence[str]) -> Any:
    """``data`` (strings, lists, mappings, as a status holds them) with every string masked; other values as
    they are."""
    if not secrets:
        return data
    if isinstance(data, str):
        return mask(data, secrets)
    if isinstance(data, Mapping):
        return {key: mask_all(value, secrets) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return type(data)(mask_all(item, secrets) for item in data)
    return data


def for_start(plan: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    """The secrets a start of ``plan`` (its facts, as plan.json holds them) delivers: the values of its spec's
    secret_env in ``environ``; none when the plan attaches to a job that runs (nothing starts). SecretError
    naming a value ``environ`` lacks."""
    if plan.get("attach"):
        return {}
    spec = plan.get("spec")
    names = (spec.get("secret_env") or []) if isinstance(spec, Mapping) else []
    return values([str(name) for name in names], environ)
