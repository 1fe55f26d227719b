"""Action ``ddp_image_pull``: look for the base image on the engine that builds and pull a user's base there
when it lacks it, with the user's own Docker credentials and contexts (the docker CLI's: ``docker login`` is
what a user has done; on a build server, that server's login), printing its progress as it goes, within a
bound.

On this controller (``remote: false``) it runs the docker CLI itself and reads the pull's output as it
comes. On a build server (``remote: true``, the task delegated there) it starts the pull there in the
background, under ``timeout``, writing to a file it reads back every few seconds over the task's own
connection, so the same progress lines show; the file is removed at the end. ``pull: false`` only looks (the
project's own base, which the image stage makes with debootstrap).

On failure it says why (not found, unauthorized: ``docker login REGISTRY``, timed out, unreachable) with
``ddp_cluster.image.base.pull_failure``, and it leaves no image of that name: a pull that did not finish
never tags one. In check mode it only says that it would pull.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import site
import subprocess
import time
from pathlib import Path
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.image.base import pull_failure

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
    _VALID_ARGS = frozenset(("name", "timeout", "every", "remote", "pull", "where"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        name = str(self._task.args["name"])
        timeout = int(self._task.args.get("timeout", 3600))
        every = float(self._task.args.get("every", 15))
        remote = boolean(self._task.args.get("remote", False), strict=True)
        where = str(self._task.args.get("where", ""))
        there = self._remote_present if remote else present
        if there(name):
            result.update(changed=False, present=True, msg=f"{name} is present")
            return result
        if not boolean(self._task.args.get("pull", True), strict=True):
            result.update(changed=False, present=False, msg=f"{name} is not present")
            return result
        if self._task.check_mode:
            result.update(changed=True, present=False, msg=f"would pull {name}")
            return result
        display.display(
            f"base image {name}: pulling{' on ' + where if where else ''} (at most {timeout} s; "
            f"docker pull {name} shows the same)"
        )
        started = time.monotonic()
        layers = Layers()
        if remote:
            returncode, said, timed_out = self._pull_remote(name, timeout, every, layers, started)
        else:
            returncode, said, timed_out = self._pull_here(name, timeout, every, layers, started)
        if there(name) and (returncode == 0 or timed_out):
            seconds = round(time.monotonic() - started, 1)
            display.display(f"base image {name}: pulled in {seconds:.1f} s")
            result.update(changed=True, present=True, pulled=True, msg=f"pulled {name}", seconds=seconds)
            return result
        reason = pull_failure(name, "\n".join(said), timed_out, timeout)
        result.update(
            failed=True, changed=False, present=False, msg=f"{where}: {reason}" if where else reason
        )
        return result

    @staticmethod
    def _show(name: str, layers: Layers, started: float) -> None:
        display.display(f"base image {name}: {layers.describe()}, {time.monotonic() - started:.0f} s")

    def _pull_here(
        self, name: str, timeout: int, every: float, layers: Layers, started: float
    ) -> tuple[int, list[str], bool]:
        deadline = started + timeout
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
                    self._show(name, layers, started)
            returncode = pull.wait()
        return returncode, said, timed_out

    def _shell(self, command: str) -> dict[str, Any]:
        done: dict[str, Any] = self._low_level_execute_command(command, sudoable=True)
        return done

    def _remote_present(self, name: str) -> bool:
        return int(self._shell(f"docker image inspect {shlex.quote(name)} >/dev/null 2>&1")["rc"]) == 0

    def _pull_remote(
        self, name: str, timeout: int, every: float, layers: Layers, started: float
    ) -> tuple[int, list[str], bool]:
        # setsid: the pull outlives this command's session; its end is written to the file as "exit: N" (124:
        # timeout stopped it). HUP ignored before the fork: over ssh (a pty) the session's end sends it to the
        # shell's process group, which the child is still in until setsid runs.
        started_on = self._shell(
            "trap '' HUP; log=$(mktemp /var/tmp/ddp-pull.XXXXXX) || exit 1; "
            f'setsid sh -c \'timeout {timeout} docker pull "$0" >"$1" 2>&1; echo "exit: $?" >>"$1"\' '
            f'{shlex.quote(name)} "$log" </dev/null >/dev/null 2>&1 & echo "$log"'
        )
        log = str(started_on.get("stdout", "")).strip().splitlines()[-1:] or [""]
        path = log[0]
        if started_on["rc"] != 0 or not path.startswith("/var/tmp/ddp-pull."):
            return 1, [str(started_on.get("stderr", "")).strip() or "could not start docker pull"], False
        # The server's own timeout ends the pull; this bound only covers a connection that stops answering.
        deadline = started + timeout + 60
        shown, returncode, lines = started, -1, []
        try:
            while time.monotonic() < deadline:
                time.sleep(min(2.0, every))
                read = self._shell(f"cat {shlex.quote(path)}")
                lines = [line.strip() for line in str(read.get("stdout", "")).splitlines()]
                for line in lines:
                    layers.read(line)
                ended = [line for line in lines if line.startswith("exit: ")]
                if ended:
                    returncode = int(ended[-1].split()[1])
                    break
                if time.monotonic() - shown >= every:
                    shown = time.monotonic()
                    self._show(name, layers, started)
        finally:
            self._shell(f"rm -f {shlex.quote(path)}")
        said = [line for line in lines if not line.startswith("exit: ")][-20:]
        return returncode, said, returncode in (124, -1)
