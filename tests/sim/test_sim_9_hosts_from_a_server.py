"""Ansible run on a server of the cluster (ansible_connection: local for that one), last: it resets that
server's firewall to its first boot's before the hosts stage opens it again."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .conftest import on_server
from conftest import REPO

SITE_PACKAGES = REPO / ".venv" / "lib" / "python3.11" / "site-packages"
# What ansible-playbook and the modules of the hosts stage import, from this controller's venv (pure Python or
# cp311 wheels: the server's Python is 3.11 too); ansible_collections only for the three collections used.
ANSIBLE_PACKAGES = (
    "ansible", "ansible_core-*.dist-info", "yaml", "_yaml", "jinja2", "markupsafe", "cryptography", "cffi",
    "_cffi_backend*.so", "resolvelib", "packaging", "docker", "requests", "urllib3", "idna",
    "charset_normalizer", "certifi", "ansible_collections/community/docker",
    "ansible_collections/community/general",
    "ansible_collections/ansible/posix", "ansible_collections/community/library_inventory_filtering_v1",
)  # fmt: skip


def test_a_server_that_runs_ansible_itself_gets_the_same_hosts_stage(
    servers: list[str], tmp_path: Path
) -> None:
    """Ansible on sim-server0 (ansible_connection: local for it), sim-server1 over ssh: the hosts stage opens
    sim-server0's firewall to sim-server1 as it opens sim-server1's to sim-server0."""
    bundle = tmp_path / "controller.tar"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    # S: the prefix goes on the names, never into a link's target (roles' module_utils link into python/).
    subprocess.run(
        ["tar", "-cf", str(bundle), "-C", str(REPO), "--transform", "s,^,ddp-cluster/,S", *files], check=True
    )
    names = [
        *ANSIBLE_PACKAGES,
        *(f"{name.lstrip('_')}-*.dist-info" for name in ANSIBLE_PACKAGES if "/" not in name),
    ]
    names += ["pyyaml-*.dist-info"]
    packages = sorted(
        {str(path.relative_to(SITE_PACKAGES)) for name in names for path in SITE_PACKAGES.glob(name)}
    )
    subprocess.run(["tar", "-rf", str(bundle), "-C", str(SITE_PACKAGES),
                    "--transform", "s,^,site-packages/,S", *packages], check=True)  # fmt: skip
    access = Path.home() / ".ddp-cluster" / "sim-servers"
    subprocess.run(["docker", "cp", str(bundle), "sim-server0:/root/controller.tar"], check=True)
    subprocess.run(["docker", "cp", str(access / "id_ed25519"), "sim-server0:/root/id_ed25519"], check=True)
    subprocess.run(["docker", "cp", str(access / "known_hosts"), "sim-server0:/root/known_hosts"], check=True)
    on_server("sim-server0", "mkdir -p /root/ctl /root/.ddp-cluster/sim-servers"
              " && tar -xf /root/controller.tar -C /root/ctl"
              " && mv /root/id_ed25519 /root/known_hosts /root/.ddp-cluster/sim-servers/"
              " && chmod 0600 /root/.ddp-cluster/sim-servers/id_ed25519")  # fmt: skip
    # sim-server0 is where Ansible runs: a local connection, the server's own Python.
    on_server("sim-server0", "printf '%s\\n' 'all:' '  children:' '    nodes:' '      hosts:'"
              " '        sim-server0:' '          ansible_connection: local'"
              " '          ansible_python_interpreter: /usr/bin/python3'"
              " > /root/ctl/ddp-cluster/inventories/sim/local.yml")  # fmt: skip
    # sim-server0's firewall as at its first boot (an earlier site.yml from this machine opened it): only ssh.
    on_server("sim-server0", "ufw --force reset >/dev/null && ufw default deny incoming >/dev/null"
              " && ufw allow 22/tcp >/dev/null && ufw --force enable >/dev/null")  # fmt: skip
    assert "172.30.99.11" not in on_server("sim-server0", "ufw status").stdout
    run = on_server(
        "sim-server0",
        "cd /root/ctl/ddp-cluster && PYTHONPATH=/root/ctl/site-packages"
        " ANSIBLE_PYTHON_INTERPRETER=/usr/bin/python3 python3 -c"
        " 'import sys; from ansible.cli.playbook import main; sys.argv[0] = \"ansible-playbook\"; main()'"
        " -i inventories/sim/hosts.yml -i inventories/sim/local.yml playbooks/hosts.yml 2>&1",
        check=False,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-5000:]
    assert "TASK [cluster_host : Let the cluster's servers through ufw, from each one]" in run.stdout
    # The servers' addresses as the fewest networks, one rule for both.
    assert "changed: [sim-server0] => (item=172.30.99.10/31)" in run.stdout, run.stdout[-5000:]
    assert "172.30.99.10/31" in on_server("sim-server0", "ufw status").stdout
    assert "172.30.99.10/31" in on_server("sim-server1", "ufw status").stdout
    # sim-server1 now reaches a port on sim-server0 that only the opening lets through.
    on_server("sim-server0", "(timeout 20 python3 -m http.server 29599 >/dev/null 2>&1 &)")
    probe = "timeout 2 bash -c '</dev/tcp/172.30.99.10/29599'"
    reached = on_server(
        "sim-server1", f"for i in 1 2 3 4 5; do {probe} && exit 0; sleep 1; done; exit 1", check=False
    )
    assert reached.returncode == 0
