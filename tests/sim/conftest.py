"""The real-cluster path on simulated servers (scripts/sim.sh): Ansible over ssh to servers with their own
Docker engine, image store, network namespace and firewall; node containers on each server's host network. The
fixtures and helpers every stage's tests share.

The tests run in file order (test_sim_1_hosts.py to test_sim_9_hosts_from_a_server.py, then
test_sim_server_build.py), on one set of servers made fresh for the session (engine up, no image): bring-up,
idempotence and the firewall, the mesh and mpirun across servers, jobs with both launchers and a server dying
mid-job, servers that cannot be used (engine stopped, unreachable, host key changed), the image through a
registry, then the same servers as Ascend ones, and last Ansible run on a server. Each file leaves the servers
as the next one expects them, so the order matters: the fixtures are session-scoped (the cluster comes up
once, site.yml runs from bare servers once). The server-build tests (test_sim_server_build.py) make the
servers fresh again for their own module.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, PlaybookResult, run_playbook

SIM = REPO / "inventories" / "sim"
SIM_ASCEND = REPO / "inventories" / "sim-ascend"
GPU_REQUIREMENTS = REPO / "inventories" / "gpu-example" / "requirements-gpu.txt"
SERVERS = ["sim-server0", "sim-server1"]
RUNS = REPO / "runs"
QUICK = "--dataset digits --epochs 3 --batch-size 32 --lr 0.05"
STATE = "/var/lib/ddp-cluster"
# The sim inventories name their node image apart from the local cluster's (the two suites share one engine).
NODE_IMAGE = "ddp-cluster/sim-node"
ANSIBLE_CONTROL_DIR = Path.home() / ".ansible" / "cp"
# The stand-ins of the vendors' images that scripts/sim.sh builds (sim/cann, sim/ngc).
CANN_PYTHON = "/usr/local/python3.11.2/bin/python3.11"
CANN_SITE = "/usr/local/python3.11.2/lib/python3.11/site-packages"
NGC_BASE = "ddp-cluster/ngc-standin:26.10-py3"
NGC_SITE = "/usr/local/lib/python3.11/dist-packages"
# Each named module's version and file, as a node's Python imports them.
VERSIONS = (
    "import importlib, sys;"
    " [print(m.__version__, m.__file__) for m in map(importlib.import_module, sys.argv[1:])]"
)


SIM_ENV = {"SIM_SERVERS": "2", "PYTHON": str(REPO / ".venv" / "bin" / "python")}
STANDINS_LOG = REPO / "build" / "sim" / "standins.log"


def _natural(name: str) -> list[object]:
    """A file name's sort key with its numbers as numbers: test_sim_10_... after test_sim_9_..."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The sim's files are stages in order (1, 2, ..., 10): their tests run in their files' natural order,
    each file's tests in their own order, the other tests where they were."""
    here = Path(__file__).parent
    places = [index for index, item in enumerate(items) if item.path.parent == here]
    ordered = sorted((items[index] for index in places), key=lambda item: _natural(item.path.name))
    for index, item in zip(places, ordered, strict=True):
        items[index] = item


