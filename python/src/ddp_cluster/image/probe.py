"""What a base image's Python holds: run inside the base image (``python3 - < baseprobe.py``), it prints one
``python_json:`` line that :mod:`ddp_cluster.image.base` reads on the controller.

It reports the interpreter (version, path) and, for torch, torch_npu and numpy, every distribution of the
closure of their requirements that is installed (name, version, requirements, where it lives): what the node
image keeps as it is. Extras' requirements are left out (they are not installed by the package itself), and so
are pip, setuptools and wheel, which the node's venv has of its own.

It runs in whatever Python a vendor's image has, so it uses the standard library only and the syntax of
Python 3.6; an interpreter older than 3.8 reports its version alone (the image is refused for it anyway).
"""

import json
import os
import re
import sys
from typing import Any, Dict, List

ROOTS = ("torch", "torch_npu", "numpy")
# Every venv has its own (ensurepip puts pip and, before Python 3.12, setuptools in it): not the base's.
VENV_TOOLS = ("pip", "setuptools", "wheel")
PREFIX = "python_json: "


def canonical(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return canonical(match.group(1)) if match else ""


def unconditional(requirement: str) -> bool:
    """Whether a Requires-Dist line applies without an extra (``x; extra == "y"`` does not)."""
    marker = requirement.partition(";")[2]
    return not re.search(r"\bextra\b", marker)


def closure() -> Dict[str, Any]:
    from importlib import metadata

    installed = {}  # type: Dict[str, Any]
    for dist in metadata.distributions():  # in sys.path order: the first of a name is the one imported
        name = dist.metadata["Name"]
        if name:
            installed.setdefault(canonical(name), dist)
    found = {}  # type: Dict[str, Any]
    todo = [canonical(name) for name in ROOTS]
    while todo:
        key = todo.pop(0)
        if key in found or key not in installed or key in VENV_TOOLS:
            continue
        dist = installed[key]
        requires = [line for line in (dist.requires or []) if unconditional(line)]  # type: List[str]
        found[key] = {
            "name": dist.metadata["Name"],
            "version": dist.version,
            "requires": requires,
            "location": str(dist.locate_file("")),
        }
        todo.extend(requirement_name(line) for line in requires)
    return found


def pip_constraints() -> List[str]:
    """The pins of the files PIP_CONSTRAINT names (NGC's /etc/pip/constraint.txt), which the base's pip
    applies to every install, in the node image's build too."""
    found = []  # type: List[str]
    for path in os.environ.get("PIP_CONSTRAINT", "").split():
        try:
            with open(path) as lines:
                found.extend(line.split("#")[0].strip() for line in lines)
        except OSError:
            continue
    return [line for line in found if line and not line.startswith("-")]


def main() -> None:
    report = {
        "python": "%d.%d.%d" % tuple(sys.version_info[:3]),
        "executable": sys.executable,
        "packages": {},
    }  # type: Dict[str, Any]
    if sys.version_info >= (3, 8):
        report["packages"] = closure()
    report["pip_constraints"] = pip_constraints()
    print(PREFIX + json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
