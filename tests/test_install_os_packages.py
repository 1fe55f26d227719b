"""docker/install-os-packages.sh, which the node image's build runs on the user's base: what it installs with
each package manager, and that it installs nothing on a base that has everything. apt-get runs for real in
every image build (tests/test_site.py, the sim); dnf and yum, which no base here has, are fakes that record
their arguments, on the project's Debian base with apt-get taken away: the commands are checked, not run."""

from __future__ import annotations

import subprocess

from test_base_images import READY, READY_DOCKERFILE

from conftest import REPO

BASE = "ddp-cluster/base:bookworm"
SCRIPT = REPO / "docker" / "install-os-packages.sh"


def in_base(setup: str, *args: str, env: str = "") -> subprocess.CompletedProcess[str]:
    """The script in a throwaway container of the base, after setup (a shell line), with args."""
    command = f"{setup}; {env} sh /install.sh {' '.join(args)}"
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "-v", f"{SCRIPT}:/install.sh:ro", BASE,
         "sh", "-c", command],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


# apt-get taken away, a package manager {0} that records its arguments in /calls and installs nothing.
FAKE = (
    "rm -f /usr/bin/apt-get; printf '#!/bin/sh\\necho \"$0 $*\" >> /calls\\n' > /usr/local/bin/{0}; "
    "chmod +x /usr/local/bin/{0}"
)


def test_dnf_installs_the_rpm_names_of_what_the_base_lacks() -> None:
    done = in_base(FAKE.format("dnf"), "htop", env="DDP_DRY_RUN=1")
    assert done.returncode == 0, done.stderr
    # The Debian minbase lacks them all: sshd, ssh, mpirun, ip, ss, pkill, a venv-capable python3 and Slurm.
    assert done.stdout.strip() == (
        "dnf install -y openssh-server openssh-clients openmpi iproute procps-ng python3 slurm-slurmd"
        " slurm-slurmctld slurm munge ca-certificates htop"
        " && dnf clean all && rm -rf /var/cache/dnf"
    )
    assert "installing with dnf: openssh-server" in done.stderr


def test_yum_is_the_last_resort() -> None:
    done = in_base(FAKE.format("yum"), env="DDP_DRY_RUN=1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("yum install -y openssh-server openssh-clients openmpi ")


def test_the_install_runs_and_a_base_that_still_lacks_a_tool_fails_naming_it() -> None:
    # The fake dnf installs nothing: the script runs it, then names what is still missing.
    done = in_base(FAKE.format("dnf") + "; :", "&& cat /calls")
    assert done.returncode != 0
    assert (
        "still missing after the install: sshd ssh mpirun ip ss pkill python3(venv)"
        " slurmd slurmctld srun munged" in done.stderr
    )


def test_no_package_manager_and_nothing_missing_installs_nothing_and_drops_host_keys() -> None:
    # The base of tests/test_base_images.py's job on a base without a package manager (the same build,
    # cached).
    ready = subprocess.run(
        ["docker", "build", "-q", "-t", READY, "-"], input=READY_DOCKERFILE, capture_output=True, text=True
    )
    assert ready.returncode == 0, ready.stderr
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "-v", f"{SCRIPT}:/install.sh:ro", READY, "sh", "-c",
         "ssh-keygen -A >/dev/null && sh /install.sh && ls /etc/ssh/ssh_host_* 2>/dev/null | wc -l"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "nothing to install" in done.stderr
    assert done.stdout.strip() == "0"


def test_no_package_manager_and_something_missing_is_refused_naming_it() -> None:
    done = in_base("rm -f /usr/bin/apt-get")
    assert done.returncode == 1
    assert (
        "the base image lacks sshd" in done.stderr
        and "has no package manager (apt-get, dnf, yum)" in done.stderr
    )


def test_openmpi_where_rpm_distributions_put_it_counts_and_the_node_environment_finds_it() -> None:
    # openEuler's and RHEL's openmpi package: mpirun under /usr/lib64/openmpi/bin, not on PATH.
    ready = subprocess.run(
        ["docker", "build", "-q", "-t", READY, "-"], input=READY_DOCKERFILE, capture_output=True, text=True
    )
    assert ready.returncode == 0, ready.stderr
    env_sh = REPO / "docker" / "env.sh"
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "-v", f"{SCRIPT}:/install.sh:ro",
         "-v", f"{env_sh}:/env.sh:ro", READY, "sh", "-c",
         "mkdir -p /usr/lib64/openmpi/bin && mv \"$(command -v mpirun)\" /usr/lib64/openmpi/bin/mpirun"
         " && ! command -v mpirun >/dev/null && DDP_REPORT=1 sh /install.sh | grep mpirun"
         " && . /env.sh && command -v mpirun"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["tool:", "mpirun", "/usr/lib64/openmpi/bin/mpirun"]