def sim(*args: str) -> None:
    """scripts/sim.sh up or down; up leaves the vendors' stand-ins to the standins fixture."""
    env = os.environ | SIM_ENV | {"SIM_STANDINS": "0"}
    done = subprocess.run(
        ["scripts/sim.sh", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr


def on_server(
    server: str, command: str, check: bool = True, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    """A command on the server itself (its console), not through the playbooks' path."""
    done = subprocess.run(
        ["docker", "exec", server, "sh", "-c", command], capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert done.returncode == 0, f"{server}: {command}: {done.stdout}{done.stderr}"
    return done


def on_node(
    server: str, command: str, check: bool = True, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    """A command in the node container on a server, as a login shell would run it."""
    return on_server(
        server, f"docker exec {server} bash -lc {shlex_quote(command)}", check=check, timeout=timeout
    )


def shlex_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def forget_connections() -> None:
    """Drop Ansible's persistent ssh connections, so the next run logs in afresh (as after a server's
    reboot)."""
    shutil.rmtree(ANSIBLE_CONTROL_DIR, ignore_errors=True)


def wait_engine(server: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while on_server(server, "docker info >/dev/null 2>&1", check=False).returncode != 0:
        assert time.monotonic() < deadline, f"{server}: engine not back within {timeout:.0f} s"
        time.sleep(1)


def site(
    inventory: Path = SIM, project: Path = REPO, cmdline: str = "", **extravars: object
) -> PlaybookResult:
    """site.yml on the sim, from this repository or from a copy of it (project; the same inventory in the
    copy)."""
    inventory = project / inventory.relative_to(REPO)
    return run_playbook(
        "site.yml", extravars=extravars, inventory=inventory, project=project, cmdline=cmdline, timeout=1200
    )


def train(job: str, inventory: Path = SIM, **extravars: object) -> PlaybookResult:
    return run_playbook("train.yml", extravars={"job_id": job, **extravars}, inventory=inventory)


def wait_for_progress(
    playbook: subprocess.Popen[str], job: str, mark: str = '"step"', within: float = 240
) -> None:
    """Until the job's status.json on sim-server0 holds ``mark`` (a step reported); fails when train.yml ends
    first or ``within`` seconds pass."""
    status = f"{STATE}/sim-server0/workspace/jobs/{job}/status.json"
    deadline = time.monotonic() + within
    while mark not in on_server("sim-server0", f"cat {status} 2>/dev/null", check=False).stdout:
        assert playbook.poll() is None, "train.yml ended before the job made progress"
        assert time.monotonic() < deadline, f"the job made no progress within {within:.0f} s"
        time.sleep(1)


def job_id(name: str) -> str:
    return f"test-sim-{name}-{uuid.uuid4().hex[:6]}"


def changed_on(result: PlaybookResult, host: str) -> int:
    return result.stats.get("changed", {}).get(host, 0)


@pytest.fixture(scope="session")
def servers() -> Iterator[list[str]]:
    """Two bare simulated servers: engine up, no image, no node container."""
    sim("down")
    sim("up")
    yield SERVERS
    if not os.environ.get("DDP_SIM_KEEP"):
        sim("down")


@pytest.fixture(scope="session")
def standins_building(servers: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """scripts/sim.sh standins in the background from the servers' start: the vendors' stand-ins take minutes
    on a new machine (the CANN one builds CPython), and the stages before the NGC and Ascend tests do not use
    them."""
    STANDINS_LOG.parent.mkdir(parents=True, exist_ok=True)
    with STANDINS_LOG.open("w") as log:
        building = subprocess.Popen(
            ["scripts/sim.sh", "standins"], cwd=REPO, env=os.environ | SIM_ENV, stdout=log, stderr=log
        )
    try:
        yield building
    finally:
        if building.poll() is None:
            building.terminate()
            building.wait(timeout=60)


@pytest.fixture(scope="session")
def standins(standins_building: subprocess.Popen[bytes]) -> None:
    """The CANN and NGC base-image stand-ins and the torch_npu stand-in wheel, built."""
    rc = standins_building.wait(timeout=1800)
    assert rc == 0, STANDINS_LOG.read_text()[-6000:]


@pytest.fixture(scope="session")
def sim_cluster(servers: list[str], standins_building: subprocess.Popen[bytes]) -> PlaybookResult:
    for server in servers:
        assert on_server(server, "docker image ls -q | wc -l").stdout.strip() == "0"
        assert on_server(server, "python3 -c 'import requests'", check=False).returncode != 0
    result = site()
    assert result.rc == 0, result.stdout[-6000:]
    return result


@pytest.fixture
def healthy_again() -> Iterator[None]:
    """Each failure test leaves the cluster as it found it; the next test checks it from scratch."""
    forget_connections()
    yield
    forget_connections()


# --- the image: a code change, in a copy of the repository -------------------------------------------------
PACKAGE_INIT = REPO / "python" / "src" / "ddp_cluster" / "__init__.py"
REGISTRY_PORT = 15000


CHANGED_COPY = REPO / "build" / "code-change"
# Left out of the copy: the repository's history, the environment, caches and what runs produce.
CACHES = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
NOT_COPIED = {".git", ".venv", "build", "runs"} | CACHES


@contextlib.contextmanager
def code_change(tag: str) -> Iterator[Path]:
    """A copy of this repository with a one-line change under python/ (a new image tag), removed afterwards.

    A copy rather than an edit in place: the local suite may be building the image from this tree at the same
    time (make test runs the two side by side). The copy shares the wheelhouse (hard links: the image's build
    context takes it as files) and the controller's kept registry store."""
    shutil.rmtree(CHANGED_COPY, ignore_errors=True)
    shutil.copytree(
        REPO,
        CHANGED_COPY,
        symlinks=True,
        ignore=lambda directory, names: [
            name for name in names if name in (NOT_COPIED if Path(directory) == REPO else CACHES)
        ],
    )
    (CHANGED_COPY / "build").mkdir()
    subprocess.run(["cp", "-al", str(REPO / "build" / "wheelhouse"), str(CHANGED_COPY / "build")], check=True)
    (CHANGED_COPY / "build" / "registry").symlink_to(REPO / "build" / "registry")
    init = CHANGED_COPY / PACKAGE_INIT.relative_to(REPO)
    init.write_text(init.read_text() + f"# a one-line change: {tag}\n")
    try:
        yield CHANGED_COPY
    finally:
        shutil.rmtree(CHANGED_COPY, ignore_errors=True)


def node_image(server: str) -> tuple[str, str]:
    """The node container's id and image name on a server."""
    out = on_server(server, f"docker inspect -f '{{{{.Id}}}} {{{{.Config.Image}}}}' {server}").stdout.split()
    return out[0], out[1]


def task_output(result: PlaybookResult, task: str) -> str:
    """What a training_image task printed (the lines between its header and the next)."""
    parts = result.stdout.split(f"TASK [training_image : {task}]")
    assert len(parts) == 2, f"task {task!r} ran {len(parts) - 1} times"
    return parts[1].split("TASK [")[0].split("PLAY [")[0].lstrip("* \n")


# --- the same servers as Ascend ones (inventories/sim-ascend) -----------------------------------------------
# The doubles' topology for the first two chips of each server (npu-smi info -t topo's CPU Affinity): this
# machine has CPUs 0 and 1 only, so device 0 is local to CPU 1 and device 1 to CPU 0 (crossed, so that a
# binding by local rank alone would show).
DOUBLES_CONFIG = {
    "chip_count": 8,
    "npu_name": "910B",
    "version": "23.0.0",
    "devices": {"0": {"cpu_affinity": "1"}, "1": {"cpu_affinity": "0"}},
}


def write_doubles_config(server: str, config: dict[str, object]) -> None:
    on_server(server, f"echo {shlex_quote(json.dumps(config))} > /var/lib/ddp-doubles/config.json")


@pytest.fixture(scope="session")
def ascend_cluster(servers: list[str], standins: None) -> PlaybookResult:
    # sim-server0's engine gets ascend-docker-runtime registered, as its installer does (the default runtime
    # too); sim-server1's has none.
    on_server("sim-server0", "/opt/ddp-sim/ascend/install-runtime.sh")
    wait_engine("sim-server0")
    for server in servers:
        write_doubles_config(server, DOUBLES_CONFIG)
    result = site(SIM_ASCEND)
    assert result.rc == 0, result.stdout[-6000:]
    return result
