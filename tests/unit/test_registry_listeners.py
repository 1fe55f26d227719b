"""The image stage's registry login goes only to a listener of ours (issue 45, point 11).

A job on a server's host network can listen on the loopback port of a tunnel, a relay or a registry of the
image stage before it is bound, and answer HTTP as a registry would; an engine logs in to whatever answers.
Here a "job" (a listener that records every request it gets, and answers /v2/ with a Basic login challenge)
holds the port first, or takes it while the stage's own process starts: the servers' scripts (the role's
files/pull-image.sh and registry-source.sh) and the controller's registry (ddp_cluster.image.distribute)
refuse, naming the port and the job's process, and the job gets no request at all, the login least of all.
The rule itself (:data:`distribute.HOLDER_CHECK`) is checked against listeners of this process, of a child and
of a parent; with a real sshd where one is installed, the ssh -R and ssh -L forwards that the scripts check.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_cluster.image import distribute as dist

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "roles" / "training_image" / "files"
PULL_SCRIPT = FILES / "pull-image.sh"
SOURCE_SCRIPT = FILES / "registry-source.sh"
# The scripts as the controller sends them: their listeners' functions put in (distribute.with_listeners).
PULL = dist.with_listeners(PULL_SCRIPT.read_text())
SOURCE = dist.with_listeners(SOURCE_SCRIPT.read_text())
DIGEST = "sha256:6087a7c117ca9ea0ac4b4e3b45534ac95779d8b0ca533dfdff6a1cc1e293bcc4"
BUILT_ID = "sha256:2ada85227f55b01da1014b2f82fb37d388f0511e20173b6555aa40f2b19e371e"
AUTH = "ZGRwLWNsdXN0ZXI6c2VjcmV0"  # base64 of ddp-cluster:secret

# The job's listener: every request's first line and headers into LOG, a registry's login challenge for /v2/.
# Arguments: PORT LOG [ADDRESS].
JOB = r"""
import http.server, sys
port, log = int(sys.argv[1]), sys.argv[2]
address = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log, "a") as handle:
            handle.write(self.requestline + "\n" + str(self.headers))
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="ddp-cluster-image"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


http.server.HTTPServer((address, port), Handler).serve_forever()
"""

# docker double: each call into $DDP_FAKE_LOG; `image inspect` answers the built image's ID.
DOCKER = f"""#!/bin/sh
printf 'docker %s\\n' "$*" >> "$DDP_FAKE_LOG"
case "$1" in
  pull) echo "0123456789ab: Pull complete" ;;
  image) echo "{BUILT_ID}" ;;
  push) echo "02c5ea5f2dfa: Pushed"; echo "ab12: digest: {DIGEST} size: 1573" ;;
