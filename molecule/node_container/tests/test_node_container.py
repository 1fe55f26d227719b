"""The node container as the engine and a user see it."""

import json
import time

import pytest

NODE = "mol-node"
PORT = 2200


def inspect(host):
    return json.loads(host.check_output(f"docker inspect {NODE}"))[0]


def exec_in(host, command):
    return host.run(f"docker exec {NODE} bash -lc {command!r}")


def test_runs_with_a_restart_policy_and_init(host):
    info = inspect(host)
    assert info["State"]["Running"]
    assert info["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"
    assert info["HostConfig"]["Init"] is True
    assert info["Config"]["Hostname"] == NODE


def test_sshd_is_the_main_process_on_the_cluster_port(host):
    assert exec_in(host, f"ss -Htln 'sport = :{PORT}'").stdout.strip()
    # docker-init is process 1 (it reaps ended sessions); its one child is sshd, the entrypoint having exec'd
    # it.
    children = exec_in(host, "ps -o comm= --ppid 1").stdout.split()
    assert children[:1] == ["sshd"], children


@pytest.mark.parametrize(
    "line", [f"port {PORT}", "passwordauthentication no", "permitrootlogin without-password", "usepam no"]
)
def test_sshd_effective_configuration(host, line):
    assert line in exec_in(host, "sshd -T").stdout.splitlines()


def test_node_settings_file_on_the_host(host):
    # The node's directory is named after its inventory host (engine), whatever its container is called.
    settings = host.file("/tmp/ddp-molecule-nodes/engine/etc/node.env")
    assert settings.mode == 0o644
    assert settings.user == "root"
    assert "export MOLECULE_SETTING='from the role'" in settings.content_string


def test_node_settings_reach_a_non_interactive_shell(host):
    out = host.run(f"docker exec {NODE} bash -c 'SSH_CLIENT=x bash -c \"echo \\$MOLECULE_SETTING\"'")
    login = exec_in(host, "echo $MOLECULE_SETTING $GLOO_SOCKET_IFNAME $DDP_NODE_NAME").stdout.split()
    assert login == ["from", "the", "role", "eth0", NODE]
    assert out.rc == 0


def test_host_keys_are_kept_across_a_restart(host):
    before = exec_in(host, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout
    assert before.startswith("ssh-ed25519 ")
    host.check_output(f"docker restart {NODE}")
    for _ in range(30):
        if exec_in(host, f"ss -Htln 'sport = :{PORT}'").stdout.strip():
            break
        time.sleep(1)
    assert exec_in(host, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout == before


def test_image_itself_holds_no_host_key(host):
    out = host.run("docker run --rm --entrypoint /bin/sh ddp-cluster/node:latest -c 'ls /etc/ssh'")
    assert out.rc == 0
    assert "ssh_host_" not in out.stdout
