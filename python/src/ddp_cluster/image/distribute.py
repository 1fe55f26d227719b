"""Ship the node image through a registry: pushed once, every server that lacks it pulls the layers it
lacks, in parallel.

Runs on the controller, as the ``training_image`` role's module ``ddp_image_distribute``, which ships this
file as module_utils (``roles/training_image/module_utils/ddp_distribute.py`` links here): it uses the
standard library only, imports nothing of the package, and keeps to Python 3.8. Its error class is therefore
its own.

- :func:`distribute`: with no ``registry``, Docker's Distribution registry on the controller's
  127.0.0.1:port (:func:`controller_registry`) while the servers pull through ``ssh -R``; with the user's
  ``registry``, a push there and direct pulls; with a ``source`` (a server build),
  :func:`distribute_from_source`: the registry runs on the build server and the others pull from it over
  the cluster's network through ``ssh -L`` with an ephemeral key (the role's files/registry-source.sh and
  files/pull-from-source.sh);
- :func:`run`: the module's whole call, check mode included, as (failed, result).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

PR_SET_PDEATHSIG = 1
# The registry's access log: `... http.request.method=GET ... http.response.written=N ...` per response.
WRITTEN = re.compile(r"http\.request\.method=GET\b.*?http\.response\.written=(\d+)")
TUNNEL_FAILED = re.compile(
    r"remote port forwarding failed|cannot listen to port|Could not request", re.IGNORECASE
)
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=30", "-o", "ServerAliveInterval=15",
               "-o", "ServerAliveCountMax=4")  # fmt: skip


class DistributionError(Exception):
    """A step that stops the whole distribution (the registry, the push), with what to do about it.

    Not a ``ddp_cluster.errors`` class: this file travels alone as module_utils."""


def registry_reference(image: str, registry: str, port: int) -> str:
    """The name the servers pull: NAME:TAG under the user's registry, else under the tunnelled loopback
    one."""
    prefix = registry.strip().rstrip("/") if registry.strip() else f"127.0.0.1:{port}"
    return f"{prefix}/{image}"


def registry_config(storage: str, port: int) -> str:
    return (
        "version: 0.1\n"
        "log:\n  level: info\n  formatter: text\n"
        "storage:\n"
        f"  filesystem:\n    rootdirectory: {storage}\n"
        "  delete:\n    enabled: true\n"
        "http:\n"
        f"  addr: 127.0.0.1:{port}\n"
        "  headers:\n    X-Content-Type-Options: [nosniff]\n"
    )


def layer_counts(output: str) -> tuple[int, int]:
    """Layers a `docker pull` downloaded and layers the server had already, from its plain (non-tty)
    output."""
    pulled = len(re.findall(r"^\w+: Pull complete$", output, re.MULTILINE))
    present = len(re.findall(r"^\w+: Already exists$", output, re.MULTILINE))
    return pulled, present


def bytes_served(log: str) -> int:
    return sum(int(match) for match in WRITTEN.findall(log))


def pull_command(reference: str, image: str) -> str:
    """The shell command a server runs: pull, name the image as the controller does, drop the registry's
    name."""
    ref, local = shlex.quote(reference), shlex.quote(image)
    return f"docker pull {ref} && docker tag {ref} {local} && docker rmi {ref} >/dev/null"


def ssh_pull_argv(ssh: list[str], command: str, tunnel_port: int | None) -> list[str]:
    """ssh's own options go before the target (the last word of `ssh`); -R only for the controller's
    registry."""
    *client, target = ssh
    options = [*SSH_OPTIONS, "-o", "ExitOnForwardFailure=yes"]
    if tunnel_port is not None:
        options += ["-R", f"127.0.0.1:{tunnel_port}:127.0.0.1:{tunnel_port}"]
    return [*client, *options, target, command]


def _tail(output: str, lines: int = 3) -> str:
    return " ".join(output.strip().splitlines()[-lines:])


def pull_error(rc: int, output: str, tunnel_port: int | None) -> str:
    tail = _tail(output)
    if tunnel_port is not None and TUNNEL_FAILED.search(output):
        return (
            f"could not open the tunnel to the controller's registry: port {tunnel_port} on the server's "
            "loopback is taken, or its sshd forbids forwarding (AllowTcpForwarding). Free the port or set "
            f"cluster_registry_port, allow forwarding, or set cluster_image_distribution: save_load ({tail})"
        )
    if rc == 255:
        return f"ssh to the server failed: {tail}"
    return f"the pull failed (rc {rc}): {tail}"


def receiver_error(rc: int, output: str, source: str, port: int) -> str:
    tail = _tail(output)
    if rc == 4:
        return (
            f"could not reach the image registry on the build server {source} through a tunnel over the "
            f"cluster's network (ssh to its address, port {port} on both loopbacks): {tail}. Check that this "
            f"server reaches {source}'s sshd (cluster_image_build_address), that port {port} is free here "
            "(cluster_registry_port) and that forwarding is allowed (AllowTcpForwarding)"
        )
    if rc == 255:
        return f"ssh to the server failed: {tail}"
    return f"the pull from the build server {source} failed (rc {rc}): {tail}"


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        # As the registry binds: a connection in TIME_WAIT does not hold the port, a listener does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _file_tail(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return _tail(handle.read())


@contextlib.contextmanager
def controller_registry(command: str, storage: str, port: int, workdir: str) -> Iterator[str]:
    """Docker's Distribution registry on 127.0.0.1:port while the block runs, also when it fails (and with
    this process); yields its log file."""
    if not port_free(port):
        raise DistributionError(
            f"port {port} on the controller's loopback is taken, so the image registry cannot start there: "
            "set cluster_registry_port to a free port"
        )
    os.makedirs(storage, mode=0o700, exist_ok=True)
    config, log = os.path.join(workdir, "config.yml"), os.path.join(workdir, "registry.log")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(registry_config(storage, port))
    with open(log, "wb") as out:
        try:
            process = subprocess.Popen(
                [command, "serve", config], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        except OSError as error:
            raise DistributionError(
                f"cannot start the image registry ({command}: {error.strerror}): install Docker's "
                "Distribution registry on the controller (apt-get install docker-registry; it need not run "
                "as a service), or set cluster_image_distribution: save_load"
            ) from error
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise DistributionError(f"the image registry exited at start: {_file_tail(log)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise DistributionError(
                    f"the image registry did not answer on 127.0.0.1:{port} within 30 s: {_file_tail(log)}"
                )
            time.sleep(0.2)
        yield log
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_bounded(argv: list[str], timeout: int, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """argv within timeout (rc 124 past it); ``stdin`` is its input, else it reads nothing."""
    try:
        if stdin is not None:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=stdin)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as error:
        output = (
            error.stdout if isinstance(error.stdout, str) else (error.stdout or b"").decode(errors="replace")
        )
        return subprocess.CompletedProcess(argv, 124, output, f"timed out after {timeout} s")


def push(image: str, reference: str, timeout: int) -> int:
    """Push the controller's image under the registry's name; returns the layers sent."""
    tagged = run_bounded(["docker", "tag", image, reference], 60)
    if tagged.returncode != 0:
        raise DistributionError(f"cannot tag {image} as {reference}: {tagged.stderr.strip()}")
    try:
        pushed = run_bounded(["docker", "push", reference], timeout)
    finally:
        run_bounded(["docker", "rmi", reference], 60)
    if pushed.returncode != 0:
        detail = _tail(pushed.stdout + pushed.stderr, 2)
        raise DistributionError(f"the push of {reference} failed (rc {pushed.returncode}): {detail}")
    return len(re.findall(r"^\w+: Pushed$", pushed.stdout, re.MULTILINE))


def pull_result(
    done: subprocess.CompletedProcess[str], started: float, timeout: int, error: str
) -> dict[str, Any]:
    """One server's pull as the report gives it; ``error`` says why a failed one failed (past the bound:
    that)."""
    pulled, present = layer_counts(done.stdout)
    if done.returncode == 124:
        error = f"the pull did not finish within {timeout} s (training_image_pull_timeout)"
    return {
        "ok": done.returncode == 0,
        "rc": done.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "layers_pulled": pulled,
        "layers_present": present,
        "error": "" if done.returncode == 0 else error,
        "output": (done.stdout + done.stderr).strip().splitlines()[-20:],
    }


def pull_everywhere(
    servers: list[dict[str, Any]], parallel: int, pull_one: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """pull_one(server) on every server, ``parallel`` at a time: the report's servers and failed_servers."""
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(servers)))) as pool:
        futures = [(server["name"], pool.submit(pull_one, server)) for server in servers]
        results = {name: future.result() for name, future in futures}
    return {
        "servers": results,
        "failed_servers": [name for name, result in results.items() if not result["ok"]],
    }


