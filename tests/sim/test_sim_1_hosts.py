"""site.yml from bare servers, the hosts stage first (scripts/sim.sh makes them fresh: engine up, no image);
its second run, which changes nothing and sends no image; the hosts stage's firewall between the servers."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import time

import pytest

from .conftest import NODE_IMAGE, SERVERS, on_server, site
from conftest import PlaybookResult


def test_site_brings_bare_servers_up(sim_cluster: PlaybookResult) -> None:
    for server in SERVERS:
        # The hosts stage installed what the Docker tasks need; the image arrived; the node runs on the host
        # network.
        on_server(server, "python3 -c 'import requests'")
        images = on_server(server, f"docker image ls -q {NODE_IMAGE}").stdout.split()
        assert len(images) == 1, images
        template = "'{{.HostConfig.NetworkMode}} {{.State.Running}}'"
        inspect = on_server(server, f"docker inspect -f {template} {server}")
        assert inspect.stdout.split() == ["host", "true"]
        # sshd of the node container listens in the server's own network namespace.
        assert on_server(server, "ss -Htln 'sport = :12345'").stdout.strip()
        assert on_server(server, 'test -z "$(ls /var/tmp/*.tar 2>/dev/null)"', check=False).returncode == 0


def test_second_run_changes_nothing_and_sends_no_image(sim_cluster: PlaybookResult) -> None:
    again = site()
    assert again.rc == 0, again.stdout[-4000:]
    assert again.changed_hosts() == {}, again.stdout[-6000:]
    # The image is on every server: the archive is neither exported, nor copied, nor loaded again.
    sending = again.stdout.split("TASK [training_image : Copy the archive to the host]")
    assert len(sending) == 1 or "changed:" not in sending[1].split("TASK [")[0]


def test_firewall_lets_the_servers_through_and_keeps_everyone_else_out(sim_cluster: PlaybookResult) -> None:
    rules = on_server("sim-server1", "ufw status").stdout
    assert "Status: active" in rules
    # Every port from each server of the cluster; sshd only from the controller (this machine, the bridge's
    # gateway).
    allowed = [line.split() for line in rules.splitlines() if "ALLOW" in line]
    # The servers' addresses as the fewest networks (172.30.99.10/31), holding no other address: not the
    # controller's.
    peers = [
        ipaddress.ip_network(rule[2])
        for rule in allowed
        if rule[:2] == ["Anywhere", "ALLOW"] and rule[2][0].isdigit()
    ]
    assert any(ipaddress.ip_address("172.30.99.10") in net for net in peers), rules
    assert not any(ipaddress.ip_address("172.30.99.1") in net for net in peers), rules
    assert sum(net.num_addresses for net in peers) == len(SERVERS), rules
    assert any(rule[0] == "22/tcp" and "172.30.99.1" in rule for rule in allowed), rules
    subprocess.run(
        ["docker", "exec", "-d", "sim-server1", "python3", "-m", "http.server", "9000"], check=True
    )
    time.sleep(1)
    try:
        probe = (
            'python3 -c "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)"'
        )
        # A port no one pinned (gloo and NCCL listen on such ports) answers the other server...
        on_server("sim-server0", f"{probe} 172.30.99.11 9000")
        # ...and not the controller, which is no server of the cluster.
        with pytest.raises(OSError):
            socket.create_connection(("172.30.99.11", 9000), 3).close()
    finally:
        on_server("sim-server1", "pkill -f 'http.server 9000'", check=False)
