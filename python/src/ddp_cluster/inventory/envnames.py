"""Names of environment variables a setting exports: each must be a shell name.

The node's environment file (node.env, sourced by every shell and job of the node) writes
``export NAME=VALUE`` for each entry of ``node_container_env`` (and ``_append``, ``_prepend``), and a job's
``ddp_job_env`` reaches every rank as ``NAME=VALUE``. The values are quoted, the names cannot be: a name that
is not a shell name (``NCCL-DEBUG``) breaks every shell of the node, one like ``X=1;cmd;Y`` runs ``cmd`` in
each. So a name is checked before anything is written.

Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_shell_name(name: object) -> bool:
    """Whether ``name`` is a shell variable's name: a letter or _, then letters, digits or _."""
    return isinstance(name, str) and SHELL_NAME.fullmatch(name) is not None


def suggested(name: object) -> str:
    """A shell name close to ``name`` (every other character as _), for the message."""
    text = re.sub(r"[^A-Za-z0-9_]", "_", str(name)) or "_"
    return text if not text[0].isdigit() else "_" + text


def name_problems(variables: Any, setting: str) -> list[str]:
    """One problem per name of ``variables`` (the value of ``setting``, a mapping of names to values) that
    is not a shell name, each naming the setting, the name and a fix; one when it is not a mapping. None or
    an empty value has none."""
    if variables is None or variables == "":
        return []
    if not isinstance(variables, Mapping):
        return [f"{setting} must map variable names to values, not {variables!r}"]
    return [
        f"{setting}: {str(name)!r} is not a variable name (a letter or _, then letters, digits or _):"
        f" rename it, e.g. {suggested(name)}"
        for name in variables
        if not is_shell_name(name)
    ]


def check_names(settings: Mapping[str, Any]) -> str:
    """The problems of several settings (setting name -> its mapping of variables) as one message, '' when
    every name is a shell name."""
    problems = [problem for setting, value in settings.items() for problem in name_problems(value, setting)]
    return "; ".join(problems) + "." if problems else ""