def pull(
    server: dict[str, Any], reference: str, image: str, tunnel_port: int | None, timeout: int
) -> dict[str, Any]:
    started = time.monotonic()
    argv = ssh_pull_argv([str(word) for word in server["ssh"]], pull_command(reference, image), tunnel_port)
    done = run_bounded(argv, timeout)
    return pull_result(
        done, started, timeout, pull_error(done.returncode, done.stdout + done.stderr, tunnel_port)
    )


class SessionLines:
    """Lines from a pipe, each within a deadline (select on the file descriptor, no buffering that select
    misses)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer, self.closed = fd, b"", False

    def next(self, deadline: float) -> str | None:
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if self.closed or remaining <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.closed = True
                if self.buffer:
                    line, self.buffer = self.buffer, b""
                    return line.decode(errors="replace")
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode(errors="replace")


def split_ssh(ssh: list[str]) -> tuple[str, str, str]:
    """The address, port and user that a server's ssh argv (ddp_ssh_targets) reaches: its target, -p, -l."""
    port, user = "22", ""
    for index, word in enumerate(ssh[:-1]):
        if word == "-p":
            port = ssh[index + 1]
        elif word == "-l":
            user = ssh[index + 1]
    target = ssh[-1]
    if "@" in target:
        user, target = target.rsplit("@", 1)
    return target, port, user


