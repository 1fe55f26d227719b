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
  the cluster's network through ``ssh -L`` with an ephemeral key (the role's files/registry-source.sh);
  every server runs the role's files/pull-image.sh;
- :func:`run`: the module's whole call, check mode included, as (failed, result).

At scale two things keep a pull from failing for nothing. A pull that tunnels to a build server holds that
server's gate (:data:`HANDSHAKES_PER_SSHD` pulls at most) from its ssh's start until pull-image.sh says its
tunnel is up (:func:`run_gated`): however many servers pull at once, that sshd never has more unauthenticated
connections in flight than its default ``MaxStartups 10:30:100`` accepts without dropping some at random. And
a pull that failed for a reason that passes (ssh's own failure, a tunnel that did not come up, a connection
closed or reset, a registry's EOF) is tried again after 2, 4 and 8 s and a jitter (:func:`with_retries`); an
image that is not the one built never is.

The registry this module runs listens on a loopback (the controller's or the build server's), and each pull
reaches it through a tunnel that ends on the pulling server's loopback: both are shared by the node
containers on those servers' host network, and Docker's engine only pulls over TCP, so no port can be hidden
from them. What keeps a job's code from using it: the registry takes only a password made for this one
distribution (htpasswd, bcrypt; each engine is given it in a temporary ``DOCKER_CONFIG``, never in an argv),
it listens only while the distribution runs, and every server pulls by the push's digest and compares the
image ID it got with the built image's, so nothing pushed there by anyone else can become the node image.

The password goes only to a listener of ours. A job on the host network can listen on a loopback port before
a tunnel, a relay or a registry of this stage binds it; the bind of ours then fails, but the job's listener
answers HTTP as well as ours would, and an engine logs in to whatever answers. So no login goes to a port
until :data:`HOLDER_CHECK` has found that the listening socket there is held by the process this stage started
for it (the registry, the relay, the ``ssh -L`` client), or, for an ``ssh -R`` forward, by the sshd session
that runs the script (one of its ancestors); another holder is refused by name (:data:`PORT_HELD`) and is sent
nothing. The servers' scripts carry the same program, held equal by a unit test.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import ctypes.util
import functools
import json
import math
import os
import random
import re
import secrets
import select
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

PR_SET_PDEATHSIG = 1
# The registry's access log: `... http.request.method=GET ... http.response.written=N ...` per response.
WRITTEN = re.compile(r"http\.request\.method=GET\b.*?http\.response\.written=(\d+)")
TUNNEL_FAILED = re.compile(
    r"remote port forwarding failed|cannot listen to port|Could not request", re.IGNORECASE
)
# What `docker push` says once the manifest is in: `TAG: digest: sha256:HEX size: N`.
PUSHED_DIGEST = re.compile(r"^\S+: digest: (sha256:[0-9a-f]{64}) size: \d+$", re.MULTILINE)
IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
# The one account of the registry this module runs; its password is made anew for each distribution.
REGISTRY_USER = "ddp-cluster"
# bcrypt's lowest cost: the password is 128 random bits (no guessing to slow down), and the registry checks it
# on every request of every pull.
BCRYPT_COST = 4
BCRYPT_ALPHABET = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
# pull-image.sh's exit status when the image pulled by digest is not the one built.
WRONG_IMAGE = 5
# The scripts' exit status when another process holds the loopback port a login was to go to (nothing sent).
PORT_HELD = 6
# What pull-image.sh says once its tunnel to a build server answers: the end of that pull's ssh handshakes.
TUNNEL_UP = "tunnel: up"
# pull-image.sh's exit status when its tunnel to the build server did not come up.
TUNNEL_DOWN = 4
# Pulls in the middle of their ssh handshakes with one sshd at a time: below sshd's default MaxStartups
# (10:30:100: past 10 unauthenticated connections it drops 30% of new ones), so none is dropped at random.
HANDSHAKES_PER_SSHD = 8
# Seconds before the second, third and fourth attempt of a pull that failed for a reason that passes, each
# plus up to half of it again at random, so that pulls dropped together do not come back together.
RETRY_DELAYS = (2.0, 4.0, 8.0)
# What says a failed pull may pass on a second try: sshd dropping or refusing a connection (MaxStartups, a
# restart), a connection reset, a registry's answer cut short (EOF) through a tunnel that went away.
PASSING = re.compile(
    r"kex_exchange_identification|Connection closed|Connection reset|reset by peer|Connection refused"
    r"|Connection timed out|Broken pipe|unexpected EOF|\bEOF$|TLS handshake timeout|i/o timeout",
    re.IGNORECASE | re.MULTILINE,
)
# ...and what says it will fail the same way again: a login refused, a host key that does not match, a name
# that does not resolve.
NOT_PASSING = re.compile(
    r"Permission denied|Host key verification failed|IDENTIFICATION HAS CHANGED|Could not resolve hostname",
    re.IGNORECASE,
)
# training_image_pull_tiers: auto pulls in two tiers above this many servers lacking the image (below it, one
# round of gated pulls from the build server takes about as long as the tier-1 round alone).
TIERS_ABOVE = 64
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=30", "-o", "ServerAliveInterval=15",
               "-o", "ServerAliveCountMax=4")  # fmt: skip

