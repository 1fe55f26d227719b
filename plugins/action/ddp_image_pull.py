"""Action ``ddp_image_pull``: pull a user's base image onto the engine that builds, with the user's own Docker
credentials and contexts (the docker CLI's: ``docker login`` is what a user has done), printing its progress
as it goes, within a bound.

On failure it says why (not found, unauthorized: ``docker login REGISTRY``, timed out, unreachable) with
``ddp_cluster.baseimage.pull_failure``, and it leaves no image of that name: a pull that did not finish never
tags one. In check mode it only says that it would pull.
"""

from __future__ import annotations

import os
import re
import select
import site
import subprocess
import time
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.baseimage import pull_failure

display = Display()


def engine_env() -> dict[str, str]:
    """The engine the build uses (DOCKER_HOST, else the default socket), not another docker context's: asked
    and pulled onto alike."""
    return {**os.environ, "NO_COLOR": "1"} | (
        {} if os.environ.get("DOCKER_HOST") else {"DOCKER_CONTEXT": "default"}
    )


def present(name: str) -> bool:
    return (
        subprocess.run(
            ["docker", "image", "inspect", name], capture_output=True, check=False, env=engine_env()
        ).returncode
        == 0
    )


class Layers:
    """What ``docker pull`` (without a terminal) has said of each layer: ``ID: Pull complete`` and the
    like."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.downloaded: set[str] = set()
        self.done: set[str] = set()

    def read(self, line: str) -> None:
        layer, sep, status = line.partition(": ")
        if not sep or not re.fullmatch(r"[0-9a-f]{12}", layer):  # a layer's short id; not "TAG: Pulling from"
            return
        self.seen.add(layer)
        if status in (
            "Download complete",
            "Verifying Checksum",
            "Extracting",
            "Pull complete",
            "Already exists",
        ):
            self.downloaded.add(layer)
        if status in ("Pull complete", "Already exists"):
            self.done.add(layer)

    def describe(self) -> str:
        if not self.seen:
            return "asking the registry"
        total = len(self.seen)
        return f"{len(self.downloaded)}/{total} layers downloaded, {len(self.done)}/{total} in place"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("name", "timeout", "every"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        name = str(self._task.args["name"])
        timeout = int(self._task.args.get("timeout", 3600))
        every = float(self._task.args.get("every", 15))
        if present(name):
            result.update(changed=False, msg=f"{name} is present")
            return result
        if self._task.check_mode:
            result.update(changed=True, msg=f"would pull {name}")
            return result
        display.display(
            f"base image {name}: pulling (at most {timeout} s; docker pull {name} shows the same)"
        )
        started = time.monotonic()
        deadline = started + timeout
        layers = Layers()
        said: list[str] = []
        timed_out = False
        with subprocess.Popen(
            ["docker", "pull", name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=engine_env()
        ) as pull:
            assert pull.stdout is not None
            shown, pending, ended = started, b"", False
            while not ended:
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    pull.terminate()
                    try:
                        pull.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        pull.kill()
                    break
                # Raw reads, never a blocking readline: a line written in halves cannot hold the loop past the
                # bound.
                ready, _, _ = select.select([pull.stdout], [], [], min(1.0, deadline - now))
                if ready:
                    chunk = os.read(pull.stdout.fileno(), 65536)
                    ended = not chunk
                    *lines, pending = (pending + chunk).split(b"\n")
                    for raw in lines + ([pending] if ended and pending else []):
                        line = raw.decode(errors="replace").strip()
                        said = [*said[-20:], line]
                        layers.read(line)
                if time.monotonic() - shown >= every:
                    shown = time.monotonic()
                    display.display(f"base image {name}: {layers.describe()}, {shown - started:.0f} s")
            returncode = pull.wait()
        if present(name) and (returncode == 0 or timed_out):
            display.display(f"base image {name}: pulled in {time.monotonic() - started:.1f} s")
            result.update(changed=True, msg=f"pulled {name}", seconds=round(time.monotonic() - started, 1))
            return result
        result.update(failed=True, changed=False, msg=pull_failure(name, "\n".join(said), timed_out, timeout))
        return result
