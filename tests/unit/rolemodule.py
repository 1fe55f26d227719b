"""Running one of the roles' modules through Ansible as a role runs it, for the container-free tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = Path(sys.executable).parent / "ansible"


def run_role_module(
    role: str,
    module: str,
    args: Mapping[str, Any],
    *,
    cwd: Path | str = "/",
    check: bool = False,
    diff: bool = False,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``module`` of ``roles/ROLE`` on localhost with the role's library and module_utils (the package's
    shipped modules behind their links), this interpreter as the target's; return the module's result.

    ``cwd`` outside the checkout by default: the checkout's ansible.cfg would run a role's action plugin of
    the same name instead of the bare module."""
    variables = dict(os.environ) | dict(env or {})
    variables |= {
        "ANSIBLE_LIBRARY": str(REPO / "roles" / role / "library"),
        "ANSIBLE_MODULE_UTILS": str(REPO / "roles" / role / "module_utils"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
    }
    command = [
        str(ANSIBLE),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-m",
        module,
        "-a",
        json.dumps(args),
    ]
    command += (["--check"] if check else []) + (["--diff"] if diff else [])
    done = subprocess.run(
        command, capture_output=True, text=True, env=variables, cwd=cwd, timeout=120, check=False
    )
    result: dict[str, Any] = json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return result