esac
"""

# A process started for the stage (a tunnel's ssh, a registry) that does not bind its port itself: another
# process does, apart from it (the job, taking the port while ours starts). It writes that process's PID to
# $DDP_FAKE_JOB_PID and waits.
ELSEWHERE = f"""#!/bin/sh
for arg; do case $arg in 127.0.0.1:*) spec=$arg ;; esac; done
port=${{DDP_FAKE_PORT:-$(echo "$spec" | cut -d: -f2)}}
setsid {sys.executable} "$DDP_FAKE_JOB" "$port" "$DDP_FAKE_JOB_LOG" < /dev/null > /dev/null 2>&1 &
echo $! > "$DDP_FAKE_JOB_PID"
exec sleep 60
"""

# An ssh -L tunnel that holds its own listener (exec: the process the script started is the one that binds):
# /v2/ answers 401, as the registry at its far end does. It records the requests, which carry no login.
TUNNEL = f"""#!/bin/sh
for arg; do case $arg in 127.0.0.1:*) spec=$arg ;; esac; done
exec {sys.executable} "$DDP_FAKE_JOB" "$(echo "$spec" | cut -d: -f2)" "$DDP_FAKE_TUNNEL_LOG"
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_listening(port: int, address: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as probe:
            if probe.connect_ex((address, port)) == 0:
                return
        assert time.monotonic() < deadline, f"nothing listens on {address}:{port}"
        time.sleep(0.05)


def stop(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


class Job:
    """A job's listener already on the port, in a process of its own."""

    def __init__(self, tmp_path: Path, port: int, address: str = "127.0.0.1") -> None:
        self.log = tmp_path / f"job-{port}.log"
        self.log.touch()
        program = tmp_path / "job.py"
        program.write_text(JOB)
        self.process = subprocess.Popen(
            [sys.executable, str(program), str(port), str(self.log), address], start_new_session=True
        )
        wait_listening(port)

    @property
    def pid(self) -> int:
        return self.process.pid

    def requests(self) -> str:
        return self.log.read_text()

    def end(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def doubles(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a script run with the docker double, a job's program, and the logs; the job a double
    started (DDP_FAKE_JOB_PID) is stopped at the end."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(DOCKER)
    (bin_dir / "docker").chmod(0o755)
    # Debian's docker-registry where the machine has none (make check needs no registry): on a port another
    # process holds it stops at once, as the real one does.
    (bin_dir / "docker-registry").write_text(
        "#!/bin/sh\necho 'listen tcp: bind: address already in use' >&2\nexit 1\n"
    )
    (bin_dir / "docker-registry").chmod(0o755)
    (tmp_path / "job.py").write_text(JOB)
    env = os.environ | {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path / "home"),
        "DDP_FAKE_LOG": str(tmp_path / "docker.log"),
        "DDP_FAKE_JOB": str(tmp_path / "job.py"),
        "DDP_FAKE_JOB_LOG": str(tmp_path / "late-job.log"),
        "DDP_FAKE_JOB_PID": str(tmp_path / "late-job.pid"),
        "DDP_FAKE_TUNNEL_LOG": str(tmp_path / "tunnel.log"),
    }
    (tmp_path / "home").mkdir()
    for name in ("docker.log", "late-job.log", "tunnel.log"):
        (tmp_path / name).touch()
    env.pop("DOCKER_CONFIG", None)
    yield env
    pid_file = tmp_path / "late-job.pid"
    if pid_file.exists() and pid_file.read_text().strip():
        stop(int(pid_file.read_text()))


def with_ssh(env: dict[str, str], tmp_path: Path, script: str) -> dict[str, str]:
    """``env`` with an ``ssh`` double running ``script`` first on PATH."""
    bin_dir = tmp_path / "ssh-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ssh").write_text(script)
    (bin_dir / "ssh").chmod(0o755)
    return env | {"PATH": f"{bin_dir}:{env['PATH']}"}


def pull(env: dict[str, str], *args: str, stdin: str = f"{AUTH}\n") -> subprocess.CompletedProcess[str]:
    pulled = f"127.0.0.1:15000/ddp-cluster/node@{DIGEST}"
    return subprocess.run(
        ["sh", "-c", PULL, "ddp-pull", pulled, "ddp-cluster/node:ab12", BUILT_ID, *args],
        input=stdin, capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


def refused(done: subprocess.CompletedProcess[str], port: int, pid: int) -> str:
    """The script's refusal, checked: exit PORT_HELD, its error line naming the port and the job's process."""
    output = done.stdout + done.stderr
    assert done.returncode == dist.PORT_HELD, output
    said = dist.said_error(output)
    assert said.startswith(f"port {port} on the server's loopback is taken by pid {pid} ("), said
    assert "nothing was sent to it, the registry's password included" in said
    assert f"ss -ltnp 'sport = :{port}'" in said and "cluster_registry_port" in said
    return said


# --- the rule, on this machine ------------------------------------------------------------------------------


def test_the_scripts_are_sent_with_the_controllers_holder_check_in_their_listeners_functions() -> None:
    for script, sent in ((PULL_SCRIPT, PULL), (SOURCE_SCRIPT, SOURCE)):
        assert script.read_text().count(f"\n{dist.LISTENERS_MARK}\n") == 1, script.name
        assert dist.LISTENERS_MARK not in sent and "\nowned() {" in sent and "\nanswers() {" in sent
        holder = r"^holder\(\) \{.*?python3 -c '(.*?)' \"\$@\" 2>&1$"
        program = re.search(holder, sent, re.MULTILINE | re.DOTALL)
        assert program and program.group(1) == dist.HOLDER_CHECK.strip("\n"), script.name
        assert subprocess.run(["sh", "-n", "-c", sent], check=False).returncode == 0, script.name


def test_a_listener_is_ours_only_when_a_process_named_for_it_holds_it(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    port = free_port()
    assert dist.port_holder(port, [str(os.getpid())]) == (1, "")
    with socket.socket() as own:
        own.bind(("127.0.0.1", port))
        own.listen()
        assert dist.port_holder(port, [str(os.getpid())]) == (0, "")
        # A child asked with `ancestors`: this process is one of them (the sshd session whose ssh -R it is).
        child = subprocess.run([sys.executable, "-c", dist.HOLDER_CHECK, str(port), "ancestors"], check=False)
        assert child.returncode == 0
        # Anyone else's view: another process holds it, named.
        held, said = dist.port_holder(port, [str(os.getppid())])
        assert held == 2 and said.startswith(f"pid {os.getpid()} ("), said
    # A job listening on every address (0.0.0.0) reaches 127.0.0.1 too; a command line's control characters
    # are not printed.
    job = subprocess.Popen(
        ["\x1b]52;c;aGk=\x07job", str(tmp_path / "job.py"), str(port), str(tmp_path / "log"), "0.0.0.0"],
        executable=sys.executable,
        start_new_session=True,
    )
    try:
        wait_listening(port)
        held, said = dist.port_holder(port, [str(os.getpid())])
        assert held == 2 and said.startswith(f"pid {job.pid} (?]52;c;aGk=?job {tmp_path / 'job.py'} "), said
        assert "\x1b" not in said and "\x07" not in said
    finally:
        job.kill()
        job.wait()


# --- pull-image.sh ------------------------------------------------------------------------------------------


def test_a_pull_through_a_build_servers_tunnel_refuses_a_port_a_job_holds_before_its_ssh_starts(
    tmp_path: Path, doubles: dict[str, str]
) -> None:
    port = free_port()
    job = Job(tmp_path, port)
    env = with_ssh(doubles, tmp_path, TUNNEL)
    try:
        done = pull(env, str(port), "10.0.0.9", "22", "", "ssh-ed25519 AAAAsource", stdin=f"{AUTH}\nKEY\n")
        refused(done, port, job.pid)
    finally:
        job.end()
    assert job.requests() == "", "the job's listener was asked something"
    assert Path(doubles["DDP_FAKE_LOG"]).read_text() == "", "docker ran"
    assert Path(doubles["DDP_FAKE_TUNNEL_LOG"]).read_text() == "", "the tunnel's ssh was started"
    assert dist.pull_error(done.returncode, done.stdout, None).startswith(f"port {port} on the server's")
    assert not dist.passing(done.returncode, done.stdout + done.stderr)


def test_a_pull_refuses_a_job_that_takes_the_port_while_its_tunnel_starts(
    tmp_path: Path, doubles: dict[str, str]
) -> None:
    port = free_port()
    env = with_ssh(doubles, tmp_path, ELSEWHERE)
    done = pull(env, str(port), "10.0.0.9", "22", "", "ssh-ed25519 AAAAsource", stdin=f"{AUTH}\nKEY\n")
    job = int(Path(doubles["DDP_FAKE_JOB_PID"]).read_text())
    refused(done, port, job)
    assert "not by this pull's tunnel to the build server (ssh -L, pid " in done.stdout
    assert (
        Path(doubles["DDP_FAKE_JOB_LOG"]).read_text() == ""
        and Path(doubles["DDP_FAKE_LOG"]).read_text() == ""
    )
    assert dist.receiver_error(done.returncode, done.stdout, "atlas0", port) == dist.said_error(done.stdout)


def test_a_pull_through_its_own_tunnel_goes_on_and_sends_its_login_only_to_the_engine(
    tmp_path: Path, doubles: dict[str, str]
) -> None:
    port = free_port()
    env = with_ssh(doubles, tmp_path, TUNNEL)
    done = pull(env, str(port), "10.0.0.9", "22", "", "ssh-ed25519 AAAAsource", stdin=f"{AUTH}\nKEY\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tunnel: up" in done.stdout.splitlines()
    assert "docker pull 127.0.0.1:15000/ddp-cluster/node@" in Path(doubles["DDP_FAKE_LOG"]).read_text()
    # The script asked the tunnel whether the registry answers, without a login.
    asked = Path(doubles["DDP_FAKE_TUNNEL_LOG"]).read_text()
    assert asked.startswith("GET /v2/ ") and "Authorization" not in asked


def test_a_pull_from_the_controllers_registry_refuses_a_port_its_sessions_sshd_does_not_hold(
    tmp_path: Path, doubles: dict[str, str]
) -> None:
    port = free_port()
    job = Job(tmp_path, port)
    try:
        done = pull(doubles, str(port))
        said = refused(done, port, job.pid)
    finally:
        job.end()
    assert "not by this session's sshd (the controller's ssh -R to its registry)" in said
    assert job.requests() == "" and Path(doubles["DDP_FAKE_LOG"]).read_text() == ""
    # Nothing listens (sshd did not open the forward): no pull either, and the reason.
    done = pull(doubles, str(port))
    assert done.returncode == dist.TUNNEL_DOWN and "the controller's ssh -R did not open it" in done.stderr
    assert Path(doubles["DDP_FAKE_LOG"]).read_text() == ""


def test_a_pull_from_the_controllers_registry_goes_on_when_its_parent_holds_the_port(
    tmp_path: Path, doubles: dict[str, str]
) -> None:
    """The parent stands for the sshd session whose ssh -R forward it is: it holds the listener and runs the
    script as its child."""
    port = free_port()
    parent = (
        "import socket, subprocess, sys\n"
        "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(8)\n"
        "import threading\n"
        "def serve():\n"
        "    while True:\n"
        "        c, _ = s.accept(); c.recv(65536)\n"
        "        c.sendall(b'HTTP/1.1 401 Unauthorized\\r\\nContent-Length: 0\\r\\n'\n"
        "                  b'Connection: close\\r\\n\\r\\n')\n"
        "        c.close()\n"
        "threading.Thread(target=serve, daemon=True).start()\n"
        "sys.exit(subprocess.run(sys.argv[2:], input=sys.stdin.read(), text=True).returncode)\n"
    )
    pulled = f"127.0.0.1:{port}/ddp-cluster/node@{DIGEST}"
    done = subprocess.run(
        [sys.executable, "-c", parent, str(port), "sh", "-c", PULL, "ddp-pull", pulled,
         "ddp-cluster/node:ab12", BUILT_ID, str(port)],
        input=f"{AUTH}\n", capture_output=True, text=True, env=doubles, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"docker pull {pulled}" in Path(doubles["DDP_FAKE_LOG"]).read_text()


# --- registry-source.sh -------------------------------------------------------------------------------------


def source(env: dict[str, str], *args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", SOURCE, "ddp-registry", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip


def test_a_build_servers_registry_is_not_pushed_to_when_a_job_holds_its_port(
    tmp_path: Path, doubles: dict[str, str]
) -> None:
    port = free_port()
    job = Job(tmp_path, port)
    args = (str(port), str(tmp_path / "storage"), "ddp-cluster/node:ab12",
            f"127.0.0.1:{port}/ddp-cluster/node:ab12", "docker-registry", "ssh-ed25519 KEY",
            "ddp-cluster-image-1")  # fmt: skip
    try:
        done = source(doubles, *args, stdin="secret\n")
        said = refused(done, port, job.pid)
    finally:
        job.end()
    assert "not by the image registry of this build server" in said
    # The registry that is started does not bind the port itself: another process takes it meanwhile.
    registry = tmp_path / "registry"
    registry.write_text(ELSEWHERE)
    registry.chmod(0o755)
    done = source(
        doubles | {"DDP_FAKE_PORT": str(port)}, *args[:4], str(registry), *args[5:], stdin="secret\n"
    )
    said = refused(done, port, int(Path(doubles["DDP_FAKE_JOB_PID"]).read_text()))
    assert "not by the image registry of this build server (pid " in said
    assert job.requests() == "" and Path(doubles["DDP_FAKE_JOB_LOG"]).read_text() == ""
    assert "push" not in Path(doubles["DDP_FAKE_LOG"]).read_text()


def test_a_tier1_cache_sends_nothing_upstream_through_a_port_its_sessions_sshd_does_not_hold(
    tmp_path: Path, doubles: dict[str, str]
) -> None:
    port, up = free_port(), free_port()
    job = Job(tmp_path, up)
    try:
        done = source(
            doubles, "proxy", str(port), str(tmp_path / "cache"),
            f"127.0.0.1:{port}/ddp-cluster/node@{DIGEST}", "ddp-cluster/node:ab12", BUILT_ID,
            "docker-registry", "ssh-ed25519 KEY", "ddp-cluster-image-1", str(up),
            stdin="secret\n-----BEGIN KEY-----\n-----END KEY-----\n",
        )  # fmt: skip
        said = refused(done, up, job.pid)
    finally:
        job.end()
    assert "not by this session's sshd (the controller's ssh -R to its registry)" in said
    # No pull through a cache, no relay, no registry: only the cleanup's removal of what it never pulled.
    assert job.requests() == "" and "docker pull" not in Path(doubles["DDP_FAKE_LOG"]).read_text()
    assert "relay" not in done.stdout and not (tmp_path / "cache").exists()


# --- the controller's registry ------------------------------------------------------------------------------


def test_the_controllers_registry_is_not_logged_in_to_when_another_process_answers_on_its_port(
    tmp_path: Path, doubles: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = tmp_path / "registry"
    registry.write_text(ELSEWHERE)
    registry.chmod(0o755)
    port = free_port()
    for name in ("DDP_FAKE_JOB", "DDP_FAKE_JOB_LOG", "DDP_FAKE_JOB_PID"):
        monkeypatch.setenv(name, doubles[name])
    monkeypatch.setenv("DDP_FAKE_PORT", str(port))
    with (
        pytest.raises(dist.DistributionError) as raised,
        dist.controller_registry(str(registry), str(tmp_path / "storage"), port, str(tmp_path), "secret"),
    ):
        pass
    job = int(Path(doubles["DDP_FAKE_JOB_PID"]).read_text())
    said = str(raised.value)
    assert said.startswith(f"port {port} on the controller's loopback is taken by pid {job} ("), said
    assert f"not by the image registry ({registry})" in said and "nothing was sent to it" in said
    assert Path(doubles["DDP_FAKE_JOB_LOG"]).read_text() == "", "the job was sent the ping's login"


# --- with a real sshd ---------------------------------------------------------------------------------------

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A private sshd on this machine's loopback that takes a key made here (root: sshd's privilege
    separation); its port, the client's key and the known_hosts line."""
    if not os.path.exists(SSHD) or os.geteuid() != 0:
        pytest.skip("needs openssh-server's sshd and root")
    keys = tmp_path / "sshd"
    keys.mkdir()
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True)
    (keys / "authorized_keys").write_text((keys / "client.pub").read_text())
    port = free_port()
    (keys / "config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {keys / 'host'}\n"
        f"AuthorizedKeysFile {keys}/authorized_keys\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        f"StrictModes no\nAllowTcpForwarding yes\nPidFile {keys / 'pid'}\n"
    )
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    daemon = subprocess.Popen([SSHD, "-D", "-e", "-f", str(keys / "config")], stderr=subprocess.DEVNULL)
    try:
        wait_listening(port)
        host_key = " ".join((keys / "host.pub").read_text().split()[:2])
        (keys / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key}\n")
        yield {"port": str(port), "key": str(keys / "client"), "known_hosts": str(keys / "known_hosts"),
               "host_key": host_key}  # fmt: skip
    finally:
        daemon.terminate()
        daemon.wait()


def test_with_a_real_sshd_the_pull_checks_the_ssh_R_forward_and_refuses_the_job_that_holds_its_port(
    tmp_path: Path, doubles: dict[str, str], sshd: dict[str, str]
) -> None:
    registry, port = free_port(), free_port()
    answering = Job(tmp_path, registry)  # the controller's registry, at the forward's far end
    pulled = f"127.0.0.1:{port}/ddp-cluster/node@{DIGEST}"
    environment = " ".join(f"{name}={doubles[name]}" for name in ("PATH", "DDP_FAKE_LOG"))
    command = f"env {environment} " + dist.pull_command(
        PULL, pulled, "ddp-cluster/node:ab12", BUILT_ID, (str(port),)
    )
    ssh = ["ssh", "-i", sshd["key"], "-o", "IdentitiesOnly=yes",
           "-o", f"UserKnownHostsFile={sshd['known_hosts']}", "-o", "StrictHostKeyChecking=yes",
           "-p", sshd["port"], "-l", "root", "127.0.0.1"]  # fmt: skip
    *client, target = dist.ssh_pull_argv(ssh, command, port)
    forward = client.index("-R") + 1
    client[forward] = f"127.0.0.1:{port}:127.0.0.1:{registry}"
    try:
        done = subprocess.run(
            [*client, target], input=f"{AUTH}\n", capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"docker pull {pulled}" in Path(doubles["DDP_FAKE_LOG"]).read_text()
        # A job holds the port first: sshd cannot bind the forward, the script names the job, pulls nothing.
        Path(doubles["DDP_FAKE_LOG"]).write_text("")
        job = Job(tmp_path, port)
        try:
            done = subprocess.run([*client, target], input=f"{AUTH}\n", capture_output=True, text=True,
                                  timeout=120)  # fmt: skip
            refused(done, port, job.pid)
        finally:
            job.end()
        assert job.requests() == "" and Path(doubles["DDP_FAKE_LOG"]).read_text() == ""
        assert dist.pull_error(done.returncode, done.stdout + done.stderr, port).startswith(f"port {port} on")
    finally:
        answering.end()


def test_with_a_real_sshd_the_pull_through_an_ssh_L_tunnel_goes_on_and_refuses_a_held_port(
    tmp_path: Path, doubles: dict[str, str], sshd: dict[str, str]
) -> None:
    registry, port = free_port(), free_port()
    answering = Job(tmp_path, registry)  # the build server's registry, at the tunnel's far end
    key = Path(sshd["key"]).read_text()
    tunnel = (str(port), "127.0.0.1", sshd["port"], "root", sshd["host_key"], str(registry))
    try:
        done = pull(doubles, *tunnel, stdin=f"{AUTH}\n{key}")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "tunnel: up" in done.stdout.splitlines()
        assert "docker pull" in Path(doubles["DDP_FAKE_LOG"]).read_text()
        assert "Authorization" not in answering.requests()  # asked whether it answers, without the login
        Path(doubles["DDP_FAKE_LOG"]).write_text("")
        job = Job(tmp_path, port)
        try:
            refused(pull(doubles, *tunnel, stdin=f"{AUTH}\n{key}"), port, job.pid)
        finally:
            job.end()
        assert job.requests() == "" and Path(doubles["DDP_FAKE_LOG"]).read_text() == ""
    finally:
        answering.end()
