"""After every failure case: each one ran and failed, and npu_host never reached the kernel or the
firewall."""

import os

import testinfra.utils.ansible_runner

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")

CASES = {
    "missing-driver",
    "driver-not-loaded",
    "no-npu-smi",
    "fewer-chips-than-planned",
    "preflight-bad-plan",
    "preflight-mixed-tls",
    "hccn-bad-plan",
    "six-devices-on-atlas-training",
    "planned-device-missing",
    "set-refused",
    "unhealthy-devices",
}


def test_every_case_ran_and_recorded_its_error(host):
    recorded = {name[: -len(".txt")] for name in host.file("/var/lib/molecule-cases").listdir()}
    assert recorded == CASES
    for case in CASES:
        assert host.file(f"/var/lib/molecule-cases/{case}.txt").content_string.strip()


def test_failed_driver_checks_left_the_kernel_settings_alone(host):
    assert not host.file("/etc/sysctl.d/90-ddp-cluster.conf").exists
    assert host.sysctl("net.ipv4.ip_local_reserved_ports") in ("", None)