# Who holds the listening socket that a connection to this machine's 127.0.0.1:PORT reaches (argv[1]), against
# the processes that should (argv[2:]: PIDs, or ``ancestors``: the caller's own, as the sshd session whose
# ``ssh -R`` forward it is); Linux's /proc, stdlib only, Python 3.6 (a server's python3), no single quote (the
# scripts hold it in one). Exit 0: ours alone; 1: nothing listens; 2: another process (printed: pid, command
# line, container); 3: cannot tell (printed). The servers' scripts (files/pull-image.sh, registry-source.sh)
# get it in LISTENER_LINES (:func:`with_listeners`); the controller runs it too (:func:`port_holder`).
HOLDER_CHECK = r"""
import os, re, socket, struct, sys
port, ours = int(sys.argv[1]), set()
for word in sys.argv[2:]:
    pid = os.getppid() if word == "ancestors" else int(word)
    ours.add(pid)
    while word == "ancestors" and pid > 1:
        try:
            with open("/proc/%d/status" % pid) as status:
                pid = int(re.search(r"^PPid:\s+(\d+)", status.read(), re.M).group(1))
        except (OSError, AttributeError, ValueError):
            break
        ours.add(pid)
loopback = "%08X" % struct.unpack("=I", socket.inet_aton("127.0.0.1"))
mapped = socket.inet_pton(socket.AF_INET6, "::ffff:127.0.0.1")
mapped = "".join("%08X" % word for word in struct.unpack("=4I", mapped))
reach = {loopback, "0" * 8, "0" * 32, mapped}
inodes = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        with open(table) as lines:
            rows = [line.split() for line in lines][1:]
    except OSError:
        if table.endswith("tcp"):
            print("cannot read %s, where the listening sockets are" % table)
            sys.exit(3)
        continue
    for row in rows:
        address, _, hexport = row[1].partition(":")
        if row[3] == "0A" and int(hexport, 16) == port and address in reach:
            inodes.add(row[9])
if not inodes:
    sys.exit(1)


def sockets(pid):
    try:
        names = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return set()
    found = set()
    for name in names:
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, name))
        except OSError:
            continue
        if link.startswith("socket:["):
            found.add(link[8:-1])
    return found


def read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def describe(pid):
    line = " ".join(word for word in read("/proc/%d/cmdline" % pid).split("\0") if word)
    line = "".join(char if char.isprintable() else "?" for char in line)[:120]
    container = re.search(r"docker[-/]([0-9a-f]{12})", read("/proc/%d/cgroup" % pid))
    return "pid %d (%s)%s" % (pid, line or "?", " in container " + container.group(1) if container else "")


held = set()
for pid in ours:
    held |= sockets(pid) & inodes
strangers = inodes - held
if not strangers:
    sys.exit(0)
said = sorted(describe(int(entry)) for entry in os.listdir("/proc")
              if entry.isdigit() and int(entry) not in ours and sockets(int(entry)) & strangers)
hidden = "a process that uid %d cannot see (of another user, or in another PID namespace)" % os.getuid()
print(", ".join(said[:3]) or hidden)
sys.exit(2)
"""


# The loopback's listeners, as the servers' scripts check them: the shell functions that replace their line
# LISTENERS_MARK when they are sent (:func:`with_listeners`). A job on the host network can listen on a
# loopback port first and answer HTTP as a registry would: no login goes to a port before holder has found
# that the process meant to (a tunnel, the relay, a registry; `ancestors`: this session's sshd, whose ssh -R
# it is) holds its listener.
LISTENERS_MARK = "# @loopback listeners@"
LISTENER_LINES = r"""
answers() {  # the registry's API on this machine's loopback port $1 (401 without a login: it answers)
  python3 -c 'import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen("http://127.0.0.1:%s/v2/" % sys.argv[1], timeout=2)
except urllib.error.HTTPError:
    pass' "$1" 2>/dev/null
}
holder() {  # who holds the listener 127.0.0.1:$1 reaches, against $2... (PIDs, or ancestors): 0 they do,
  # 1 nothing listens, 2 another process (said), 3 cannot tell (said)
  python3 -c HOLDER_PROGRAM "$@" 2>&1
}
taken() {  # port $1 is not ours ($2: holder's status, $3: what it said, $4: what should hold it): exit 6
  if [ "$2" = 2 ]; then who="is taken by $3, not by $4"; else who="cannot be checked ($3)"; fi
  echo "error: port $1 on the server's loopback $who: nothing was sent to it, the registry's password"\
" included. Stop that process (ss -ltnp 'sport = :$1' shows it) or set cluster_registry_port to a free port"
  exit 6
}
unheld() {  # port $1 has no listener yet, or $2 (what is to listen there) is refused (taken)
  said=$(holder "$1"); held=$?
  [ "$held" = 1 ] || taken "$1" "$held" "$said" "$2"
}
owned() {  # until $2 (a PID, or ancestors), named $3, holds port $1's listener and it answers: 0; another
  # holder: refused at once (taken); 1 once $2 has ended or the bound passed (30 s; 2 s for ancestors, whose
  # ssh -R sshd bound before it ran this script)
  tries=0 bound=150
  [ "$2" = ancestors ] && bound=10
  while :; do
    said=$(holder "$1" "$2"); held=$?
    case $held in
      0) answers "$1" && return 0 ;;
      1) ;;
      *) taken "$1" "$held" "$said" "$3" ;;
    esac
    tries=$((tries + 1))
    if { [ "$2" != ancestors ] && ! kill -0 "$2" 2>/dev/null; } || [ "$tries" -gt "$bound" ]; then
      return 1
    fi
    sleep 0.2
  done
}
"""


def with_listeners(script: str) -> str:
    """A server's script (the role's files/pull-image.sh or registry-source.sh) as it is sent: its
    LISTENERS_MARK line replaced by the shell functions that check the loopback's listeners (LISTENER_LINES,
    with HOLDER_CHECK as holder's program). A script without the line is sent as it is."""
    lines = LISTENER_LINES.strip("\n").replace("HOLDER_PROGRAM", shlex.quote(HOLDER_CHECK.strip("\n")))
    return "\n".join(lines.rstrip("\n") if line == LISTENERS_MARK else line for line in script.split("\n"))


class DistributionError(Exception):
    """A step that stops the whole distribution (the registry, the push), with what to do about it.

    Not a ``ddp_cluster.errors`` class: this file travels alone as module_utils."""


