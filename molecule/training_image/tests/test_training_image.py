"""The image the role built: content-addressed tag, what it holds and what it must never hold."""

import re

IMAGE = "ddp-cluster/molecule-node"


def run_in_image(host, command):
    return host.run(f"docker run --rm --entrypoint /bin/bash {IMAGE}:latest -c {command!r}")


def test_tagged_by_a_hash_of_its_inputs_and_as_latest(host):
    tags = host.check_output(f"docker images --format '{{{{.Tag}}}}' {IMAGE}").split()
    assert "latest" in tags
    assert any(re.fullmatch(r"[0-9a-f]{16}", tag) for tag in tags)


def test_holds_openmpi_sshd_torch_and_the_package(host):
    out = run_in_image(
        host,
        "mpirun --version | head -1; /usr/sbin/sshd -V 2>&1 | head -1; "
        "python -c 'import torch, ddp_cluster.runtime.train; print(torch.__version__)'",
    )
    assert out.rc == 0, out.stderr
    assert "Open MPI" in out.stdout
    assert "OpenSSH" in out.stdout


def test_holds_no_host_key_and_no_private_key(host):
    out = run_in_image(
        host, "ls /etc/ssh; ls -a /root/.ssh; grep -rl 'PRIVATE KEY' /etc /root 2>/dev/null || true"
    )
    assert out.rc == 0
    assert "ssh_host_" not in out.stdout
    assert "id_" not in out.stdout
    assert "PRIVATE" not in out.stdout


def test_environment_is_read_first_in_root_s_bashrc(host):
    # Before anything that could return early for non-interactive shells (as /etc/skel's bashrc does).
    out = run_in_image(host, "grep -v '^#' /root/.bashrc | grep -v '^$' | head -1")
    assert out.stdout.strip() == "[ -r /etc/ddp-cluster/env.sh ] && . /etc/ddp-cluster/env.sh"


def test_no_package_index_was_needed(host):
    # The wheelhouse came from the controller: pip inside the image has no index configured and none was used.
    out = run_in_image(host, "/opt/venv/bin/pip config list; ls /tmp")
    assert "index-url" not in out.stdout
    assert "wheelhouse" not in out.stdout
