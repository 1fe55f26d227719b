"""The device network the hccn_network role leaves: planned addresses, set once, healthy; no rank table."""

import json
import os
import shlex

import pytest
import testinfra.utils.ansible_runner

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")

# The Ascend PyTorch DDP manual's two servers (AI Server0, AI Server1).
PLAN = {
    "hccn0": [
        "192.168.100.101",
        "192.168.101.101",
        "192.168.102.101",
        "192.168.103.101",
        "192.168.100.100",
        "192.168.101.100",
        "192.168.102.100",
        "192.168.103.100",
    ],
    "hccn1": [
        "192.168.100.111",
        "192.168.101.111",
        "192.168.102.111",
        "192.168.103.111",
        "192.168.100.110",
        "192.168.101.110",
        "192.168.102.110",
        "192.168.103.110",
    ],
}
PEER = {"hccn0": "hccn1", "hccn1": "hccn0"}
# Devices prepare.yml left correctly configured: the role must not set them.
PRECONFIGURED = {"hccn0": {0}, "hccn1": set()}


@pytest.fixture
def name(host):
    return host.backend.get_hostname()


def calls(host):
    return [
        shlex.split(line) for line in host.file("/var/lib/ddp-doubles/calls.log").content_string.splitlines()
    ]


@pytest.mark.parametrize("device", range(8))
def test_device_reports_its_planned_address(host, name, device):
    out = host.check_output(f"hccn_tool -i {device} -ip -g")
    assert out.splitlines() == [f"ipaddr:{PLAN[name][device]}", "netmask:255.255.255.0"]


@pytest.mark.parametrize("device", range(8))
def test_device_probes_the_same_device_of_the_other_server_and_is_healthy(host, name, device):
    assert (
        host.check_output(f"hccn_tool -i {device} -netdetect -g")
        == f"netdetect address: {PLAN[PEER[name]][device]}"
    )
    assert host.check_output(f"hccn_tool -i {device} -net_health -g") == "net health status: Success"


def test_state_holds_exactly_what_was_set(host, name):
    state = json.loads(host.file("/var/lib/ddp-doubles/state.json").content_string)
    expected = {
        str(d): {"ipaddr": PLAN[name][d], "netmask": "255.255.255.0", "netdetect": PLAN[PEER[name]][d]}
        for d in range(8)
        if d not in PRECONFIGURED[name]
    }
    assert state == expected


def test_each_setting_was_set_once_and_only_where_it_differed(host, name):
    """converge, idempotence and check all ran: one -s per setting in total, none for preconfigured
    devices."""
    sets = [call for call in calls(host) if "-s" in call]
    ip_sets = sorted(int(call[2]) for call in sets if call[3] == "-ip")
    detect_sets = sorted(int(call[2]) for call in sets if call[3] == "-netdetect")
    wanted = sorted(set(range(8)) - PRECONFIGURED[name])
    assert ip_sets == wanted
    assert detect_sets == wanted
    assert len(sets) == 2 * len(wanted)


def test_every_device_was_read_before_the_first_set(host):
    log = calls(host)
    first_set = next(i for i, call in enumerate(log) if "-s" in call)
    read_before = {int(call[2]) for call in log[:first_set] if call[3:] == ["-ip", "-g"]}
    assert read_before == set(range(8))


def test_no_whole_cluster_rank_table_is_written(host, name):
    """Each job writes its own rank table: the role writes none into the node's settings directory, which
    every job's containers see."""
    assert not host.file(f"/var/lib/ddp-cluster/{name}/etc/rank_table.json").exists