def registry_reference(image: str, registry: str, port: int) -> str:
    """The name the servers pull: NAME:TAG under the user's registry, else under the tunnelled loopback
    one."""
    prefix = registry.strip().rstrip("/") if registry.strip() else f"127.0.0.1:{port}"
    return f"{prefix}/{image}"


def digest_reference(reference: str, digest: str) -> str:
    """REGISTRY/NAME@DIGEST from REGISTRY/NAME:TAG: what a server pulls, the content it names fixed."""
    repository, colon, tag = reference.rpartition(":")
    name = repository if colon and "/" not in tag else reference
    return f"{name}@{digest}"


def pushed_digest(output: str, reference: str) -> str:
    """The manifest's digest from `docker push`'s output."""
    found = PUSHED_DIGEST.findall(output)
    if not found:
        raise DistributionError(
            f"the push of {reference} did not say the image's digest, which the servers pull by: "
            f"{_tail(output, 2)}"
        )
    return str(found[-1])


def registry_password() -> str:
    return secrets.token_hex(16)


def registry_auth(password: str) -> str:
    """The `auth` of a Docker client configuration: base64 of USER:PASSWORD."""
    return base64.b64encode(f"{REGISTRY_USER}:{password}".encode()).decode()


def docker_config(directory: str, registry: str, auth: str) -> str:
    """A Docker client configuration directory that holds only the login to ``registry`` (for
    ``DOCKER_CONFIG``): the push's credentials never touch the user's own configuration."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, "config.json")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump({"auths": {registry: {"auth": auth}}}, handle)
    return directory


def bcrypt_hash(password: str) -> str:
    """The password as Distribution's htpasswd reads it (bcrypt only), made by this machine's libcrypt
    (libxcrypt, on every current Linux)."""
    found = ctypes.util.find_library("crypt")
    hashed = b""
    if found:
        with contextlib.suppress(OSError, AttributeError):
            library = ctypes.CDLL(found)
            library.crypt.restype = ctypes.c_char_p
            library.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
            # 22 salt characters: the last carries 2 bits, so it is one whose 4 low bits are 0 (canonical).
            salt = "".join(secrets.choice(BCRYPT_ALPHABET) for _ in range(21)) + secrets.choice(".Oeu")
            hashed = library.crypt(password.encode(), f"$2b${BCRYPT_COST:02d}${salt}".encode()) or b""
    if not hashed.startswith(f"$2b${BCRYPT_COST:02d}$".encode()) or len(hashed) != 60:
        raise DistributionError(
            "cannot make the image registry's password: this controller's libcrypt has no bcrypt (install "
            "libxcrypt: libcrypt1 on Debian and Ubuntu), or set cluster_image_distribution: save_load"
        )
    return hashed.decode()


def registry_config(storage: str, port: int, htpasswd: str) -> str:
    return (
        "version: 0.1\n"
        "log:\n  level: info\n  formatter: text\n"
        "storage:\n"
        f"  filesystem:\n    rootdirectory: {storage}\n"
        "  delete:\n    enabled: true\n"
        "http:\n"
        f"  addr: 127.0.0.1:{port}\n"
        "  headers:\n    X-Content-Type-Options: [nosniff]\n"
        "auth:\n"
        f"  htpasswd:\n    realm: ddp-cluster-image\n    path: {htpasswd}\n"
    )


def layer_counts(output: str) -> tuple[int, int]:
    """Layers a `docker pull` downloaded and layers the server had already, from its plain (non-tty)
    output."""
    pulled = len(re.findall(r"^\w+: Pull complete$", output, re.MULTILINE))
    present = len(re.findall(r"^\w+: Already exists$", output, re.MULTILINE))
    return pulled, present


def bytes_served(log: str) -> int:
    return sum(int(match) for match in WRITTEN.findall(log))


def pull_command(script: str, pulled: str, image: str, image_id: str, tunnel: tuple[str, ...] = ()) -> str:
    """The shell command a server runs (the role's files/pull-image.sh): pull ``pulled`` (NAME@DIGEST), check
    that its ID is ``image_id``, name it ``image`` as the builder does, drop the registry's name. ``tunnel``:
    PORT ADDRESS SSH_PORT USER HOST_KEYS of the build server to reach first. The registry's login and the
    tunnel's key come on its stdin (:func:`pull_input`), never in this command."""
    return shlex.join(["sh", "-c", script, "ddp-pull", pulled, image, image_id, *tunnel])


def pull_input(auth: str, private_key: str = "") -> str:
    """A pull's stdin: the registry's login (empty: the server's own, for the user's registry), then the
    tunnel's private key."""
    return f"{auth}\n{private_key}"


def ssh_pull_argv(ssh: list[str], command: str, tunnel_port: int | None) -> list[str]:
    """ssh's own options go before the target (the last word of `ssh`); -R only for the controller's
    registry. Without ExitOnForwardFailure: a forward that sshd could not bind (another process holds the
    port) still runs pull-image.sh, which finds that holder, names it and sends it nothing; ssh's own warning
    (remote port forwarding failed) stays in the output for a forward that sshd forbids."""
    *client, target = ssh
    options = [*SSH_OPTIONS]
    if tunnel_port is not None:
        options += ["-R", f"127.0.0.1:{tunnel_port}:127.0.0.1:{tunnel_port}"]
    return [*client, *options, target, command]


def _tail(output: str, lines: int = 3) -> str:
    return " ".join(output.strip().splitlines()[-lines:])


def pull_error(rc: int, output: str, tunnel_port: int | None) -> str:
    tail = _tail(output)
    if rc == PORT_HELD:
        return said_error(output)
    if tunnel_port is not None and TUNNEL_FAILED.search(output):
        return (
            f"could not open the tunnel to the controller's registry: port {tunnel_port} on the server's "
            "loopback is taken, or its sshd forbids forwarding (AllowTcpForwarding). Free the port or set "
            f"cluster_registry_port, allow forwarding, or set cluster_image_distribution: save_load ({tail})"
        )
    if rc == WRONG_IMAGE:
        return wrong_image(output)
    if rc == 255:
        return f"ssh to the server failed: {tail}"
    return f"the pull failed (rc {rc}): {tail}"


def wrong_image(output: str) -> str:
    """pull-image.sh's refusal: the image pulled by digest is not the one built (its own error line)."""
    return said_error(output, f"the pulled image is not the one built: {_tail(output)}")


def said_error(output: str, otherwise: str = "") -> str:
    """A script's own reason, its last ``error:`` line (a wrong image, a port held by another process);
    ``otherwise`` (default: the output's tail) when it said none."""
    said = [line for line in output.splitlines() if line.startswith("error: ")]
    return said[-1][len("error: ") :] if said else otherwise or _tail(output)


def receiver_error(rc: int, output: str, source: str, port: int) -> str:
    tail = _tail(output)
    if rc == WRONG_IMAGE:
        return wrong_image(output)
    if rc == PORT_HELD:
        return said_error(output)
    if rc == TUNNEL_DOWN:
        return (
            f"could not reach the image registry on the build server {source} through a tunnel over the "
            f"cluster's network (ssh to its address, port {port} on both loopbacks): {tail}. Check that this "
            f"server reaches {source}'s sshd (training_image_build_address), that port {port} is free here "
            "(cluster_registry_port) and that forwarding is allowed (AllowTcpForwarding)"
        )
    if rc == 255:
        return f"ssh to the server failed: {tail}"
    return f"the pull from the build server {source} failed (rc {rc}): {tail}"


def passing(rc: int, output: str) -> bool:
    """Whether a pull that ended with ``rc`` and ``output`` may succeed when tried again: ssh's own failure
    (255: no connection, dropped in its handshake) or a tunnel that did not come up (TUNNEL_DOWN), unless a
    forward was refused (a taken port, forwarding forbidden) or a login (a key, a host key, a name: the same
    next time); a docker pull cut short by a
    closed or reset connection or an EOF. Never an image that is not the one built (WRONG_IMAGE), a port held
    by another process (PORT_HELD), nor a pull past its bound."""
    if rc in (0, WRONG_IMAGE, PORT_HELD, 124):
        return False
    if TUNNEL_FAILED.search(output) or NOT_PASSING.search(output):
        return False
    return rc in (255, TUNNEL_DOWN) or bool(PASSING.search(output))


def retry_delay(attempt: int, jitter: Callable[[float, float], float] = random.uniform) -> float:
    """Seconds to wait after the failed attempt number ``attempt`` (1, 2, 3): RETRY_DELAYS plus up to half
    again."""
    base = RETRY_DELAYS[attempt - 1]
    return base + jitter(0.0, base / 2)


def with_retries(
    attempt: Callable[[], tuple[dict[str, Any], bool]], sleep: Callable[[float], None] = time.sleep
) -> dict[str, Any]:
    """``attempt()`` -> (result, passing) until it succeeds, fails for a reason that does not pass, or has
    been tried 1 + len(RETRY_DELAYS) times; the last result, with ``attempts``."""
    tried, started = 0, time.monotonic()
    while True:
        result, transient = attempt()
        tried += 1
        if result["ok"] or not transient or tried > len(RETRY_DELAYS):
            break
        sleep(retry_delay(tried))
    result["attempts"] = tried
    result["seconds"] = round(time.monotonic() - started, 1)
    if not result["ok"] and tried > 1:
        result["error"] = f"{result['error']} (tried {tried} times)"
    return result


def run_gated(
    argv: list[str], timeout: int, stdin: str, gate: threading.Semaphore | None
) -> subprocess.CompletedProcess[str]:
    """argv as :func:`run_bounded` runs it (its stderr into its stdout), holding ``gate`` (when given) from
    its start until it says TUNNEL_UP or ends: the pulls that hold one build server's gate are the only ones
    in the middle of ssh handshakes with it. Waiting for the gate does not count against ``timeout``."""
    released = threading.Event()

    def release() -> None:
        if gate is not None and not released.is_set():
            released.set()
            gate.release()

    if gate is not None:
        gate.acquire()
    try:
        process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
    except BaseException:
        release()
        raise
    assert process.stdin is not None and process.stdout is not None
    deadline = time.monotonic() + timeout
    said: list[str] = []
    rc = 124
    try:
        with contextlib.suppress(OSError):  # a process that ended at once says why in its output
            process.stdin.write(stdin.encode())
        with contextlib.suppress(OSError):
            process.stdin.close()
        lines = SessionLines(process.stdout.fileno())
        while True:
            line = lines.next(deadline)
            if line is None:
                break
            said.append(line)
            if line == TUNNEL_UP:
                release()
        release()
        if lines.closed:
            with contextlib.suppress(subprocess.TimeoutExpired):
                rc = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        release()
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
    output = "".join(f"{line}\n" for line in said)
    return subprocess.CompletedProcess(argv, rc, output, f"timed out after {timeout} s" if rc == 124 else "")


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


def port_holder(port: int, ours: Sequence[str]) -> tuple[int, str]:
    """:data:`HOLDER_CHECK` on this machine: (its exit status, what it printed) for the listener that a
    connection to 127.0.0.1:``port`` reaches, against the processes ``ours`` (PIDs, or ``ancestors``)."""
    done = run_bounded([sys.executable, "-c", HOLDER_CHECK, str(port), *ours], 30)
    return done.returncode, done.stdout.strip() or done.stderr.strip()


def held_elsewhere(port: int, where: str, held: int, said: str, ours: str) -> str:
    """Why nothing was sent to ``port`` on ``where``'s loopback: :func:`port_holder`'s ``held`` (2: another
    process, ``said``; else it could not tell) instead of ``ours``. The servers' scripts say the same."""
    who = f"is taken by {said}, not by {ours}" if held == 2 else f"cannot be checked ({said})"
    return (
        f"port {port} on {where}'s loopback {who}: nothing was sent to it, the registry's password included. "
        f"Stop that process (ss -ltnp 'sport = :{port}' shows it) or set cluster_registry_port to a free port"
    )


def _file_tail(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return _tail(handle.read())


@contextlib.contextmanager
def controller_registry(command: str, storage: str, port: int, workdir: str, password: str) -> Iterator[str]:
    """Docker's Distribution registry on 127.0.0.1:port while the block runs, also when it fails (and with
    this process), taking only ``password`` (user REGISTRY_USER); yields its log file."""
    if not port_free(port):
        raise DistributionError(
            f"port {port} on the controller's loopback is taken, so the image registry cannot start there: "
            "set cluster_registry_port to a free port"
        )
    os.makedirs(storage, mode=0o700, exist_ok=True)
    config, log = os.path.join(workdir, "config.yml"), os.path.join(workdir, "registry.log")
    htpasswd = os.path.join(workdir, "htpasswd")
    with open(htpasswd, "w", encoding="utf-8") as handle:
        handle.write(f"{REGISTRY_USER}:{bcrypt_hash(password)}\n")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(registry_config(storage, port, htpasswd))
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
        # Logged in, as the push will be: the registry is up and takes the password.
        ping = urllib.request.Request(
            f"http://127.0.0.1:{port}/v2/", headers={"Authorization": f"Basic {registry_auth(password)}"}
        )
        while True:
            if process.poll() is not None:
                raise DistributionError(f"the image registry exited at start: {_file_tail(log)}")
            # The login goes only to the registry started here: a process that took the port since the check
            # above (the registry's own bind then fails) would answer as well.
            held, said = port_holder(port, [str(process.pid)])
            if held not in (0, 1):
                raise DistributionError(
                    held_elsewhere(port, "the controller", held, said, f"the image registry ({command})")
                )
            answered = False
            if held == 0:
                with contextlib.suppress(urllib.error.URLError, OSError), urllib.request.urlopen(
                    ping, timeout=2
                ) as answer:
                    answered = answer.status == 200
            if answered:
                break
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


def run_bounded(
    argv: list[str], timeout: int, stdin: str | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """argv within timeout (rc 124 past it); ``stdin`` is its input, else it reads nothing."""
    environment = None if env is None else {**os.environ, **env}
    try:
        if stdin is not None:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=stdin,
                                  env=environment)  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env=environment)  # fmt: skip
    except subprocess.TimeoutExpired as error:
        output = (
            error.stdout if isinstance(error.stdout, str) else (error.stdout or b"").decode(errors="replace")
        )
        return subprocess.CompletedProcess(argv, 124, output, f"timed out after {timeout} s")


def engine_env(config: str | None = None) -> dict[str, str]:
    """The controller's docker CLI on the engine that built (DOCKER_HOST, else the default socket: not another
    docker context's, as the build chose it), with the client configuration directory ``config`` when given
    (the registry's login alone), else the user's own (the user's registry's login)."""
    chosen = {} if os.environ.get("DOCKER_HOST") else {"DOCKER_CONTEXT": "default"}
    return {**chosen, **({"DOCKER_CONFIG": config} if config else {})}


def image_id(image: str) -> str:
    """The controller's image's ID, which every server must end up with."""
    found = run_bounded(["docker", "image", "inspect", "--format", "{{.Id}}", image], 60, env=engine_env())
    if found.returncode != 0 or not IMAGE_ID.fullmatch(found.stdout.strip()):
        raise DistributionError(f"cannot read the ID of {image}: {_tail(found.stdout + found.stderr, 2)}")
    return found.stdout.strip()


def push(image: str, reference: str, timeout: int, config: str | None = None) -> tuple[int, str]:
    """Push the controller's image under the registry's name, logged in by the client configuration
    directory ``config`` (None: the user's own); returns the layers sent and the manifest's digest."""
    tagged = run_bounded(["docker", "tag", image, reference], 60, env=engine_env())
    if tagged.returncode != 0:
        raise DistributionError(f"cannot tag {image} as {reference}: {tagged.stderr.strip()}")
    try:
        pushed = run_bounded(["docker", "push", reference], timeout, env=engine_env(config))
    finally:
        run_bounded(["docker", "rmi", reference], 60, env=engine_env())
    if pushed.returncode != 0:
        detail = _tail(pushed.stdout + pushed.stderr, 2)
        raise DistributionError(f"the push of {reference} failed (rc {pushed.returncode}): {detail}")
    layers = len(re.findall(r"^\w+: Pushed$", pushed.stdout, re.MULTILINE))
    return layers, pushed_digest(pushed.stdout, reference)


def pull_result(
    done: subprocess.CompletedProcess[str], started: float, timeout: int, error: str
) -> dict[str, Any]:
    """One server's pull as the report gives it; ``error`` says why a failed one failed (past the bound:
    that). ``pulled`` and ``image_id``: the reference it pulled and the ID it got, as pull-image.sh says."""
    pulled, present = layer_counts(done.stdout)
    said = dict(
        line.split(": ", 1)
        for line in done.stdout.splitlines()
        if line.startswith(("pulled: ", "image_id: "))
    )
    if done.returncode == 124:
        error = f"the pull did not finish within {timeout} s (training_image_pull_timeout)"
    return {
        "ok": done.returncode == 0,
        "rc": done.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "layers_pulled": pulled,
        "layers_present": present,
        "pulled": said.get("pulled", ""),
        "image_id": said.get("image_id", ""),
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
    server: dict[str, Any], command: str, stdin: str, tunnel_port: int | None, timeout: int
) -> dict[str, Any]:
    """One server's pull from the controller's registry or the user's, tried again while it fails for a
    reason that passes."""
    argv = ssh_pull_argv([str(word) for word in server["ssh"]], command, tunnel_port)

    def attempt() -> tuple[dict[str, Any], bool]:
        started = time.monotonic()
        done = run_bounded(argv, timeout, stdin=stdin)
        output = done.stdout + done.stderr
        error = pull_error(done.returncode, output, tunnel_port)
        return pull_result(done, started, timeout, error), passing(done.returncode, output)

    return with_retries(attempt)


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
    """Read the source's session up to ``ready``: the push's layers, seconds, digest and the image's ID into
    report; its host keys, returned as known_hosts lines. A session that falls silent is stopped."""
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
        elif line.startswith("digest: "):
            report["digest"] = line[len("digest: ") :]
        elif line.startswith("image_id: "):
            report["image_id"] = line[len("image_id: ") :]
        elif line.startswith("hostkey: "):
            hostkeys.append(line[len("hostkey: ") :])
        elif line == "ready":
            if not IMAGE_ID.fullmatch(report.get("digest", "")) or not IMAGE_ID.fullmatch(
                report.get("image_id", "")
            ):
                stop()
                raise DistributionError(
                    f"the build server {source} did not say the pushed image's digest and ID: "
                    + " ".join(said[-3:])
                )
            return "\n".join(hostkeys)


def tier_count(lacking: int, tiers: str) -> int:
    """1 or 2 (training_image_pull_tiers: auto, 1 or 2) for ``lacking`` servers to pull."""
    if tiers == "auto":
        return 2 if lacking > TIERS_ABOVE else 1
    if tiers in ("1", "2"):
        return int(tiers)
    raise DistributionError(f"training_image_pull_tiers is {tiers!r}: set it to auto, 1 or 2")


def plan_tiers(names: Sequence[str], tiers: str) -> dict[str, list[str]]:
    """Two tiers: ceil(sqrt(L)) groups of neighbours in ``names``' order (the inventory's: often a rack's),
    the first of each a tier-1 server, which pulls from the source and then serves the rest of its group;
    each tier-1 server with its group's others. One tier: {} (every server pulls from the source)."""
    count = len(names)
    if count < 2 or tier_count(count, tiers) == 1:
        return {}
    groups = math.isqrt(count - 1) + 1
    plan: dict[str, list[str]] = {}
    for index in range(groups):
        group = list(names[index * count // groups : (index + 1) * count // groups])
        if group:
            plan[group[0]] = group[1:]
    return plan


Puller = Callable[[dict[str, Any]], dict[str, Any]]
# A tier-1 server opened: its own pull's result and how a server pulls through it (None: it cannot serve).
TierOpener = Callable[
    [dict[str, Any]], "contextlib.AbstractContextManager[tuple[dict[str, Any], Puller | None]]"
]


def pull_in_tiers(
    servers: list[dict[str, Any]],
    plan: Mapping[str, list[str]],
    parallel: int,
    from_source: Puller,
    open_tier: TierOpener,
) -> dict[str, Any]:
    """Every tier-1 server of ``plan`` opened at once (``open_tier``: it pulls from the source, then serves),
    then its group pulled through it, ``parallel`` pulls at a time in all. A tier-1 server that cannot serve:
    it and its group pull from the source; a server whose pull through its tier-1 failed (not for a wrong
    image) pulls from the source. The report's servers (each with ``via``), failed_servers and tiers (per
    tier-1 server: ok, error, the servers it served)."""
    by_name = {server["name"]: server for server in servers}
    tiers: dict[str, dict[str, Any]] = {}

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(servers)))) as pool:

        def pulled(futures: Mapping[str, Future[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
            return {name: future.result() for name, future in futures.items()}

        def tier(first: str) -> dict[str, dict[str, Any]]:
            group = plan[first]
            with open_tier(by_name[first]) as (own, through):
                tiers[first] = {
                    "ok": through is not None,
                    "error": "" if through else own["error"],
                    "served": [],
                }
                if through is None:
                    fallback = pulled(
                        {name: pool.submit(from_source, by_name[name]) for name in [first, *group]}
                    )
                    return fallback
                results = {
                    first: own,
                    **pulled({name: pool.submit(through, by_name[name]) for name in group}),
                }
                retry = [
                    name for name in group if not results[name]["ok"] and results[name]["rc"] != WRONG_IMAGE
                ]
                tiers[first]["served"] = [name for name in group if name not in retry and results[name]["ok"]]
                results.update(pulled({name: pool.submit(from_source, by_name[name]) for name in retry}))
                return results

        with ThreadPoolExecutor(max_workers=len(plan)) as openers:
            done: dict[str, dict[str, Any]] = {}
            for future in [openers.submit(tier, first) for first in plan]:
                done.update(future.result())
    results = {server["name"]: done[server["name"]] for server in servers}
    return {
        "servers": results,
        "failed_servers": [name for name, result in results.items() if not result["ok"]],
        "tiers": tiers,
    }


def tunnelled_puller(
    params: Mapping[str, Any],
    pulled: str,
    image_id: str,
    stdin: str,
    via: str,
    tunnel: tuple[str, ...],
    gate: threading.Semaphore,
) -> Puller:
    """A server's pull of ``pulled`` through a tunnel to ``via``'s sshd (pull-image.sh's ``tunnel`` arguments;
    ``gate``: its handshakes with that sshd), tried again while it fails for a reason that passes."""
    command = pull_command(params["receiver_script"], pulled, params["image"], image_id, tunnel)

    def receive(server: dict[str, Any]) -> dict[str, Any]:
        argv = ssh_pull_argv([str(word) for word in server["ssh"]], command, None)

        def attempt() -> tuple[dict[str, Any], bool]:
            begun = time.monotonic()
            done = run_gated(argv, int(params["timeout"]), stdin, gate)
            error = receiver_error(done.returncode, done.stdout, via, int(params["port"]))
            return pull_result(done, begun, int(params["timeout"]), error), passing(
                done.returncode, done.stdout
            )

        return dict(with_retries(attempt), via=via)

    return receive


class TierCache:
    """Tier-1 servers' sessions (the role's files/registry-source.sh in proxy mode): each opens its tunnel to
    the source (holding the source's gate until it says it is up), runs Distribution as a pull-through cache
    of the source's registry on its loopback's port + 1 (reaching the source through a relay on port + 2 that
    logs it in), pulls the image through it, authorizes the run's key for a forward to it and says its host
    keys; its group then pulls through a tunnel to its sshd (a gate of its own). Closing the session's stdin
    stops it all and removes the cache."""

    def __init__(
        self,
        params: Mapping[str, Any],
        pulled: str,
        image_id: str,
        upstream: tuple[str, ...],
        stdin: str,
        public: str,
        comment: str,
        source_gate: threading.Semaphore | None,
        receiver: Callable[[str, tuple[str, ...], threading.Semaphore], Puller],
        source_name: str,
        forward: int | None = None,
    ) -> None:
        """``upstream``: the source's port, then (a build server) ADDRESS SSH_PORT USER HOST_KEYS of the
        tunnel each tier-1 server opens to it; ``forward`` (the controller's registry): the port each tier-1
        session forwards back to the controller instead (ssh -R)."""
        self.params, self.upstream, self.stdin, self.source_gate = params, upstream, stdin, source_gate
        self.image_id, self.public, self.comment, self.receiver = image_id, public, comment, receiver
        self.source_name, self.forward = source_name, forward
        self.port = int(params["port"]) + 1
        # The image through the tier-1 server's own cache: REGISTRY/NAME@DIGEST with the cache's port.
        self.pulled = pulled.replace(f"127.0.0.1:{params['port']}/", f"127.0.0.1:{self.port}/", 1)
        self.bytes_served = 0
        self.lock = threading.Lock()

    def argv(self, server: dict[str, Any]) -> list[str]:
        *client, target = [str(word) for word in server["ssh"]]
        params = self.params
        script = [
            "sh", "-c", params["source_script"], "ddp-registry", "proxy", str(self.port),
            params["cache_storage"], self.pulled, params["image"], self.image_id,
            params["registry_command"], self.public, self.comment, *self.upstream,
        ]  # fmt: skip
        options = [*SSH_OPTIONS]
        if self.forward is not None:
            # As ssh_pull_argv's: registry-source.sh checks that this session's sshd holds the port.
            options += ["-R", f"127.0.0.1:{self.forward}:127.0.0.1:{self.forward}"]
        return [*client, *options, target, shlex.join(script)]

    @contextlib.contextmanager
    def open(self, server: dict[str, Any]) -> Iterator[tuple[dict[str, Any], Puller | None]]:
        timeout, name = int(self.params["timeout"]), server["name"]
        released = threading.Event()

        def release() -> None:
            if self.source_gate is not None and not released.is_set():
                released.set()
                self.source_gate.release()

        if self.source_gate is not None:
            self.source_gate.acquire()
        begun = time.monotonic()
        try:
            session = subprocess.Popen(
                self.argv(server), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                bufsize=0, preexec_fn=_die_with_parent,
            )  # fmt: skip
        except BaseException:
            release()
            raise
        assert session.stdin is not None and session.stdout is not None
        lines = SessionLines(session.stdout.fileno())
        said: list[str] = []
        try:
            with contextlib.suppress(OSError):
                session.stdin.write(self.stdin.encode())
                session.stdin.flush()
            deadline = time.monotonic() + timeout
            while True:
                line = lines.next(deadline)
                if line is None or line == "ready" or line.startswith("error: "):
                    break
                said.append(line)
                if line == TUNNEL_UP:
                    release()
            release()
            hostkeys = [line[len("hostkey: ") :] for line in said if line.startswith("hostkey: ")]
            if line == "ready":
                own = pull_result(subprocess.CompletedProcess([], 0, "\n".join(said), ""), begun, timeout, "")
                address, ssh_port, user = split_ssh([str(word) for word in server["ssh"]])
                tunnel = (
                    str(self.params["port"]),
                    address,
                    ssh_port,
                    user,
                    "\n".join(hostkeys),
                    str(self.port),
                )
                through: Puller | None = self.receiver(
                    name, tunnel, threading.BoundedSemaphore(HANDSHAKES_PER_SSHD)
                )
                yield dict(own, attempts=1, via=self.source_name), through
            else:
                said += [line] if line else []
                reason = (
                    (line or "")[len("error: ") :]
                    if line and line.startswith("error: ")
                    else _tail("\n".join(said))
                )
                if line is None and time.monotonic() >= deadline:
                    reason = f"no answer within {timeout} s (training_image_pull_timeout)"
                elif not reason:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        session.wait(timeout=10)
                    reason = f"its session ended without a word (rc {session.returncode})"
                yield (
                    {
                        "ok": False,
                        "error": f"the tier-1 server {name} cannot serve: {reason}",
                    },
                    None,
                )
        finally:
            release()
            served = end_session(session, lines)
            session.stdout.close()
            with self.lock:
                self.bytes_served += served


def end_session(session: subprocess.Popen[bytes], lines: SessionLines) -> int:
    """End a registry's ssh session (a source's or a tier-1 cache's): close its stdin, which stops what it
    runs, read what it still says for up to 60 s, kill it if it has not ended. The bytes its registry said it
    served (``served: N`` lines)."""
    assert session.stdin is not None
    with contextlib.suppress(OSError):
        session.stdin.close()
    rest: list[str] = []
    end = time.monotonic() + 60
    while (line := lines.next(end)) is not None:
        rest.append(line)
    if session.poll() is None:
        session.kill()
    session.wait()
    return sum(int(line.split()[-1]) for line in rest if re.fullmatch(r"served: \d+", line))


def distribute_from_source(params: Mapping[str, Any]) -> dict[str, Any]:
    """The image is on the source server's engine: the registry runs there, every other server pulls over the
    cluster's network through a tunnel to it. One ssh session to the source, as long as the call, holds the
    registry (its password the session's first line), the push and an ephemeral key authorized for nothing
    but that forward; closing its stdin stops the registry and deauthorizes the key."""
    image, port, source, timeout = params["image"], params["port"], params["source"], params["timeout"]
    reference = registry_reference(image, "", port)
    ssh = [str(word) for word in source["ssh"]]
    address, ssh_port, user = split_ssh(ssh)
    address = params["source_address"].strip() or address
    report: dict[str, Any] = {"reference": reference, "servers": {}, "failed_servers": [], "bytes_served": 0}
    comment = f"ddp-cluster-image-{os.urandom(6).hex()}"
    password = registry_password()
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
            with contextlib.suppress(OSError):  # a session that ended at once says why below
                session.stdin.write(f"{password}\n".encode())
                session.stdin.flush()
            known = _source_ready(lines, session.kill, source["name"], timeout, report, started)
            pulled = digest_reference(reference, report["digest"])
            stdin = pull_input(registry_auth(password), private)

            receiver = functools.partial(tunnelled_puller, params, pulled, report["image_id"], stdin)

            source_gate = threading.BoundedSemaphore(HANDSHAKES_PER_SSHD)
            from_source = receiver(
                source["name"], (str(port), address, ssh_port, user, known), source_gate
            )  # fmt: skip
            servers = params["servers"]
            plan = plan_tiers([server["name"] for server in servers], str(params.get("tiers") or "1"))
            if plan:
                upstream = (str(port), address, ssh_port, user, known)
                cache = TierCache(params, pulled, report["image_id"], upstream, f"{password}\n{private}",
                                  public, comment, source_gate, receiver, source["name"])  # fmt: skip
                report.update(pull_in_tiers(servers, plan, params["parallel"], from_source, cache.open))
                report["tier1_bytes_served"] = cache.bytes_served
            else:
                report.update(pull_everywhere(servers, params["parallel"], from_source))
        finally:
            # The source's session ends: registry stopped, key deauthorized.
            report["bytes_served"] = end_session(session, lines)
    return report


def distribute(params: Mapping[str, Any]) -> dict[str, Any]:
    """Push once, pull on every server of ``params["servers"]``; the report (see the module's RETURN)."""
    params = {
        **params,
        "receiver_script": with_listeners(params["receiver_script"]),
        "source_script": with_listeners(params.get("source_script") or ""),
    }
    if params.get("source"):
        return distribute_from_source(params)
    image, registry, port, timeout = params["image"], params["registry"], params["port"], params["timeout"]
    reference = registry_reference(image, registry, port)
    tunnel_port = None if registry.strip() else port
    report: dict[str, Any] = {"reference": reference, "servers": {}, "failed_servers": [], "bytes_served": 0}
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        log, auth, config = "", "", None
        report["image_id"] = image_id(image)
        if tunnel_port is not None:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="ddp-registry-"))
            password = registry_password()
            auth = registry_auth(password)
            config = docker_config(os.path.join(workdir, "docker"), f"127.0.0.1:{port}", auth)
            log = stack.enter_context(
                controller_registry(params["registry_command"], params["storage"], port, workdir, password)
            )
        report["pushed_layers"], report["digest"] = push(image, reference, timeout, config)
        report["push_seconds"] = round(time.monotonic() - started, 1)
        served = stack.enter_context(open(log, encoding="utf-8", errors="replace")) if log else None
        if served is not None:
            served.seek(0, os.SEEK_END)  # what the servers' pulls were served, not the push
        # The controller's registry: pull-image.sh is given the port, which its session's ssh -R holds.
        command = pull_command(
            params["receiver_script"],
            digest_reference(reference, report["digest"]),
            image,
            report["image_id"],
            (str(tunnel_port),) if tunnel_port is not None else (),
        )
        servers, source = params["servers"], "controller" if tunnel_port is not None else registry.strip()

        def from_controller(server: dict[str, Any]) -> dict[str, Any]:
            return dict(pull(server, command, pull_input(auth), tunnel_port, timeout), via=source)

        # Tiers for the controller's own registry only: a user's registry serves every server itself.
        plan = plan_tiers([server["name"] for server in servers], str(params.get("tiers") or "1"))
        if plan and tunnel_port is not None and not params.get("source_script"):
            raise DistributionError(
                "two tiers need source_script (the role's files/registry-source.sh, which tier-1 servers run)"
            )
        if plan and tunnel_port is not None:
            keys = stack.enter_context(tempfile.TemporaryDirectory(prefix="ddp-image-key-"))
            comment = f"ddp-cluster-image-{os.urandom(6).hex()}"
            private, public = _keypair(keys, comment)
            pulled = digest_reference(reference, report["digest"])
            receiver = functools.partial(
                tunnelled_puller, params, pulled, report["image_id"], pull_input(auth, private)
            )
            cache = TierCache(params, pulled, report["image_id"], (str(port),), f"{password}\n{private}",
                              public, comment, None, receiver, "controller", forward=port)  # fmt: skip
            report.update(pull_in_tiers(servers, plan, params["parallel"], from_controller, cache.open))
            report["tier1_bytes_served"] = cache.bytes_served
        else:
            report.update(pull_everywhere(servers, params["parallel"], from_controller))
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
