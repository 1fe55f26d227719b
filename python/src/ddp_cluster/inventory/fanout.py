"""One command on many servers at once: one ssh process per server, in threads, from the controller.

Each server is reached as Ansible reaches it (:func:`ssh_argv`: its ssh executable, the configured ssh_args,
the host's port, user, key and extra arguments, and Ansible's own ControlPath, so the masters this opens are
the ones the later tasks of a server that converges reuse). Nodes on the controller's own engine (connection
local) run the command here, fewer at a time (each one is a process of this machine). ssh's own failure (exit
status 255: refused, reset, timed out) is retried, with a growing pause; any other status is the command's
answer and is returned as it is.
"""

from __future__ import annotations

import hashlib
import os
import random
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

REMOTE_LIMIT = 128
LOCAL_LIMIT = 8
ATTEMPTS = 3
DELAYS = (0.5, 1.0, 2.0)
SSH_FAILED = 255
LOCAL_CONNECTIONS = frozenset({"local", "docker", "community.docker.docker", "ddp_docker"})


@dataclass(frozen=True)
class Job:
    """One server's command: ARGV run with STDIN; LOCAL when it runs on the controller itself."""

    name: str
    argv: tuple[str, ...]
    stdin: str
    local: bool


@dataclass(frozen=True)
class Result:
    name: str
    rc: int
    stdout: str
    stderr: str
    attempts: int


def is_local(variables: Mapping[str, Any]) -> bool:
    """Whether a host's commands run on the controller (its connection is local or a local engine's)."""
    return str(variables.get("ansible_connection") or "ssh") in LOCAL_CONNECTIONS


def control_path(host: str, port: Any, user: Any, directory: str) -> str:
    """Ansible's ControlPath for HOST, PORT, USER (its ssh connection's hash: the same master socket)."""
    digest = hashlib.sha1(f"{host}-{port}-{user}".encode()).hexdigest()
    return os.path.join(os.path.expanduser(directory), digest[:10])


def ssh_argv(
    name: str,
    variables: Mapping[str, Any],
    *,
    ssh_args: str,
    control_path_dir: str,
    timeout: int = 30,
) -> list[str]:
    """How Ansible's ssh connection reaches host NAME with its (plain) VARIABLES, the target last: the ssh
    executable (ansible_ssh_executable), SSH_ARGS (ansible.cfg's ssh_args), port, key, user, the host's
    common and extra arguments; batch mode (nothing asks for a password)."""

    def var(*names: str) -> Any:
        for key in names:
            value = variables.get(key)
            if value not in (None, ""):
                return value
        return None

    host = str(var("ansible_host", "ansible_ssh_host") or name)
    port = var("ansible_port", "ansible_ssh_port")
    user = var("ansible_user", "ansible_ssh_user", "ansible_remote_user")
    argv = [str(var("ansible_ssh_executable") or "ssh"), *shlex.split(ssh_args)]
    argv += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout}"]
    if port is not None:
        argv += ["-o", f"Port={port}"]
    key = var("ansible_ssh_private_key_file", "ansible_private_key_file")
    if key is not None:
        argv += ["-o", f"IdentityFile={os.path.expanduser(str(key))}"]
    if user is not None:
        argv += ["-o", f"User={user}"]
    for extra in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        argv += shlex.split(str(var(extra) or ""))
    if "ControlPath" not in " ".join(argv):
        argv += ["-o", f"ControlPath={control_path(host, port, user, control_path_dir)}"]
    return [*argv, host]


def job(name: str, variables: Mapping[str, Any], command: str, stdin: str, **ssh: Any) -> Job:
    """The Job running COMMAND (a shell command line) with STDIN on host NAME: here when the host's
    connection is local, else over ssh (ansible_become: through sudo, no password asked)."""
    if variables.get("ansible_become") in (True, "true", "True", "yes", 1):
        command = "sudo -n " + command
    if is_local(variables):
        return Job(name, ("/bin/sh", "-c", command), stdin, True)
    return Job(name, (*ssh_argv(name, variables, **ssh), command), stdin, False)


def run_one(
    job: Job,
    *,
    attempts: int = ATTEMPTS,
    timeout: float = 120.0,
    sleep: Callable[[float], None] = time.sleep,
    delays: Sequence[float] = DELAYS,
) -> Result:
    """Run JOB, again after ssh's own failure (rc 255) up to ATTEMPTS times; a timeout is rc 124."""
    rc, out, err, attempt = SSH_FAILED, "", "", 0
    for attempt in range(1, attempts + 1):
        try:
            done = subprocess.run(
                list(job.argv),
                input=job.stdin,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            rc, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired:
            rc, out, err = 124, "", f"no answer within {timeout:.0f} s"
        except OSError as error:
            rc, out, err = 127, "", f"{job.argv[0]}: {error.strerror or error}"
        if rc != SSH_FAILED or job.local or attempt == attempts:
            break
        pause = delays[min(attempt - 1, len(delays) - 1)]
        sleep(pause * random.uniform(0.8, 1.2))  # jitter: the retries of many servers do not land together
    return Result(job.name, rc, out, err, attempt)


def run_all(
    jobs: Sequence[Job],
    *,
    remote_limit: int = REMOTE_LIMIT,
    local_limit: int = LOCAL_LIMIT,
    **options: Any,
) -> dict[str, Result]:
    """Every job, at most REMOTE_LIMIT ssh processes and LOCAL_LIMIT local ones in flight; results by name."""
    local_gate = threading.BoundedSemaphore(max(1, local_limit))

    def one(item: Job) -> Result:
        if not item.local:
            return run_one(item, **options)
        with local_gate:
            return run_one(item, **options)

    if not jobs:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), remote_limit))) as pool:
        return {result.name: result for result in pool.map(one, jobs)}
