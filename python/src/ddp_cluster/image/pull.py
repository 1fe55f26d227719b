"""The user's base image on the engine that builds: found there, else pulled there within a bound, showing
progress, else refused saying why (:func:`ddp_cluster.image.base.pull_failure`).

Runs on the controller; the action plugin ``ddp_image_pull`` is its shim. The pull is the docker CLI's, so
it uses the user's own credentials and contexts (``docker login`` is what a user has done; on a build
server, that server's login). Two engines:

- :class:`Here`, this controller's: runs ``docker pull`` and reads its output as it comes;
- :class:`There`, a build server's, through a shell over the task's own connection: the pull starts there
  in the background under ``timeout``, writing to a file read back every few seconds, so the same progress
  lines show; the file is removed at the end.

A pull that did not finish never tags an image, so a refused base leaves no image of that name.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ddp_cluster.image.base import pull_failure

# What ``docker pull`` (without a terminal) says of a layer once its bytes are here, and once it is in place.
DOWNLOADED = ("Download complete", "Verifying Checksum", "Extracting", "Pull complete", "Already exists")
IN_PLACE = ("Pull complete", "Already exists")
# The server keeps the pull's output here while it runs; removed at the end.
REMOTE_LOG = "/var/tmp/ddp-pull."
# Lines of the pull's output kept for the reason of a failure.
SAID = 20

Say = Callable[[str], None]
# A command run in a shell on the build server: its rc, stdout and stderr (Ansible's low-level execute).
Shell = Callable[[str], Mapping[str, Any]]


def engine_env() -> dict[str, str]:
    """The engine the build uses (DOCKER_HOST, else the default socket), not another docker context's: asked
    and pulled onto alike."""
    chosen = {} if os.environ.get("DOCKER_HOST") else {"DOCKER_CONTEXT": "default"}
    return {**os.environ, "NO_COLOR": "1", **chosen}


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
        if status in DOWNLOADED:
            self.downloaded.add(layer)
        if status in IN_PLACE:
            self.done.add(layer)

    def describe(self) -> str:
        if not self.seen:
            return "asking the registry"
        total = len(self.seen)
        return f"{len(self.downloaded)}/{total} layers downloaded, {len(self.done)}/{total} in place"


@dataclass(frozen=True)
class Pulled:
    """How a pull ended: its exit status, its last lines, and whether the bound stopped it."""

    returncode: int
    said: tuple[str, ...]
    timed_out: bool


class Engine(Protocol):
    def present(self, name: str) -> bool: ...

    def pull(self, name: str, timeout: int, every: float, layers: Layers, show: Callable[[], None]) -> Pulled:
        """Pull name within timeout seconds, feeding layers and calling show every ``every`` seconds."""
        ...


class Here:
    """This controller's engine, through the docker CLI."""

    def present(self, name: str) -> bool:
        inspect = ["docker", "image", "inspect", name]
        return subprocess.run(inspect, capture_output=True, check=False, env=engine_env()).returncode == 0

    def pull(self, name: str, timeout: int, every: float, layers: Layers, show: Callable[[], None]) -> Pulled:
        started = time.monotonic()
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
                        said = [*said[-SAID:], line]
                        layers.read(line)
                if time.monotonic() - shown >= every:
                    shown = time.monotonic()
                    show()
            returncode = pull.wait()
        return Pulled(returncode, tuple(said), timed_out)


class There:
    """A build server's engine, through ``shell`` (the task's own connection to it)."""

    def __init__(self, shell: Shell, sleep: Callable[[float], None] = time.sleep) -> None:
        self.shell, self.sleep = shell, sleep

    def present(self, name: str) -> bool:
        return int(self.shell(f"docker image inspect {shlex.quote(name)} >/dev/null 2>&1")["rc"]) == 0

    def pull(self, name: str, timeout: int, every: float, layers: Layers, show: Callable[[], None]) -> Pulled:
        started = time.monotonic()
        # setsid: the pull outlives this command's session; its end is written to the file as "exit: N" (124:
        # timeout stopped it). HUP ignored before the fork: over ssh (a pty) the session's end sends it to the
        # shell's process group, which the child is still in until setsid runs.
        begun = self.shell(
            f"trap '' HUP; log=$(mktemp {REMOTE_LOG}XXXXXX) || exit 1; "
            f'setsid sh -c \'timeout {timeout} docker pull "$0" >"$1" 2>&1; echo "exit: $?" >>"$1"\' '
            f'{shlex.quote(name)} "$log" </dev/null >/dev/null 2>&1 & echo "$log"'
        )
        path = (str(begun.get("stdout", "")).strip().splitlines()[-1:] or [""])[0]
        if begun["rc"] != 0 or not path.startswith(REMOTE_LOG):
            return Pulled(1, (str(begun.get("stderr", "")).strip() or "could not start docker pull",), False)
        # The server's own timeout ends the pull; this bound only covers a connection that stops answering.
        deadline = started + timeout + 60
        shown, returncode, lines = started, -1, []
        try:
            while time.monotonic() < deadline:
                self.sleep(min(2.0, every))
                read = self.shell(f"cat {shlex.quote(path)}")
                lines = [line.strip() for line in str(read.get("stdout", "")).splitlines()]
                for line in lines:
                    layers.read(line)
                ended = [line for line in lines if line.startswith("exit: ")]
                if ended:
                    returncode = int(ended[-1].split()[1])
                    break
                if time.monotonic() - shown >= every:
                    shown = time.monotonic()
                    show()
        finally:
            self.shell(f"rm -f {shlex.quote(path)}")
        said = [line for line in lines if not line.startswith("exit: ")][-SAID:]
        return Pulled(returncode, tuple(said), returncode in (124, -1))


def find_or_pull(
    engine: Engine,
    name: str,
    *,
    timeout: int,
    every: float,
    pull: bool,
    check_mode: bool,
    where: str,
    say: Say,
) -> dict[str, Any]:
    """The task's result: name present, pulled (changed), or failed with the reason. ``pull`` false only
    looks (the project's own base, which the image stage makes with debootstrap); ``where`` names the build
    server in the lines and the reason, '' for this controller."""
    if engine.present(name):
        return {"changed": False, "present": True, "msg": f"{name} is present"}
    if not pull:
        return {"changed": False, "present": False, "msg": f"{name} is not present"}
    if check_mode:
        return {"changed": True, "present": False, "msg": f"would pull {name}"}
    say(
        f"base image {name}: pulling{' on ' + where if where else ''} (at most {timeout} s; "
        f"docker pull {name} shows the same)"
    )
    started = time.monotonic()
    layers = Layers()

    def show() -> None:
        say(f"base image {name}: {layers.describe()}, {time.monotonic() - started:.0f} s")

    pulled = engine.pull(name, timeout, every, layers, show)
    if engine.present(name) and (pulled.returncode == 0 or pulled.timed_out):
        seconds = round(time.monotonic() - started, 1)
        say(f"base image {name}: pulled in {seconds:.1f} s")
        return {"changed": True, "present": True, "pulled": True, "msg": f"pulled {name}", "seconds": seconds}
    reason = pull_failure(name, "\n".join(pulled.said), pulled.timed_out, timeout)
    return {
        "failed": True,
        "changed": False,
        "present": False,
        "msg": f"{where}: {reason}" if where else reason,
    }
