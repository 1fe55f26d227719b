"""What cluster_host leaves on a server: requests for the Docker modules, the firewall opened to peers only."""

import os

import pytest
import testinfra.utils.ansible_runner

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")

PEERS = ["10.20.0.10", "10.20.0.11"]


@pytest.fixture
def name(host):
    return host.backend.get_hostname()


def test_server_python_imports_requests(host):
    assert host.run("/usr/bin/python3 -c 'import requests'").rc == 0


def test_active_ufw_lets_the_cluster_ports_through_from_each_peer_only(host, name):
    if name != "host-ufw":
        pytest.skip("ufw is off on this host")
    ephemeral = host.file("/proc/sys/net/ipv4/ip_local_port_range").content_string.split()
    ports = f"12345,29501,29510:29519,{ephemeral[0]}:{ephemeral[1]}/tcp"
    rules = [line.split() for line in host.check_output("ufw status").splitlines() if "ALLOW" in line]
    opened = [rule for rule in rules if rule[0] == ports]
    assert sorted(rule[2] for rule in opened) == PEERS
    # Nothing from anywhere: no rule of the role without a source address.
    assert not [rule for rule in rules if rule[0] == ports and rule[2] == "Anywhere"]


def test_inactive_ufw_is_left_alone(host, name):
    if name != "host-plain":
        pytest.skip("ufw is on on this host")
    status = host.check_output("ufw status verbose")
    assert "Status: inactive" in status
    assert "ddp-cluster" not in host.check_output("ufw show added")
