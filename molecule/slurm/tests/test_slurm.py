"""What the slurm role leaves in two node containers: both Slurm nodes, idle, with the cluster's settings and
its key."""

import hashlib
import os
from pathlib import Path

import testinfra.utils.ansible_runner

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")
KEY = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "cluster-key" / "munge.key"
# The compiled cluster, in the cluster's controller directory (cluster_controller_dir).
COMPILED = Path.home() / ".ddp-cluster" / "molecule-slurm" / "compiled"


def test_both_nodes_are_idle_in_the_default_partition(host):
    shown = host.check_output("sinfo -h -N -o '%N %P %t %c'").splitlines()
    assert sorted(shown) == ["slurm0 ddp* idle 2", "slurm1 ddp* idle 2"]


def test_slurm_conf_is_the_compiled_one_and_slurmctld_runs_on_the_first_node_only(host):
    wanted = (COMPILED / "slurm.conf").read_text()
    assert host.file("/etc/slurm/slurm.conf").content_string == wanted
    assert "SlurmctldHost=slurm0\n" in wanted and "ClusterName=molecule_slurm\n" in wanted
    name = host.check_output("hostname")
    assert host.run("pgrep -x slurmctld").rc == (0 if name == "slurm0" else 1)
    assert host.run("pgrep -x slurmd").rc == 0 and host.run("pgrep -x munged").rc == 0


def test_the_munge_key_is_the_controllers_0600_and_munges_own_0400(host):
    key = KEY
    assert key.stat().st_mode & 0o777 == 0o600
    digest = hashlib.sha256(key.read_bytes()).hexdigest()
    installed = host.file("/etc/ddp-cluster/munge.key")
    assert installed.mode == 0o600 and installed.user == "root"
    assert host.check_output("sha256sum < /etc/ddp-cluster/munge.key").split()[0] == digest
    own = host.file("/etc/munge/munge.key")
    assert own.mode == 0o400 and own.user == "munge"


def test_a_step_runs_across_both_nodes(host):
    ran = host.run("timeout 60 srun -N2 --ntasks-per-node=1 hostname")
    assert ran.rc == 0, ran.stderr
    assert sorted(ran.stdout.split()) == ["slurm0", "slurm1"]
