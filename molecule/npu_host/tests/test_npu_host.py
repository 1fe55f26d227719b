"""What the npu_host role leaves on an Ascend host: kernel settings live and persistent, chip check."""

import os

import pytest
import testinfra.utils.ansible_runner

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")

SYSCTL_FILE = "/etc/sysctl.d/90-ddp-cluster.conf"
# What prepare.yml reserved before the role ran, and the union the role must leave.
EXPECTED_RESERVED = {"npu-open": "22222,60000-60015", "npu-off": "60000-60015"}


@pytest.fixture
def name(host):
    return host.backend.get_hostname()


def test_hccl_ports_are_reserved_and_earlier_reservations_kept(host, name):
    assert host.sysctl("net.ipv4.ip_local_reserved_ports") == EXPECTED_RESERVED[name]


def test_settings_persist_in_sysctl_d(host, name):
    conf = host.file(SYSCTL_FILE)
    assert conf.is_file
    assert conf.user == "root"
    lines = {
        line.replace(" ", "")
        for line in conf.content_string.splitlines()
        if line and not line.startswith("#")
    }
    assert lines == {
        f"net.ipv4.ip_local_reserved_ports={EXPECTED_RESERVED[name]}",
    }


def test_the_file_alone_restores_the_settings(host, name):
    """A reboot applies only the file: reset the live values, load the file, read them back."""
    reset = host.run("sysctl -w net.ipv4.ip_local_reserved_ports=")
    assert reset.rc == 0, reset.stderr
    load = host.run(f"sysctl -p {SYSCTL_FILE}")
    assert load.rc == 0, load.stderr
    assert host.sysctl("net.ipv4.ip_local_reserved_ports") == EXPECTED_RESERVED[name]


def test_chips_were_counted_with_npu_smi(host):
    calls = host.file("/var/lib/ddp-doubles/calls.log").content_string.splitlines()
    assert "npu-smi info -l" in calls
    assert not [call for call in calls if call.startswith("hccn_tool")]