def _keypair(workdir: str, comment: str) -> tuple[str, str]:
    path = os.path.join(workdir, "key")
    made = run_bounded(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path], 60)
    if made.returncode != 0:
        raise DistributionError(
            f"cannot make the ephemeral key for the servers' tunnels: {made.stderr.strip()}"
        )
    with open(path, encoding="utf-8") as private, open(path + ".pub", encoding="utf-8") as public:
        return private.read(), public.read().strip()


def _source_ready(
    lines: SessionLines,
    stop: Callable[[], None],
    source: str,
    timeout: int,
    report: dict[str, Any],
    started: float,
) -> str:
    """Read the source's session up to ``ready``: the push's layers and seconds into report; its host keys,
    returned as known_hosts lines. A session that falls silent is stopped."""
    said: list[str] = []
    hostkeys: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        line = lines.next(deadline)
        if line is None:
            stop()
            detail = " ".join(said[-3:]) or "the session ended without a word"
            if time.monotonic() >= deadline:
                detail = f"no answer within {timeout} s (training_image_pull_timeout)"
            raise DistributionError(f"the build server {source}: {detail}")
        said.append(line)
        if line.startswith("error: "):
            raise DistributionError(f"the build server {source}: {line[len('error: ') :]}")
        if line.startswith("pushed: "):
            report["pushed_layers"] = int(line.split()[-1])
            report["push_seconds"] = round(time.monotonic() - started, 1)
        elif line.startswith("hostkey: "):
            hostkeys.append(line[len("hostkey: ") :])
        elif line == "ready":
            return "\n".join(hostkeys)


