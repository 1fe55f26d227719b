"""Filters over ``ddp_cluster.baseimage``: the base image a node image is built on, read from the role's probe."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from ddp_cluster import baseimage
except ImportError:  # a checkout without the package installed: use the sources next to this plugin
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "src"))
    from ddp_cluster import baseimage


def ddp_base_image(probe: Any, image: str, python_override: str = "") -> dict[str, Any]:
    """What the wheelhouse depends on: machine, libc, python (X.Y the image will run), kept (pins)."""
    base = baseimage.read_probe(str(image), str(probe or ""))
    return {
        "machine": base.machine or "x86_64",
        "libc": base.libc,
        "python": baseimage.python_version(base, str(python_override or "")),
        "kept": base.constraints(),
    }


def ddp_base_problems(
    probe: Any, image: str, requirements_text: str, requirements_path: str, pyproject_text: str,
    python_override: str = "", imported: Any = False, os_packages: Any = (),
) -> list[str]:  # fmt: skip
    """Every reason the node image cannot be built on the base image, each a sentence; [] when none."""
    base = baseimage.read_probe(str(image), str(probe or ""))
    return baseimage.problems(
        base,
        requirements_text=str(requirements_text),
        requirements_path=str(requirements_path),
        minimum=baseimage.minimum_python(str(pyproject_text)),
        python_version=baseimage.python_version(base, str(python_override or "")),
        imported=str(imported).lower() == "true",
        os_packages=[str(name) for name in os_packages or []],
    )


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"ddp_base_image": ddp_base_image, "ddp_base_problems": ddp_base_problems}
