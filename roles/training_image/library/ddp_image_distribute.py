#!/usr/bin/python
"""Ship the node image from the controller to servers through a registry: push once, every server pulls the
layers it lacks, in parallel."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ddp_image_distribute
short_description: Push an image to a registry once and pull it on every server that lacks it
description:
  - Runs on the controller. With no C(registry), starts Docker's Distribution registry (C(docker-registry
    serve), the Debian package) bound to the controller's 127.0.0.1:C(port) for the duration of the call, its
    storage kept in C(storage) so that a later push sends only new layers. Each server pulls
    C(127.0.0.1:port/NAME:TAG) through C(ssh -R 127.0.0.1:port:127.0.0.1:port); its engine treats a
    127.0.0.0/8 registry as insecure by default, so no engine setting changes, and nothing listens beyond
    loopback. The tunnel lives as long as that server's pull; the registry stops when the call ends, also on
    failure (and with the module's process).
  - A server whose pull fails is listed in C(failed_servers) with its reason (the call itself fails only when
    the registry or the push does), so that the role can fail that server by name.
  - With C(registry) (the user's registry, e.g. C(harbor.example.com/ml)), pushes there (the controller's
    engine must be logged in) and each server pulls from it directly, over the same ssh command without a
    tunnel.
  - Every server gets the image under its local name C(image) (the registry's name is removed again), so the
    containers stage needs nothing else.
  - With C(source) (a server build, cluster_image_builder), the image is on that server's engine, not the
    controller's, and nothing of it crosses the controller's link. One ssh session to the source, which lives
    as long as the call, holds Distribution registry on the source's 127.0.0.1:C(port) (storage under
    C(storage) there, kept between runs), the push into it, and an ephemeral ed25519 key (made on the
    controller for this call) authorized there for nothing but a forward to that port
    (C(restrict,port-forwarding,permitopen)). Each server lacking the image receives the private half on stdin
    into a 0700 temporary directory, opens C(ssh -N -L) to the source over the cluster's own network, the
    source's host keys pinned (read from the source over the controller's pinned login), pulls the layers it
    lacks from its own loopback, and removes key and tunnel. When the call ends (also on failure, or when the
    controller goes away) the registry stops and the key is deauthorized; nothing is left listening or
    authorized on any server.
options:
  image:
    description: The image on the controller, NAME:TAG.
    type: str
    required: true
  servers:
    description: The servers that lack it, each C(name) and C(ssh) (the argv that logs in, the target last).
    type: list
    elements: dict
    required: true
  registry:
    description: The user's registry (host[:port][/path]); empty runs one on the controller's loopback.
    type: str
    default: ""
  port:
    description: The controller's and each server's loopback port for the registry that this module runs.
    type: int
    default: 15000
  registry_command:
    description: Docker's Distribution registry (2.x) binary.
    type: str
    default: docker-registry
  storage:
    description: The registry's storage directory on the controller (kept between runs).
    type: path
    required: true
  parallel:
    description: Servers pulling at the same time.
    type: int
    default: 16
  timeout:
    description: Seconds one server's pull may take; the push gets the same bound.
    type: int
    default: 1800
  source:
    description: The build server holding the image (C(name), C(ssh) as in C(servers)); empty, the controller.
    type: dict
  source_address:
    description: The source's address as the other servers reach it (default the last word of its C(ssh)).
    type: str
    default: ""
  source_script:
    description: The source's side (the role's files/registry-source.sh).
    type: str
    default: ""
  receiver_script:
    description: Each server's side (the role's files/pull-from-source.sh).
    type: str
    default: ""
"""

RETURN = r"""
reference:
  description: The name the servers pulled.
  type: str
  returned: always
push_seconds:
  description: Seconds the push took.
  type: float
  returned: always
pushed_layers:
  description: Layers the push sent (the others were in the registry already).
  type: int
  returned: always
servers:
  description: Per server name, ok, rc, seconds, layers_pulled, layers_present, error and the output's last
    lines.
  type: dict
  returned: always
failed_servers:
  description: The names of the servers whose pull failed.
  type: list
  returned: always
bytes_served:
  description: Bytes of layers and manifests the controller's registry sent to the servers (0 for a user
    registry).
  type: int
  returned: always
"""

import contextlib  # noqa: E402  (Ansible modules put DOCUMENTATION first)
import ctypes  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import select  # noqa: E402
import shlex  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from typing import Any  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

PR_SET_PDEATHSIG = 1
# The registry's access log: `... http.request.method=GET ... http.response.written=N ...` per response.
WRITTEN = re.compile(r"http\.request\.method=GET\b.*?http\.response\.written=(\d+)")
TUNNEL_FAILED = re.compile(
    r"remote port forwarding failed|cannot listen to port|Could not request", re.IGNORECASE
)


