"""A pull that sshd drops is tried again and site.yml's image stage converges.

sim-server1's sshd is set to ``MaxStartups 1:100:1`` (one connection in its handshake at a time, every other
dropped) and, from the moment the controller's registry listens until sshd has dropped a connection, a
connection of the test's own sits in its handshake: the controller's pull to sim-server1 is dropped by sshd
(``kex_exchange_identification: Connection closed by remote host``), as a busy sshd drops connections past its
MaxStartups. The pull is tried again a few seconds later and gets the image; sim-server0 pulls at its first
try. A code change in a copy of the repository gives both servers a new image to pull, with ``--tags image``,
so the servers' containers stay as they were (whatever inventory the stages before left them on).
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

from .conftest import NODE_IMAGE, REGISTRY_PORT, code_change, on_server, site
from conftest import PlaybookResult

DROPPING = "sim-server1"
ADDRESS = "172.30.99.11"
# Sorts before the sim's own 10-sim-server.conf: sshd takes the first value it reads.
DROP_IN = "/etc/ssh/sshd_config.d/05-image-retry.conf"
DROPPED = re.compile(r"drop connection #\d+ from \[[\d.]+\]:\d+ on \[[\d.]+\]:22 past MaxStartups")


def reload_sshd(server: str) -> None:
    """sshd checks its configuration, then takes it again (SIGHUP to the listener, the oldest sshd)."""
    on_server(server, "sshd -t && pkill -HUP -o -x sshd")
    time.sleep(1)


@contextlib.contextmanager
def sshd_with_one_startup(server: str) -> Iterator[None]:
    on_server(server, f"printf 'MaxStartups 1:100:1\\n' > {DROP_IN}")
    reload_sshd(server)
    try:
        yield
    finally:
        on_server(server, f"rm -f {DROP_IN}")
        reload_sshd(server)


def sshd_log(server: str, since: str) -> str:
    done = subprocess.run(["docker", "logs", "--since", since, server], capture_output=True, text=True)
    return done.stdout + done.stderr


class Hog(threading.Thread):
    """Once the controller's registry listens (the image stage has begun shipping), a connection to the
    server's sshd that never says a word, holding its one startup, until sshd has dropped another one."""

    def __init__(self, since: str) -> None:
        super().__init__(daemon=True)
        self.since, self.stop, self.drops = since, threading.Event(), ""

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", REGISTRY_PORT), 0.2):
                break
            time.sleep(0.1)
        if self.stop.is_set():
            return
        with socket.create_connection((ADDRESS, 22), 5):
            while not self.stop.wait(0.3):
                found = DROPPED.findall(sshd_log(DROPPING, self.since))
                if found:
                    self.drops = "\n".join(found)
                    return


def test_a_pull_that_sshd_drops_is_tried_again_and_the_stage_converges(sim_cluster: PlaybookResult) -> None:
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    hog = Hog(since)
    with code_change("image retry") as changed, sshd_with_one_startup(DROPPING):
        hog.start()
        started = time.monotonic()
        try:
            result = site(project=changed, cmdline="-v --tags image")
        finally:
            hog.stop.set()
            hog.join(timeout=10)
    print(f"site.yml --tags image with a pull dropped by sshd: {time.monotonic() - started:.0f} s")
    assert result.rc == 0, result.stdout[-6000:]
    # sshd did drop a connection while the test's own held its one startup: the controller's pull.
    assert hog.drops, sshd_log(DROPPING, since)[-3000:]
    # sim-server1's pull was tried twice, sim-server0's once (the report's servers in name order).
    assert re.findall(r'"?attempts"?: (\d+)', result.stdout) == ["1", "2"], result.stdout[-6000:]
    # Both servers hold the image the stage pushed, under its name, with one ID.
    ref = re.findall(
        rf'"?reference"?: "?127\.0\.0\.1:{REGISTRY_PORT}/({re.escape(NODE_IMAGE)}:[0-9a-f]+)', result.stdout
    )
    assert len(set(ref)) == 1, result.stdout[-6000:]
    images = {
        server: on_server(server, f"docker image inspect -f '{{{{.Id}}}}' {ref[0]}").stdout.strip()
        for server in ("sim-server0", "sim-server1")
    }
    assert images["sim-server0"].startswith("sha256:") and len(set(images.values())) == 1, images
    for server in images:  # the code change's image goes again: the servers as they were
        on_server(server, f"docker image rm {ref[0]} >/dev/null 2>&1 || true")
