"""How the controller reaches a job's node: a shell command on the node's server, a file put there.

The job's lifecycle (:mod:`ddp_cluster.job.control`) and the node checks speak to a :class:`Transport` and
never to Ansible or ssh: the playbook's actions hand in one built on the task's Ansible connection (local,
ssh, or the ``ddp_docker`` connection), :class:`Local` runs on this machine, and the unit tests give a fake.
A node is a container on its server: :func:`in_container` wraps a command for ``docker exec``.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ddp_cluster.errors import DdpClusterError

# Bound of one command run by :class:`Local` (the wait's commands return at once; a stop takes a minute).
LOCAL_TIMEOUT = 300
# What GNU timeout --verbose says on stderr when it ends a command at its bound (its status is then 124).
TIMED_OUT = "timeout: sending signal"
# Seconds after the bound's SIGTERM before a command that ignores it is killed.
KILL_AFTER = 10


class Unreachable(DdpClusterError):
    """The node's server did not answer (its connection failed); the message says how."""


@dataclass(frozen=True)
class Done:
    """What a command did: its exit status and output."""

    rc: int
    stdout: str = ""
    stderr: str = ""

    def said(self, limit: int = 500) -> str:
        """What went wrong, for a message: the end of stderr, else of stdout, else the status."""
        return (self.stderr.strip() or self.stdout.strip())[-limit:] or f"rc {self.rc}"


class Transport(Protocol):
    def run(self, command: str) -> Done:
        """Run a shell command on the node's server; :class:`Unreachable` when the server does not answer."""
        ...

    def put(self, local: str) -> str:
        """Copy a file of the controller to a temporary folder on the server; its path there."""
        ...

    def close(self) -> None:
        """Remove what :meth:`put` left on the server."""
        ...


def in_container(container: str, command: str, detach: bool = False, shell: str = "/bin/sh") -> str:
    """``command`` run in the node container ``container`` (``detach``: in the background, ``docker exec
    -d``), as a command for the container's server."""
    flag = " -d" if detach else ""
    return f"docker exec{flag} {shlex.quote(container)} {shell} -c {shlex.quote(command)}"


class Local:
    """The node's server is this machine (a shell here; files copied to a temporary folder)."""

    def __init__(self) -> None:
        self._folder: Path | None = None

    def run(self, command: str) -> Done:
        try:
            done = subprocess.run(
                ["/bin/sh", "-c", command], capture_output=True, text=True, timeout=LOCAL_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise Unreachable(str(error)) from error
        return Done(done.returncode, done.stdout, done.stderr)

    def put(self, local: str) -> str:
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="ddp-cluster-"))
        target = self._folder / Path(local).name
        shutil.copyfile(local, target)
        return str(target)

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


class ActionTransport:
    """The node's server through an Ansible action's connection (the task's: local, ssh or ``ddp_docker``).

    Duck-typed on the action's own methods, so that the package imports no Ansible; ``unreachable``: the
    errors that mean the connection failed (Ansible's ``AnsibleError``, handed in by the action). ``bound``:
    seconds one command may take on the server (GNU ``timeout`` there ends it, SIGKILL :data:`KILL_AFTER`
    later), after which it is :class:`Unreachable`; 0, no bound (a sync streams what it packs for as long as
    that takes). A silent connection is ssh's to end (``ServerAliveInterval`` in ansible.cfg): the bound is
    for a command that hangs on the server (a ``docker exec`` into a container that does not answer)."""

    def __init__(self, action: Any, unreachable: tuple[type[BaseException], ...], bound: int = 0) -> None:
        self._action = action
        self._unreachable = unreachable
        self._bound = bound
        self._tmp = ""

    def run(self, command: str) -> Done:
        bounded = command
        if self._bound:
            # (in the C locale: timeout's words are matched below)
            bounded = (
                f"LC_ALL=C timeout --verbose -k {KILL_AFTER} {self._bound} /bin/sh -c {shlex.quote(command)}"
            )
        try:
            done = self._action._low_level_execute_command(bounded)
        except self._unreachable as error:
            raise Unreachable(str(error)) from error
        rc, stdout, stderr = int(done["rc"]), str(done.get("stdout", "")), str(done.get("stderr", ""))
        # (stderr comes in stdout where ssh gave the command a terminal)
        if self._bound and rc in (124, 137) and TIMED_OUT in stderr + stdout:
            raise Unreachable(f"no answer within {self._bound} s from: {command[:200]}")
        return Done(rc, stdout, stderr)

    def put(self, local: str) -> str:
        try:
            # the action's temporary folder ends with a separator
            self._tmp = self._tmp or str(self._action._make_tmp_path())
            remote = f"{self._tmp}{Path(local).name}"
            self._action._transfer_file(local, remote)
        except self._unreachable as error:
            raise Unreachable(str(error)) from error
        return remote

    def close(self) -> None:
        """The temporary folder of what was put removed; a server that does not answer keeps it (Ansible
        would otherwise fail the task on its way out: the job may be followed elsewhere meanwhile)."""
        if self._tmp:
            tmp, self._tmp = self._tmp, ""
            try:
                self._action._remove_tmp_path(tmp)
            except self._unreachable:
                self._action._connection._shell.tmpdir = None  # not asked again by the action's cleanup