class DistributionError(Exception):
    """A step that stops the whole distribution (the registry, the push), with what to do about it."""


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
    options = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=30", "-o", "ServerAliveInterval=15",
               "-o", "ServerAliveCountMax=4", "-o", "ExitOnForwardFailure=yes"]  # fmt: skip
    if tunnel_port is not None:
        options += ["-R", f"127.0.0.1:{tunnel_port}:127.0.0.1:{tunnel_port}"]
    return [*client, *options, target, command]


def pull_error(rc: int, output: str, tunnel_port: int | None) -> str:
    tail = " ".join(output.strip().splitlines()[-3:])
    if tunnel_port is not None and TUNNEL_FAILED.search(output):
        return (
            f"could not open the tunnel to the controller's registry: port {tunnel_port} on the server's "
            "loopback is taken, or its sshd forbids forwarding (AllowTcpForwarding). Free the port or set "
            f"cluster_registry_port, allow forwarding, or set cluster_image_distribution: save_load ({tail})"
        )
    if rc == 255:
        return f"ssh to the server failed: {tail}"
    return f"the pull failed (rc {rc}): {tail}"


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        # As the registry binds: a connection in TIME_WAIT does not hold the port, a listener does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def controller_registry(command: str, storage: str, port: int, workdir: str) -> Iterator[str]:
    """Docker's Distribution registry on 127.0.0.1:port while the block runs; yields its log file."""
    if not _port_free(port):
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
                raise DistributionError(f"the image registry exited at start: {_tail(log)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise DistributionError(
                    f"the image registry did not answer on 127.0.0.1:{port} within 30 s: {_tail(log)}"
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


def _tail(path: str, lines: int = 3) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return " ".join(handle.read().strip().splitlines()[-lines:])


def _run(argv: list[str], timeout: int, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
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
    tagged = _run(["docker", "tag", image, reference], 60)
    if tagged.returncode != 0:
        raise DistributionError(f"cannot tag {image} as {reference}: {tagged.stderr.strip()}")
    try:
        pushed = _run(["docker", "push", reference], timeout)
    finally:
        _run(["docker", "rmi", reference], 60)
    if pushed.returncode != 0:
        detail = " ".join((pushed.stdout + pushed.stderr).strip().splitlines()[-2:])
        raise DistributionError(f"the push of {reference} failed (rc {pushed.returncode}): {detail}")
    return len(re.findall(r"^\w+: Pushed$", pushed.stdout, re.MULTILINE))


def pull_result(
    done: subprocess.CompletedProcess[str], started: float, timeout: int, error: str
) -> dict[str, Any]:
    """One server's pull as the report gives it; ``error`` says why a failed one failed (past the bound:
    that)."""
    output = done.stdout + done.stderr
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
        "output": output.strip().splitlines()[-20:],
    }


def pull_everywhere(servers: list[dict[str, Any]], parallel: int, pull_one: Any) -> dict[str, Any]:
    """pull_one(server) on every server, ``parallel`` at a time: the report's servers and failed_servers."""
    results: dict[str, Any] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(servers)))) as pool:
        for server, result in zip(servers, pool.map(pull_one, servers), strict=True):
            results[server["name"]] = result
    return {
        "servers": results,
        "failed_servers": [name for name, result in results.items() if not result["ok"]],
    }


def pull(
    server: dict[str, Any], reference: str, image: str, tunnel_port: int | None, timeout: int
) -> dict[str, Any]:
    started = time.monotonic()
    argv = ssh_pull_argv([str(word) for word in server["ssh"]], pull_command(reference, image), tunnel_port)
    done = _run(argv, timeout)
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


def receiver_error(rc: int, output: str, source: str, port: int) -> str:
    tail = " ".join(output.strip().splitlines()[-3:])
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


def _keypair(workdir: str, comment: str) -> tuple[str, str]:
    path = os.path.join(workdir, "key")
    made = _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path], 60)
    if made.returncode != 0:
        raise DistributionError(
            f"cannot make the ephemeral key for the servers' tunnels: {made.stderr.strip()}"
        )
    with open(path, encoding="utf-8") as private, open(path + ".pub", encoding="utf-8") as public:
        return private.read(), public.read().strip()


