"""What cluster_host leaves on a server: requests for the Docker modules, the firewall opened to peers
only."""

import os
import subprocess
from pathlib import Path

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


def test_active_ufw_lets_each_peer_through_and_no_one_else(host, name):
    if name != "host-ufw":
        pytest.skip("ufw is not open on this host")
    rules = [line.split() for line in host.check_output("ufw status").splitlines() if "ALLOW" in line]
    # "Anywhere ALLOW 10.20.0.10": every port, from that peer only.
    assert sorted(rule[2] for rule in rules if rule[0] == "Anywhere") == PEERS
    assert not [rule for rule in rules if rule[2] == "Anywhere" and "ddp-cluster" in " ".join(rule)]


def test_disabled_turns_an_active_ufw_off(host, name):
    if name != "host-disable":
        pytest.skip("not asked to disable the firewall")
    assert "Status: inactive" in host.check_output("ufw status")


def test_inactive_ufw_is_left_alone(host, name):
    if name != "host-plain":
        pytest.skip("ufw is on on this host")
    status = host.check_output("ufw status verbose")
    assert "Status: inactive" in status
    assert "ddp-cluster" not in host.check_output("ufw show added")


def test_a_server_with_no_firewall_is_stopped_unless_unmanaged(host, name):
    if name != "host-plain":
        pytest.skip("a firewall is on on this host")
    scenario = Path(__file__).resolve().parents[1]
    repository = scenario.parents[1]
    environ = os.environ | {
        "ANSIBLE_ROLES_PATH": str(repository / "roles"),
        "ANSIBLE_FILTER_PLUGINS": str(repository / "plugins" / "filter"),
        "ANSIBLE_NOCOLOR": "1",
    }
    # The same server with the default (open): stopped in the role's preflight, named, nothing changed.
    run = subprocess.run(
        ["ansible-playbook", "-i", inventory, str(scenario / "converge.yml"), "--limit", name,
         "-e", "cluster_host_firewall=open"],
        capture_output=True, text=True, env=environ, timeout=300,
    )  # fmt: skip
    assert run.returncode != 0
    said = "host-plain: no firewall is active on this server (ufw is not active"
    assert said in run.stdout + run.stderr, run.stdout[-3000:] + run.stderr[-3000:]
    assert "changed=0" in run.stdout
    assert "Status: inactive" in host.check_output("ufw status")
