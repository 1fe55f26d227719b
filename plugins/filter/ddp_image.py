"""Filters over ``ddp_cluster.image``: the base image a node image is built on, read from the role's probe
(``image.base``), and the engine that builds (``image.builder``)."""

from __future__ import annotations

import site
from pathlib import Path
from typing import Any

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.image import base, builder


def ddp_base_image(probe: Any, image: str, python_override: str = "") -> dict[str, Any]:
    """What the wheelhouse depends on: machine, libc, python (X.Y the image will run), kept (pins)."""
    return base.wheelhouse_inputs(str(image), str(probe or ""), str(python_override or ""))


def ddp_base_problems(
    probe: Any, image: str, requirements_text: str, requirements_path: str, pyproject_text: str,
    python_override: str = "", os_packages: Any = (),
) -> list[str]:  # fmt: skip
    """Every reason the node image cannot be built on the base image, each a sentence; [] when none."""
    return base.probe_problems(
        str(image),
        str(probe or ""),
        requirements_text=str(requirements_text),
        requirements_path=str(requirements_path),
        pyproject_text=str(pyproject_text),
        python_override=str(python_override or ""),
        os_packages=[str(name) for name in os_packages or []],
    )


def ddp_image_builder(
    setting: Any,
    controller: Any,
    servers: Any,
    local_hosts: Any = (),
    build_host: Any = "",
    image_arch: Any = "",
) -> dict[str, str]:
    """builder (controller|server), host (the inventory host whose engine builds) and reason; or error, the
    sentence that says why the setting cannot work. ``controller`` is the registered result of
    ``docker version`` on the controller, ``servers`` maps each remote server to its engine's answer."""
    return builder.choose_for_role(
        str(setting or "auto"),
        controller,
        dict(servers or {}),
        [str(host) for host in local_hosts or []],
        str(build_host or ""),
        str(image_arch or ""),
    )


def ddp_docker_arch(name: Any) -> str:
    """Docker's name of an architecture (amd64, arm64) from Docker's or uname's (x86_64, aarch64)."""
    return builder.arch(str(name or ""))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "ddp_base_image": ddp_base_image,
            "ddp_base_problems": ddp_base_problems,
            "ddp_image_builder": ddp_image_builder,
            "ddp_docker_arch": ddp_docker_arch,
        }
