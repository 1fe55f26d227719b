"""The user's base image is used as found, pulled with the user's credentials, or the stage stops naming it;
never replaced. A base without a package manager that has what a node needs builds and runs a job; one whose
Python is too old is refused before the build. (The vendors' images themselves are exercised on the sim:
tests/sim/test_sim.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import REPO, PlaybookResult, docker, node_exec, run_playbook, teardown_cluster

pytestmark = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v docker-registry"], capture_output=True).returncode != 0,
    reason="docker-registry is not installed (make registry)",
)

BASE = "ddp-cluster/base:bookworm"
# Its own node image name, apart from the local cluster's (whose :latest the other suites read).
NODE_IMAGE = "ddp-test/base-node"
QUICK = "--dataset digits --epochs 3 --batch-size 32 --lr 0.05"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def image_exists(name: str) -> bool:
    return docker("image", "inspect", name, check=False).returncode == 0


def bcrypt_hash(password: str) -> str:
    """The bcrypt hash the registry's htpasswd file takes."""
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()


@contextmanager
def registry(workdir: Path, user: str = "") -> Iterator[str]:
    """Docker's Distribution registry on 127.0.0.1 (plain HTTP, which the engine allows on loopback), with an
    htpasswd login when user is given ('user:password'); yields its host:port."""
    port = free_port()
    auth = ""
    if user:
        name, _, password = user.partition(":")
        (workdir / "htpasswd").write_text(f"{name}:{bcrypt_hash(password)}\n")
        auth = f"auth:\n  htpasswd:\n    realm: ddp-test\n    path: {workdir}/htpasswd\n"
    (workdir / "config.yml").write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {workdir}/storage\n"
        f"http:\n  addr: 127.0.0.1:{port}\n{auth}"
    )
    with open(workdir / "registry.log", "wb") as log:
        process = subprocess.Popen(
            ["docker-registry", "serve", str(workdir / "config.yml")], stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2)
                break
            except urllib.error.HTTPError:  # 401 with a login: it answers
                break
            except OSError:
                assert time.monotonic() < deadline, (workdir / "registry.log").read_text()
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def docker_as(config: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """The docker CLI with its own credentials store (DOCKER_CONFIG), as a user's own login would be."""
    return subprocess.run(
        ["docker", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=os.environ | {"DOCKER_CONFIG": str(config)},
    )


def push(config: Path, image: str) -> None:
    assert docker("tag", BASE, image).returncode == 0
    pushed = docker_as(config, "push", image)
    assert pushed.returncode == 0, pushed.stderr
    docker("rmi", image)
    assert not image_exists(image)


def image_stage(base: str, env: dict[str, str] | None = None, **extra: object) -> PlaybookResult:
    return run_playbook(
        "playbooks/image.yml",
        extravars={"cluster_base_image": base, "training_image_name": NODE_IMAGE, **extra},
        env=env,
    )


def node_images() -> set[str]:
    return set(docker("images", "-q", NODE_IMAGE).stdout.split())


def assert_stopped_naming(result: PlaybookResult, base: str, *said: str) -> None:
    assert result.rc != 0, result.stdout[-3000:]
    text = " ".join(result.stdout.split())
    assert f"the base image {base} is not on the engine that builds and could not be pulled" in text, text[
        -3000:
    ]
    for words in said:
        assert words in text, text[-3000:]
    assert "docker load -i" in text and "No image of that name was left" in text
    assert "TASK [training_image : Build the node image" not in result.stdout
    assert not image_exists(base)


def test_a_base_the_registry_lacks_stops_the_stage_naming_it(tmp_path: Path) -> None:
    before = node_images()
    with registry(tmp_path) as host:
        base = f"{host}/ascend/cann:8.2.rc1-910b-ubuntu22.04-py3.11"
        result = image_stage(base)
    assert_stopped_naming(result, base, f"the registry {host} has no such image")
    assert node_images() == before


def test_site_stops_in_preflight_on_a_base_it_cannot_have_before_any_stage_changes_anything(
    tmp_path: Path,
) -> None:
    before = node_images()
    with registry(tmp_path) as host:
        base = f"{host}/nvidia/pytorch:26.10-py3"
        result = run_playbook(
            "site.yml", extravars={"cluster_base_image": base, "training_image_name": NODE_IMAGE}
        )
    assert_stopped_naming(result, base, f"the registry {host} has no such image")
    # The stop is preflight's: no later play (hosts, image, containers, mesh) started.
    assert "PLAY [Validate the inventory and settings before anything changes]" in result.stdout
    for later in (
        "Prepare the hosts",
        "Build the node image once",
        "Start one node container",
        "Wire passwordless",
    ):
        assert f"PLAY [{later}" not in result.stdout, later
    assert node_images() == before


def test_a_base_behind_a_login_names_docker_login_then_pulls_after_it(tmp_path: Path) -> None:
    pusher, user, stranger = tmp_path / "pusher", tmp_path / "user", tmp_path / "stranger"
    for config in (pusher, user, stranger):
        config.mkdir()
    with registry(tmp_path, user="ddp:s3cret") as host:
        base = f"{host}/nvidia/pytorch:26.10-py3"
        assert (
            docker_as(pusher, "login", host, "-u", "ddp", "--password-stdin", stdin="s3cret").returncode == 0
        )
        push(pusher, base)
        refused = image_stage(base, env={"DOCKER_CONFIG": str(stranger)})
        assert_stopped_naming(refused, base, f"log in first with docker login {host}")

        assert docker_as(user, "login", host, "-u", "ddp", "--password-stdin", stdin="s3cret").returncode == 0
        pulled = image_stage(base, env={"DOCKER_CONFIG": str(user)})
    try:
        assert pulled.rc == 0, pulled.stdout[-3000:]
        assert f"base image {base}: pulled in" in pulled.stdout
        # Used as it is: the same image as the one pushed, under the user's name, and the node image built on
        # it.
        assert (
            docker("image", "inspect", "-f", "{{.Id}}", base).stdout
            == docker("image", "inspect", "-f", "{{.Id}}", BASE).stdout
        )
        assert image_exists(f"{NODE_IMAGE}:latest")
    finally:
        docker("rmi", base, check=False)


def test_a_pull_that_does_not_finish_in_time_is_stopped_naming_the_bound(tmp_path: Path) -> None:
    # A registry that takes connections and never answers: the pull hangs until the bound.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []

    def hold() -> None:  # every connection accepted and never answered, until the listener is closed
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=hold, daemon=True).start()
    base = f"127.0.0.1:{listener.getsockname()[1]}/ascend/cann:8.2.rc1"
    started = time.monotonic()
    result = image_stage(base, training_image_pull_timeout=8)
    listener.close()
    for connection in held:
        connection.close()
    assert_stopped_naming(result, base, "did not finish within training_image_pull_timeout (8 s)")
    assert time.monotonic() - started < 120


def test_a_base_with_python_older_than_the_package_needs_is_refused_before_the_build() -> None:
    # Debian bullseye's python3 is 3.9; the project's own base of that suite is built with debootstrap.
    before = node_images()
    result = image_stage("ddp-cluster/base:bullseye")
    text = " ".join(result.stdout.split())
    assert result.rc != 0, text[-3000:]
    assert (
        "the base image ddp-cluster/base:bullseye has Python 3.9 (bullseye's python3), older than the 3.10"
        in text
    )
    assert "Nothing was built." in text and node_images() == before


def test_a_base_without_a_package_manager_that_lacks_sshd_is_refused_naming_what_it_lacks() -> None:
    dockerfile = f"FROM {BASE}\nRUN rm -f /usr/bin/apt-get /usr/bin/apt /usr/bin/dpkg\n"
    built = subprocess.run(
        ["docker", "build", "-q", "-t", "ddp-test/no-pm:1", "-"], input=dockerfile, text=True
    )
    assert built.returncode == 0
    result = image_stage("ddp-test/no-pm:1")
    text = " ".join(result.stdout.split())
    assert result.rc != 0
    assert (
        "the base image ddp-test/no-pm:1 has no package manager (apt-get, dnf, yum) "
        "to install sshd, ssh, mpirun" in text
    )
    assert "Nothing was built." in text


# A base with sshd, ssh, OpenMPI, Python, Slurm, munge and the node's tools, and no package manager left.
READY = "ddp-test/no-pm-ready:1"
READY_DOCKERFILE = (
    f"FROM {BASE}\n"
    "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
    "openssh-server openssh-client openmpi-bin netbase python3 python3-venv iproute2 procps ca-certificates "
    "slurmd slurmctld slurm-client munge "
    "&& rm -rf /var/lib/apt/lists/* && rm -f /usr/bin/apt /usr/bin/apt-get /usr/bin/apt-* /usr/bin/dpkg*\n"
)


@pytest.fixture
def bare_base() -> Iterator[str]:
    built = subprocess.run(["docker", "build", "-q", "-t", READY, "-"], input=READY_DOCKERFILE, text=True)
    assert built.returncode == 0
    yield READY
    teardown_cluster()


def test_a_base_without_a_package_manager_that_has_everything_builds_and_runs_a_job(bare_base: str) -> None:
    teardown_cluster()
    extra = {"cluster_base_image": bare_base, "training_image_name": NODE_IMAGE}
    site = run_playbook("site.yml", extravars=extra)
    assert site.rc == 0, site.stdout[-4000:]
    # The node runs the base's own sshd, mpirun and Python, with no package manager anywhere.
    assert node_exec("node0", "command -v apt-get dpkg dnf yum || echo none").stdout.strip() == "none"
    assert node_exec("node0", "readlink -f /opt/venv/bin/python3").stdout.strip() == "/usr/bin/python3.11"
    job = f"test-no-pm-{uuid.uuid4().hex[:6]}"
    train = run_playbook("train.yml", extravars={"job_id": job, "nodes": 2, "script_args": QUICK})
    assert train.rc == 0, train.stdout[-4000:]
    result = json.loads((REPO / "runs" / job / "output" / "summary.json").read_text())
    assert result["world_size"] == 2 and result["accuracy"] >= 0.8
