"""What the cluster exposes on the servers' networks: the node's sshd and a job's master port listen on the
node's cluster address only, the cluster key logs in only from the cluster's addresses, and a server with no
firewall on is not served silently. After the jobs' file: the firewall test turns sim-server1's ufw off and on
again."""

from __future__ import annotations

import os
import signal
import time

import pytest

from .conftest import SERVERS, SIM, job_id, on_node, on_server, site, wait_engine, wait_for_progress
from conftest import PlaybookResult, run_playbook, start_train

ADDRESSES = {"sim-server0": "172.30.99.10", "sim-server1": "172.30.99.11"}
SSH_PORT, MASTER_PORT = 12345, 29501
CONNECT = 'python3 -c "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)"'


def listening(server: str, port: int) -> list[str]:
    """The local addresses of what listens on PORT in the server's network namespace (`ss -ltnp`), with the
    process, one line each."""
    lines = on_server(server, f"ss -Hltnp 'sport = :{port}'").stdout.splitlines()
    return [" ".join(line.split()[3:4] + line.split()[5:6]) for line in lines]


@pytest.fixture(scope="module")
def servers_up(sim_cluster: PlaybookResult) -> None:
    """The jobs' file kills and starts servers again: their engines and nodes are back before these tests."""
    for server in SERVERS:
        wait_engine(server)
        deadline = time.monotonic() + 90
        while not listening(server, SSH_PORT):
            assert time.monotonic() < deadline, f"{server}: the node's sshd is not back within 90 s"
            time.sleep(1)


def test_the_nodes_sshd_listens_on_its_cluster_address_only(servers_up: None) -> None:
    for server, address in ADDRESSES.items():
        [where] = listening(server, SSH_PORT)
        assert where.startswith(f"{address}:{SSH_PORT} "), where
        # The server's other addresses (its loopback here) do not answer.
        assert on_server(server, f"{CONNECT} 127.0.0.1 {SSH_PORT}", check=False).returncode != 0
        on_server(server, f"{CONNECT} {address} {SSH_PORT}")


def test_the_cluster_key_logs_in_only_from_the_clusters_addresses(servers_up: None) -> None:
    for server in SERVERS:
        line = on_node(server, "cat /etc/ddp-cluster/authorized_keys").stdout.strip()
        # The servers' addresses as the fewest networks: exactly the two of them.
        assert line.startswith('from="172.30.99.10/31" ssh-ed25519 '), line
        assert line.endswith(" ddp-cluster-sim"), line
    # The mesh still logs in, each way.
    assert on_node("sim-server0", "ssh sim-server1 hostname").stdout.strip() == "sim-server1"
    assert on_node("sim-server1", "ssh sim-server0 hostname").stdout.strip() == "sim-server0"


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_a_jobs_master_port_listens_on_the_first_nodes_cluster_address_only(
    servers_up: None, launcher: str
) -> None:
    job = job_id(f"port-{launcher}")
    args = "--dataset synthetic --synthetic-samples 200000 --epochs 50 --batch-size 64 --log-every 50"
    playbook = start_train(job, args, SIM, extra=("-e", f"launcher={launcher}"))
    try:
        wait_for_progress(playbook, job)
        # Rank 0's store (mpirun) or node 0's torchrun agent's: each listener on the address only.
        held = listening("sim-server0", MASTER_PORT)
        answers_loopback = on_server("sim-server0", f"{CONNECT} 127.0.0.1 {MASTER_PORT}", check=False)
    finally:
        stop = run_playbook("jobs.yml", extravars={"stop": job}, inventory=SIM)
        try:
            playbook.communicate(timeout=180)
        finally:
            if playbook.poll() is None:
                os.killpg(playbook.pid, signal.SIGTERM)
    assert stop.rc == 0, stop.stdout[-3000:]
    assert held, "nothing listened on the master port during the job"
    assert all(line.startswith(f"172.30.99.10:{MASTER_PORT} ") for line in held), held
    assert answers_loopback.returncode != 0


def test_a_server_without_a_firewall_stops_site_unless_unmanaged(
    servers_up: None, healthy_again: None
) -> None:
    assert "Status: active" in on_server("sim-server1", "ufw status").stdout
    on_server("sim-server1", "ufw disable")
    try:
        stopped = site()
        passed = site(cluster_host_firewall="unmanaged")
    finally:
        on_server("sim-server1", "ufw --force enable")
    assert stopped.rc != 0
    said = "sim-server1: no firewall is active on this server (ufw is not active, firewalld is not running)"
    assert said in stopped.stdout, stopped.stdout[-4000:]
    assert "sim-server0: no firewall" not in stopped.stdout
    assert stopped.changed_hosts() == {}, stopped.stdout[-4000:]
    assert passed.rc == 0, passed.stdout[-4000:]
    # ufw kept its rules while it was off: on again, the cluster's servers get through as before.
    assert "Status: active" in on_server("sim-server1", "ufw status").stdout
    on_server("sim-server0", f"{CONNECT} 172.30.99.11 {SSH_PORT}")