def distribute_from_source(params: Mapping[str, Any]) -> dict[str, Any]:
    """The image is on the source server's engine: the registry runs there, every other server pulls over the
    cluster's network through a tunnel to it. One ssh session to the source, as long as the call, holds the
    registry, the push and an ephemeral key authorized for nothing but that forward; closing its stdin stops
    the registry and deauthorizes the key."""
    image, port, source, timeout = params["image"], params["port"], params["source"], params["timeout"]
    reference = registry_reference(image, "", port)
    ssh = [str(word) for word in source["ssh"]]
    address, ssh_port, user = split_ssh(ssh)
    address = params["source_address"].strip() or address
    report: dict[str, Any] = {"reference": reference, "servers": {}, "failed_servers": [], "bytes_served": 0}
    comment = f"ddp-cluster-image-{os.urandom(6).hex()}"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ddp-image-key-") as workdir:
        private, public = _keypair(workdir, comment)
        *client, target = ssh
        argv = [*client, *SSH_OPTIONS, target,
                shlex.join(["sh", "-c", params["source_script"], "ddp-registry", str(port), params["storage"],
                            image, reference, params["registry_command"], public, comment])]  # fmt: skip
        session = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
        assert session.stdin is not None and session.stdout is not None
        lines = SessionLines(session.stdout.fileno())
        try:
            known = _source_ready(lines, session.kill, source["name"], timeout, report, started)

            def receive(server: dict[str, Any]) -> dict[str, Any]:
                command = shlex.join(["sh", "-c", params["receiver_script"], "ddp-pull", str(port), address,
                                      ssh_port, user, reference, image, known])  # fmt: skip
                begun = time.monotonic()
                argv = ssh_pull_argv([str(word) for word in server["ssh"]], command, None)
                done = run_bounded(argv, timeout, stdin=private)
                error = receiver_error(done.returncode, done.stdout + done.stderr, source["name"], port)
                return pull_result(done, begun, timeout, error)

            report.update(pull_everywhere(params["servers"], params["parallel"], receive))
        finally:
            with contextlib.suppress(OSError):
                session.stdin.close()  # the source's session ends: registry stopped, key deauthorized
            rest = []
            end = time.monotonic() + 60
            while True:
                line = lines.next(end)
                if line is None:
                    break
                rest.append(line)
            if session.poll() is None:
                session.kill()
            session.wait()
        report["bytes_served"] = sum(
            int(line.split()[-1]) for line in rest if re.fullmatch(r"served: \d+", line)
        )
    return report


def distribute(params: Mapping[str, Any]) -> dict[str, Any]:
    """Push once, pull on every server of ``params["servers"]``; the report (see the module's RETURN)."""
    if params.get("source"):
        return distribute_from_source(params)
    image, registry, port, timeout = params["image"], params["registry"], params["port"], params["timeout"]
    reference = registry_reference(image, registry, port)
    tunnel_port = None if registry.strip() else port
    report: dict[str, Any] = {"reference": reference, "servers": {}, "failed_servers": [], "bytes_served": 0}
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        log = ""
        if tunnel_port is not None:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="ddp-registry-"))
            log = stack.enter_context(
                controller_registry(params["registry_command"], params["storage"], port, workdir)
            )
        report["pushed_layers"] = push(image, reference, timeout)
        report["push_seconds"] = round(time.monotonic() - started, 1)
        served = stack.enter_context(open(log, encoding="utf-8", errors="replace")) if log else None
        if served is not None:
            served.seek(0, os.SEEK_END)  # what the servers' pulls were served, not the push
        report.update(pull_everywhere(
            params["servers"], params["parallel"],
            lambda server: pull(server, reference, image, tunnel_port, timeout),
        ))  # fmt: skip
        if served is not None:
            report["bytes_served"] = bytes_served(served.read())
    return report


def run(params: Mapping[str, Any], check_mode: bool) -> tuple[bool, dict[str, Any]]:
    """The module's call: (failed, result). Nothing to do, or check mode: the reference alone. A server
    whose pull failed is listed in failed_servers (the role fails it by name); only the registry or the push
    fail the call."""
    servers = params["servers"]
    reference = registry_reference(
        params["image"], "" if params["source"] else params["registry"], params["port"]
    )
    if not servers or check_mode:
        return False, {"changed": bool(servers), "reference": reference, "servers": {}, "failed_servers": [],
                       "push_seconds": 0.0, "pushed_layers": 0, "bytes_served": 0}  # fmt: skip
    try:
        report = distribute(params)
    except DistributionError as error:
        return True, {"msg": str(error), "reference": reference, "servers": {}, "failed_servers": []}
    report["changed"] = len(report["failed_servers"]) < len(servers)
    return False, report
