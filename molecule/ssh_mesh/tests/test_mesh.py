"""The mesh as a user meets it: logins between real containers with host-key checking on."""

import os

import pytest
import testinfra.utils.ansible_runner

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")
NODES = ["mesh0", "mesh1"]


@pytest.mark.parametrize("target", NODES)
def test_login_to_every_node_without_prompt(host, target):
    result = host.run(f"ssh {target} hostname")
    assert result.rc == 0, result.stderr
    assert result.stdout.strip() == target


def test_client_checks_host_keys_on_the_cluster_port(host):
    config = host.run("ssh -G mesh1").stdout.splitlines()
    assert "stricthostkeychecking true" in config
    assert "port 2222" in config
    assert "batchmode yes" in config


def test_known_hosts_pins_each_node_s_real_host_key(host):
    known = host.file("/etc/ddp-cluster/known_hosts").content_string
    for node in NODES:
        key = host.run(f"ssh-keyscan -p 2222 -t ed25519 {node}").stdout.split()
        assert key, f"no host key from {node}"
        assert f"[{node}]:2222 {key[1]} {key[2]}" in known


# The refusals are sshd's and the client's on a new connection: ControlPath=none, since the mesh's ssh_config
# shares one connection per node (ControlMaster) and a login through it is never checked again.
FRESH = "-o ControlPath=none"


def test_unknown_host_key_is_refused(host):
    result = host.run(f"ssh {FRESH} -o UserKnownHostsFile=/dev/null mesh1 true")
    assert result.rc != 0
    assert "verification failed" in result.stderr or "No ED25519 host key" in result.stderr


def test_password_login_is_refused(host):
    result = host.run(
        f"ssh {FRESH} -o PubkeyAuthentication=no -o PasswordAuthentication=yes -o BatchMode=yes mesh1 true"
    )
    assert result.rc != 0
    assert "Permission denied" in result.stderr


def test_private_key_is_readable_by_root_only(host):
    key = host.file("/root/.ssh/id_ddp_cluster")
    assert key.mode == 0o600
    assert key.user == "root"


def test_authorized_keys_holds_only_the_cluster_key_from_the_cluster_network(host):
    lines = host.file("/etc/ddp-cluster/authorized_keys").content_string.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith('from="10.213.7.0/24" ssh-ed25519 ')
    assert lines[0].endswith("ddp-cluster-molecule-mesh")


def test_the_cluster_key_is_refused_from_outside_the_cluster_network(host):
    # The node's own sshd with the cluster key, over its loopback: 127.0.0.1 is not in from="...".
    options = f"{FRESH} -p 2222 -i /root/.ssh/id_ddp_cluster -o IdentitiesOnly=yes -o BatchMode=yes"
    options += " -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
    outside = host.run(f"ssh {options} root@127.0.0.1 true")
    assert outside.rc != 0
    assert "Permission denied" in outside.stderr
    assert host.run("ssh mesh0 true").rc == 0  # the same login from its cluster address


def test_a_key_a_job_leaves_in_roots_home_lets_nobody_in(host):
    # sshd reads the mesh's file only: a key in ~/.ssh/authorized_keys (a job runs as root) is not honoured.
    settings = host.run("$(command -v sshd || echo /usr/sbin/sshd) -T").stdout.lower().splitlines()
    assert "authorizedkeysfile /etc/ddp-cluster/authorized_keys" in settings
    assert "permituserrc no" in settings
    host.run("ssh-keygen -q -t ed25519 -N '' -f /tmp/job-key")
    try:
        host.run("install -m 0600 /tmp/job-key.pub /root/.ssh/authorized_keys")
        # no ssh_config (-F /dev/null): the job's key alone is offered, not the cluster key the config names
        options = f"-F /dev/null {FRESH} -p 2222 -i /tmp/job-key -o IdentitiesOnly=yes -o BatchMode=yes"
        options += " -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
        login = host.run(f"ssh {options} root@mesh0 true")
        assert login.rc != 0 and "Permission denied" in login.stderr
    finally:
        host.run("rm -f /root/.ssh/authorized_keys /tmp/job-key /tmp/job-key.pub")