def distribute_from_source(params: dict[str, Any]) -> dict[str, Any]:
    """The image is on the source server's engine: registry there, every other server pulls over the cluster's
    network through a tunnel to it (see DOCUMENTATION)."""
    image, port, source = params["image"], params["port"], params["source"]
    reference = registry_reference(image, "", port)
    servers = params["servers"]
    ssh = [str(word) for word in source["ssh"]]
    address, ssh_port, user = split_ssh(ssh)
    address = params["source_address"].strip() or address
    report: dict[str, Any] = {"reference": reference, "servers": {}, "failed_servers": [], "bytes_served": 0}
    comment = f"ddp-cluster-image-{os.urandom(6).hex()}"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ddp-image-key-") as workdir:
        private, public = _keypair(workdir, comment)
        *client, target = ssh
        argv = [*client, "-o", "BatchMode=yes", "-o", "ConnectTimeout=30", "-o", "ServerAliveInterval=15",
                "-o", "ServerAliveCountMax=4", target,
                shlex.join(["sh", "-c", params["source_script"], "ddp-registry", str(port), params["storage"],
                            image, reference, params["registry_command"], public, comment])]  # fmt: skip
        session = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
        assert session.stdin is not None and session.stdout is not None
        lines = SessionLines(session.stdout.fileno())
        try:
            said: list[str] = []
            hostkeys: list[str] = []
            deadline = time.monotonic() + params["timeout"]
            while True:
                line = lines.next(deadline)
                if line is None:
                    session.kill()
                    detail = " ".join(said[-3:]) or "the session ended without a word"
                    if time.monotonic() >= deadline:
                        detail = f"no answer within {params['timeout']} s (training_image_pull_timeout)"
                    raise DistributionError(f"the build server {source['name']}: {detail}")
                said.append(line)
                if line.startswith("error: "):
                    raise DistributionError(f"the build server {source['name']}: {line[len('error: ') :]}")
                if line.startswith("pushed: "):
                    report["pushed_layers"] = int(line.split()[-1])
                    report["push_seconds"] = round(time.monotonic() - started, 1)
                elif line.startswith("hostkey: "):
                    hostkeys.append(line[len("hostkey: ") :])
                elif line == "ready":
                    break
            known = "\n".join(hostkeys)

            def receive(server: dict[str, Any]) -> dict[str, Any]:
                command = shlex.join(["sh", "-c", params["receiver_script"], "ddp-pull", str(port), address,
                                      ssh_port, user, reference, image, known])  # fmt: skip
                begun = time.monotonic()
                argv = ssh_pull_argv([str(word) for word in server["ssh"]], command, None)
                done = _run(argv, params["timeout"], stdin=private)
                error = receiver_error(done.returncode, done.stdout + done.stderr, source["name"], port)
                return pull_result(done, begun, params["timeout"], error)

            report |= pull_everywhere(servers, params["parallel"], receive)
        finally:
            with contextlib.suppress(OSError):
                session.stdin.close()  # the source's session ends: registry stopped, key deauthorized
            rest = []
            end = time.monotonic() + 60
            while (line := lines.next(end)) is not None:
                rest.append(line)
            if session.poll() is None:
                session.kill()
            session.wait()
        report["bytes_served"] = sum(
            int(line.split()[-1]) for line in rest if re.fullmatch(r"served: \d+", line)
        )
    return report


def distribute(params: dict[str, Any]) -> dict[str, Any]:
    if params.get("source"):
        return distribute_from_source(params)
    image, registry, port = params["image"], params["registry"], params["port"]
    reference = registry_reference(image, registry, port)
    tunnel_port = None if registry.strip() else port
    servers = params["servers"]
    report: dict[str, Any] = {"reference": reference, "servers": {}, "failed_servers": [], "bytes_served": 0}

    def pull_all() -> None:
        report.update(pull_everywhere(
            servers, params["parallel"],
            lambda server: pull(server, reference, image, tunnel_port, params["timeout"]),
        ))  # fmt: skip

    started = time.monotonic()
    if tunnel_port is None:
        report["pushed_layers"] = push(image, reference, params["timeout"])
        report["push_seconds"] = round(time.monotonic() - started, 1)
        pull_all()
        return report
    with tempfile.TemporaryDirectory(prefix="ddp-registry-") as workdir, controller_registry(
        params["registry_command"], params["storage"], port, workdir
    ) as log:
        report["pushed_layers"] = push(image, reference, params["timeout"])
        report["push_seconds"] = round(time.monotonic() - started, 1)
        with open(log, encoding="utf-8", errors="replace") as handle:
            handle.seek(0, os.SEEK_END)
            pull_all()
            report["bytes_served"] = bytes_served(handle.read())
    return report


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "image": {"type": "str", "required": True},
            "servers": {"type": "list", "elements": "dict", "required": True},
            "registry": {"type": "str", "default": ""},
            "port": {"type": "int", "default": 15000},
            "registry_command": {"type": "str", "default": "docker-registry"},
            "storage": {"type": "path", "required": True},
            "parallel": {"type": "int", "default": 16},
            "timeout": {"type": "int", "default": 1800},
            "source": {"type": "dict"},
            "source_address": {"type": "str", "default": ""},
            "source_script": {"type": "str", "default": ""},
            "receiver_script": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    params = module.params
    reference = registry_reference(
        params["image"], "" if params["source"] else params["registry"], params["port"]
    )
    if not params["servers"] or module.check_mode:
        module.exit_json(changed=bool(params["servers"]), reference=reference, servers={}, failed_servers=[],
                         push_seconds=0.0, pushed_layers=0, bytes_served=0)  # fmt: skip
    try:
        report = distribute(params)
    except DistributionError as error:
        module.fail_json(msg=str(error), reference=reference, servers={}, failed_servers=[])
    # A server whose pull failed is failed by the role, under its own name (the run stops before any
    # container).
    module.exit_json(changed=len(report["failed_servers"]) < len(params["servers"]), **report)


if __name__ == "__main__":
    main()
