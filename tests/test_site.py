"""site.yml on the local inventory: from nothing to node containers with an SSH mesh, and again."""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
import time

from conftest import PlaybookResult, docker, node_exec, recap_json, run_playbook

PRIVATE_KEY_MARKERS = (b"PRIVATE KEY-----", b"openssh-key-v1")


def host_key(node: str) -> str:
    return node_exec(node, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1]


def wait_for_sshd(node: str, port: int = 12345, seconds: int = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if node_exec(node, f"ss -Htln 'sport = :{port}'", check=False).stdout.strip():
            return
        time.sleep(1)
    raise AssertionError(f"sshd in {node} did not listen on {port} within {seconds} s")


def test_site_brings_up_every_node(local_cluster: PlaybookResult) -> None:
    assert {"node0", "node1"} <= set(local_cluster.stats["ok"])
    assert local_cluster.failed_hosts() == {}
    for node in ("node0", "node1"):
        state = docker(
            "inspect", "-f", "{{.State.Running}} {{.HostConfig.RestartPolicy.Name}}", node
        ).stdout.split()
        assert state == ["true", "unless-stopped"]


def test_second_run_changes_nothing(local_cluster: PlaybookResult) -> None:
    again = run_playbook("site.yml")
    assert again.rc == 0, again.stdout[-4000:]
    assert again.changed_hosts() == {}, recap_json(again)


def test_check_mode_reports_no_change(local_cluster: PlaybookResult) -> None:
    check = run_playbook("site.yml", cmdline="--check --diff")
    assert check.rc == 0, check.stdout[-4000:]
    assert check.changed_hosts() == {}, recap_json(check)


def test_ssh_between_nodes_without_prompt(local_cluster: PlaybookResult) -> None:
    assert node_exec("node0", "ssh node1 hostname").stdout.strip() == "node1"
    assert node_exec("node1", "ssh node0 hostname").stdout.strip() == "node0"


def test_mpirun_runs_on_both_nodes(local_cluster: PlaybookResult) -> None:
    out = node_exec("node0", "timeout 60 mpirun -H node0,node1 hostname").stdout.split()
    assert sorted(out) == ["node0", "node1"]


def test_environment_reaches_non_interactive_ssh(local_cluster: PlaybookResult) -> None:
    # mpirun starts remote ranks as `ssh node cmd`: Debian's ~/.bashrc returns early for such shells.
    out = node_exec(
        "node0", "ssh node1 'command -v python; echo $GLOO_SOCKET_IFNAME; echo $DDP_NODE_NAME'"
    ).stdout
    assert out.split() == ["/opt/venv/bin/python", "eth0", "node1"]
    assert node_exec("node0", "ssh node1 \"python -c 'import ddp_cluster.runtime.train'\"").returncode == 0


def test_password_login_is_off(local_cluster: PlaybookResult) -> None:
    config = node_exec("node1", "sshd -T").stdout.splitlines()
    assert "passwordauthentication no" in config
    assert "permitrootlogin without-password" in config
    assert "port 12345" in config
    refused = node_exec(
        # A new connection (ControlPath=none): the mesh's ssh_config shares one per node, never checked again.
        "node0",
        "ssh -o ControlPath=none -o PubkeyAuthentication=no -o PasswordAuthentication=yes node1 true",
        check=False,
    )
    assert refused.returncode != 0
    assert "Permission denied" in refused.stderr


def scan_layer(layer: tarfile.TarFile) -> list[str]:
    """Names of key files, and of small files holding a private key, in one image layer."""
    found = []
    for entry in layer:
        if re.search(r"ssh_host_.*_key$|(^|/)id_(rsa|ecdsa|ed25519|ddp_cluster)$", entry.name):
            found.append(entry.name)
        elif entry.isfile() and entry.size < 65536:
            content = layer.extractfile(entry).read()  # type: ignore[union-attr]
            if any(marker in content for marker in PRIVATE_KEY_MARKERS):
                found.append(entry.name)
    return found


def test_image_holds_no_private_key(local_cluster: PlaybookResult) -> None:
    image = docker("inspect", "-f", "{{.Config.Image}}", "node0").stdout.strip()
    saved = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    offenders: list[str] = []
    layers = 0
    assert saved.stdout is not None
    with tarfile.open(fileobj=saved.stdout, mode="r|") as archive:
        for member in archive:
            if not member.isfile():
                continue
            data = archive.extractfile(member).read()  # type: ignore[union-attr]
            try:
                layer = tarfile.open(fileobj=io.BytesIO(data))
            except tarfile.TarError:
                continue  # a manifest or config, not a layer
            with layer:
                layers += 1
                offenders += [f"{member.name}:{name}" for name in scan_layer(layer)]
    assert saved.wait(timeout=600) == 0
    assert layers >= 5, "docker save yielded too few layers to have scanned the image"
    assert offenders == []


def test_host_keys_survive_a_restart(local_cluster: PlaybookResult) -> None:
    before = host_key("node1")
    docker("restart", "node1")
    wait_for_sshd("node1")
    assert host_key("node1") == before
    assert node_exec("node0", "ssh node1 hostname").stdout.strip() == "node1"


def test_recreated_node_is_pinned_again(local_cluster: PlaybookResult) -> None:
    old_key = host_key("node1")
    docker("rm", "-f", "node1")
    result = run_playbook("site.yml")
    assert result.rc == 0, result.stdout[-4000:]
    new_key = host_key("node1")
    assert new_key != old_key
    known = node_exec("node0", "cat /etc/ddp-cluster/known_hosts").stdout
    node1_entries = [line for line in known.splitlines() if line.startswith("[node1]:12345 ")]
    assert node1_entries == [f"[node1]:12345 ssh-ed25519 {new_key}"]
    assert old_key not in known
    assert node_exec("node0", "ssh node1 hostname").stdout.strip() == "node1"
