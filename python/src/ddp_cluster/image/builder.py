"""Where the node image is built: on the controller's Docker engine, or on one of the servers'.

``cluster_image_builder`` is ``controller``, ``server`` or ``auto``. ``auto`` builds on a server when the
controller has no Docker engine, or when the servers' architecture differs from the controller's (an x86-64
laptop in front of arm64 Atlas servers), and on the controller otherwise. The choice and its reason are said
before anything is built; a setting that cannot work is refused, naming what to change.

The inputs are the engines' own answers (``docker version --format '{{.Server.Version}} {{.Server.Arch}}'``):
the controller's (``None`` when no engine answered, with the reason) and each server's.
:func:`choose_for_role` takes them as the role registers them, and answers as the role reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddp_cluster.errors import DdpClusterError

SETTINGS = ("auto", "controller", "server")

# Docker's Server.Arch says amd64/arm64; uname -m (and a base image's probe) says x86_64/aarch64.
ARCH_NAMES = {"x86_64": "amd64", "aarch64": "arm64", "amd64": "amd64", "arm64": "arm64"}


class BuilderError(DdpClusterError):
    """A cluster_image_builder setting that cannot work here, with what to change."""


@dataclass(frozen=True)
class Choice:
    builder: str  # controller | server
    host: str  # the inventory host whose engine builds; "localhost" for the controller
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"builder": self.builder, "host": self.host, "reason": self.reason}


def arch(name: str) -> str:
    """Docker's name for an architecture (amd64, arm64, ...), from Docker's or uname's."""
    word = name.strip().split()[-1] if name.strip() else ""
    return ARCH_NAMES.get(word, word)


def choose(
    setting: str,
    controller_engine: str | None,
    controller_error: str,
    servers: Mapping[str, str],
    local_hosts: Sequence[str] = (),
    build_host: str = "",
    image_arch: str = "",
) -> Choice:
    """Pick the engine that builds. ``servers`` maps each remote server of the play to its engine's answer
    (``VERSION ARCH``); ``local_hosts`` are hosts on the controller's own engine (the local inventory);
    ``image_arch`` is the base image's architecture where the controller already has it."""
    setting = (setting or "auto").strip()
    if setting not in SETTINGS:
        raise BuilderError(
            f"cluster_image_builder is {setting!r}: set auto (the default), controller or server"
        )
    arches = {name: arch(answer) for name, answer in servers.items()}
    host = build_host.strip() or (sorted(servers)[0] if servers else "")
    if setting == "server" or (setting == "auto" and servers and not local_hosts):
        if local_hosts:
            raise BuilderError(
                f"cluster_image_builder is server but {', '.join(local_hosts)} run on this controller's own "
                "engine (a local connection): a server build is for remote servers; set controller or auto"
            )
        if not servers:
            raise BuilderError(
                "cluster_image_builder is server but the play has no remote server to build on"
            )
        if host not in servers:
            raise BuilderError(
                f"cluster_image_build_host is {host!r}, which is not a server of this play: name one of "
                f"{', '.join(sorted(servers))}"
            )
        others = sorted(name for name, value in arches.items() if value != arches[host])
        if others:
            raise BuilderError(
                f"the build server {host} is {arches[host]} but "
                f"{', '.join(f'{n} is {arches[n]}' for n in others)}: "
                "one image serves the whole cluster, so every server must share one architecture"
            )
    if setting == "server":
        reason = f"cluster_image_builder is server: {host}'s engine ({arches[host]}) builds"
        return Choice("server", host, reason)
    controller_arch = arch(controller_engine or "")
    if setting == "auto":
        if local_hosts or not servers:
            if controller_engine is None:
                raise BuilderError(
                    f"the nodes run on this controller's engine, but no Docker engine answers here "
                    f"({controller_error}): start it (make docker), then run again"
                )
            return Choice("controller", "localhost", "the nodes run on this controller's own engine")
        if controller_engine is None:
            reason = f"this controller has no Docker engine ({controller_error}): {host}'s engine builds"
            return Choice("server", host, reason)
        if arches[host] != controller_arch:
            reason = (
                f"the servers are {arches[host]} and this controller is {controller_arch}: "
                f"{host}'s engine builds natively"
            )
            return Choice("server", host, reason)
        return Choice(
            "controller", "localhost", f"this controller's engine is {controller_arch}, as the servers are"
        )
    # controller
    if controller_engine is None:
        raise BuilderError(
            f"cluster_image_builder is controller but no Docker engine answers on this controller "
            f"({controller_error}): start one, or set cluster_image_builder: server (or auto) to build on a "
            "server"
        )
    built = arch(image_arch) if image_arch.strip() else controller_arch
    wrong = sorted(name for name, value in arches.items() if value != built)
    if wrong:
        source = f"the base image is {built}" if image_arch.strip() else f"this controller is {built}"
        raise BuilderError(
            f"cluster_image_builder is controller and {source}, but "
            f"{', '.join(f'{n} is {arches[n]}' for n in wrong)}: set cluster_image_builder: server (or auto) "
            "to build on a server of the servers' architecture"
        )
    return Choice("controller", "localhost", "cluster_image_builder is controller")


def choose_for_role(
    setting: str,
    controller: Any,
    servers: Mapping[str, Any],
    local_hosts: Sequence[str] = (),
    build_host: str = "",
    image_arch: str = "",
) -> dict[str, str]:
    """:func:`choose` from the role's registered result of ``docker version`` on the controller (a command
    result: rc, stdout, stderr or msg) and each server's answer: builder, host, reason and error ('' or the
    sentence that says why the setting cannot work)."""
    answer = controller if isinstance(controller, Mapping) else {}
    stdout = str(answer.get("stdout", "")).strip()
    answered = answer.get("rc") == 0 and bool(stdout)
    said = answer.get("stderr") or answer.get("msg")
    reason = "" if answered else " ".join(str(said or "no answer").split())[:300]
    try:
        choice = choose(
            setting or "auto",
            stdout if answered else None,
            reason,
            {str(name): str(value) for name, value in servers.items()},
            local_hosts,
            build_host,
            image_arch,
        )
    except BuilderError as error:
        return {"builder": "", "host": "", "reason": "", "error": str(error)}
    return {**choice.as_dict(), "error": ""}
