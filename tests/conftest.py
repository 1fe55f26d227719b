"""End-to-end tests: drive the playbooks with ansible-runner against the local inventory (real containers)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ansible_runner
import pytest

REPO = Path(__file__).resolve().parent.parent
LOCAL_INVENTORY = REPO / "inventories" / "local"
STATE_DIR = Path("/var/lib/ddp-cluster")
KEY_DIR = Path.home() / ".ddp-cluster" / "local"


@dataclass
class PlaybookResult:
    rc: int
    status: str
    stats: dict[str, dict[str, int]]
    stdout: str

    def changed_hosts(self) -> dict[str, int]:
        return {host: count for host, count in self.stats.get("changed", {}).items() if count}

    def failed_hosts(self) -> dict[str, int]:
        failures = self.stats.get("failures", {}) | self.stats.get("dark", {})
        return {host: count for host, count in failures.items() if count}


def run_playbook(
    playbook: str,
    extravars: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    cmdline: str = "",
    timeout: int = 900,
    inventory: Path = LOCAL_INVENTORY,
    project: Path = REPO,
) -> PlaybookResult:
    """Run a playbook of this repository (or of a copy of it: project) the way a user does; its recap and
    output."""
    envvars = {
        "ANSIBLE_FORCE_COLOR": "false",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(project / "ansible.cfg"),
        # The tests read what each task did, skipped ones too; a user's output leaves those out (ansible.cfg).
        "ANSIBLE_DISPLAY_SKIPPED_HOSTS": "true",
        # ansible-runner puts its own callback directory in place of ansible.cfg's; it keeps one set here.
        "ANSIBLE_CALLBACK_PLUGINS": str(project / "plugins" / "callback"),
        "PATH": os.path.dirname(os.path.realpath(shutil.which("ansible-playbook") or ""))
        + ":"
        + os.environ["PATH"],
    }
    envvars |= env or {}
    with tempfile.TemporaryDirectory(prefix="ddp-runner-") as private:
        runner = ansible_runner.run(
            private_data_dir=private,
            project_dir=str(project),
            playbook=str(project / playbook),
            inventory=str(inventory),
            extravars=extravars or {},
            envvars=envvars,
            cmdline=cmdline or None,
            quiet=True,
            timeout=timeout,
            suppress_env_files=True,
        )
        stdout = runner.stdout.read()
        stats = runner.stats or {}
        return PlaybookResult(rc=runner.rc, status=runner.status, stats=stats, stdout=stdout)


def start_train(
    job: str,
    script_args: str,
    inventory: Path = LOCAL_INVENTORY,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """Start train.yml on 2 nodes in the background, as a user does in a terminal (a test then breaks a
    node, or presses Ctrl-C); ``extra``: more ansible-playbook arguments (-e nodes=3 wins over nodes=2)."""
    return subprocess.Popen(
        [
            *(str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), "train.yml"),
            *("-e", f"job_id={job}", "-e", "nodes=2", "-e", f"script_args='{script_args}'", *extra),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=os.environ | (env or {}) | {"ANSIBLE_NOCOLOR": "1"},
        start_new_session=True,
    )


def docker(*args: str, check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


def node_exec(
    node: str, command: str, check: bool = True, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    """Run a command in a node container as a login shell would (bash -lc)."""
    return docker("exec", node, "bash", "-lc", command, check=check, timeout=timeout)


def teardown_cluster(nodes: int = 16) -> None:
    names = [f"node{index}" for index in range(nodes)]
    docker("rm", "-f", *names, check=False)
    docker("network", "rm", "ddp-cluster-local", check=False)
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    shutil.rmtree(KEY_DIR, ignore_errors=True)


def make_local_cluster() -> PlaybookResult:
    """A 2-node local cluster brought up from nothing (no containers, network, node state or keys)."""
    teardown_cluster()
    result = run_playbook("site.yml")
    assert result.rc == 0, result.stdout[-6000:]
    return result


def cluster_runs() -> bool:
    """Whether node0 and node1 both run (on the local network, as make_local_cluster left them)."""
    shown = "{{.State.Running}} {{.HostConfig.NetworkMode}}"
    found = docker("inspect", "-f", shown, "node0", "node1", check=False)
    return found.returncode == 0 and found.stdout.split("\n")[:2] == ["true ddp-cluster-local"] * 2


@pytest.fixture(scope="session")
def local_cluster_made() -> list[PlaybookResult]:
    """The site.yml run that made the session's cluster (the newest when it had to be made again)."""
    return [make_local_cluster()]


def running_cluster(made: list[PlaybookResult]) -> PlaybookResult:
    """The session's 2-node local cluster, made again from nothing when a test before took it down (one that
    tears the cluster down for a base image of its own, or takes a node away, leaves it so). A fixture of a
    wider scope than a test's asks for ``local_cluster_made`` and calls this."""
    if not cluster_runs():
        made.append(make_local_cluster())
    return made[-1]


@pytest.fixture
def local_cluster(local_cluster_made: list[PlaybookResult]) -> PlaybookResult:
    """The session's 2-node local cluster (:func:`running_cluster`)."""
    return running_cluster(local_cluster_made)


def recap_json(result: PlaybookResult) -> str:
    return json.dumps(result.stats, sort_keys=True)


# The tiers, by folder: unit (tests/unit: no container, no cluster), docker (the local end-to-end files here,
# on real containers), sim (tests/sim, simulated servers); network for what asks the package index.
TIERS = {
    "unit": "needs no container, no cluster and no network",
    "network": "asks the package index (PyPI)",
    "docker": "runs on real containers (the local cluster, molecule's engine)",
    "sim": "runs on simulated servers (make sim-e2e)",
}
NETWORK_FILES = {"test_shipped_requirements.py"}


def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.relative_to(REPO / "tests").parts[0]
        if item.path.name in NETWORK_FILES:
            item.add_marker(pytest.mark.network)
        elif folder == "unit":
            item.add_marker(pytest.mark.unit)
        else:
            item.add_marker(pytest.mark.sim if folder == "sim" else pytest.mark.docker)
