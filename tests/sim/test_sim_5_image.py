"""The image stage: the node image through a registry (the controller's, tunnelled to each server, or the
user's), a code change arriving as one small layer, pulled by digest with the built image's ID checked, the
registry refusing a node container on the host network while it runs and gone after, pulls that fail naming
the server, the cluster back on the repository's code; then a stand-in of NVIDIA's PyTorch container as the
base (the servers stay on it)."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import (
    GPU_REQUIREMENTS,
    NGC_BASE,
    NGC_SITE,
    NODE_IMAGE,
    QUICK,
    REGISTRY_PORT,
    RUNS,
    SERVERS,
    SIM,
    VERSIONS,
    code_change,
    job_id,
    node_image,
    on_node,
    on_server,
    site,
    task_output,
    train,
)
from conftest import REPO, PlaybookResult, run_playbook


def image_layers(server: str, image: str) -> list[str]:
    return json.loads(
        on_server(server, f"docker image inspect -f '{{{{json .RootFS.Layers}}}}' {image}").stdout
    )


def assert_no_registry_left() -> None:
    """The controller's registry and every tunnel end stopped with the stage; no registry name stays on a
    server."""
    assert (
        subprocess.run(
            ["pgrep", "-f", "docker-registry serve /tmp/ddp-registry-"], capture_output=True
        ).returncode
        != 0
    )
    assert (
        subprocess.run(["pgrep", "-f", f"-R 127.0.0.1:{REGISTRY_PORT}"], capture_output=True).returncode != 0
    )
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", REGISTRY_PORT)) != 0
    for server in SERVERS:
        assert not on_server(server, f"ss -Htln 'sport = :{REGISTRY_PORT}'").stdout.strip()
        assert not on_server(server, "docker image ls -q '127.0.0.1:*/*/*'").stdout.strip()


# Run on a server's host network (its own loopback, as every node container there) while the image stage runs:
# every 20 ms it tries the registry's port; when something listens, it asks as a job's code could, without the
# stage's password: the API root, and the start of a push. Until /tmp/ddp-probe.stop appears; then it prints
# what it got.
PROBE = """
import http.client, json, os, socket, time
port, seen = int(os.environ["PORT"]), {"connected": 0, "answers": {}}
while not os.path.exists("/tmp/ddp-probe.stop"):
    with socket.socket() as s:
        s.settimeout(0.5)
        up = s.connect_ex(("127.0.0.1", port)) == 0
    if up:
        seen["connected"] += 1
        for method, path in (("GET", "/v2/"), ("POST", "/v2/ddp-cluster/sim-node/blobs/uploads/")):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request(method, path)
                status = str(conn.getresponse().status)
            except OSError as error:
                status = type(error).__name__
            key = method + " " + status
            seen["answers"][key] = seen["answers"].get(key, 0) + 1
    time.sleep(0.02)
with socket.socket() as s:
    seen["after"] = s.connect_ex(("127.0.0.1", port))
print(json.dumps(seen), flush=True)
"""
PROBE_CONTAINER = "ddp-registry-probe"


@contextlib.contextmanager
def registry_probe(servers: list[str]) -> Iterator[dict[str, dict[str, object]]]:
    """PROBE on each server, in a container of the node image on the host network (the node container itself
    is replaced when the image changes), while the block runs; what each saw, once the block is over."""
    seen: dict[str, dict[str, object]] = {}
    code = base64.b64encode(PROBE.encode()).decode()
    for server in servers:
        image = node_image(server)[1]
        on_server(server, f"docker rm -f {PROBE_CONTAINER} >/dev/null 2>&1 || true")
        run = f"import base64; exec(base64.b64decode('{code}'))"
        on_server(server, f"docker run -d --name {PROBE_CONTAINER} --network host -e PORT={REGISTRY_PORT} "
                          f"--entrypoint python3 {image} -c \"{run}\"")  # fmt: skip
    try:
        yield seen
    finally:
        for server in servers:
            on_server(server, f"docker exec {PROBE_CONTAINER} touch /tmp/ddp-probe.stop", check=False)
        for server in servers:
            on_server(server, f"docker wait {PROBE_CONTAINER}", timeout=60)
            said = on_server(server, f"docker logs {PROBE_CONTAINER}").stdout
            on_server(server, f"docker rm -f {PROBE_CONTAINER}")
            seen[server] = json.loads(said.strip().splitlines()[-1])


def pulled_by_digest(result: PlaybookResult, servers: list[str], repository: str, built: str) -> None:
    """Each server pulled REPOSITORY@DIGEST, the digest its push said (the module's report, shown by -v, and
    Docker's own words in the pull's output it keeps), and holds the image the build made (ID ``built``)."""
    digests = set(re.findall(r"^\s*digest: (sha256:[0-9a-f]{64})$", result.stdout, re.MULTILINE))
    assert len(digests) == 1, result.stdout[-6000:]
    by_digest = f"{repository}@{digests.pop()}"
    said = result.stdout.count(f"Status: Downloaded newer image for {by_digest}")
    assert said == len(servers), result.stdout[-6000:]
    assert len(re.findall(rf"^\s*pulled: {re.escape(by_digest)}$", result.stdout, re.MULTILINE)) == len(
        servers
    )
    assert re.search(rf"^\s*image_id: {built}$", result.stdout, re.MULTILINE), result.stdout[-6000:]
    image = node_image(servers[0])[1]
    for server in servers:
        assert on_server(server, f"docker image inspect -f '{{{{.Id}}}}' {image}").stdout.strip() == built, (
            server
        )


# 401, or the listener gone between the connect and the question (the tunnel's end closing with its pull).
GONE = ("RemoteDisconnected", "ConnectionResetError", "ConnectionRefusedError")
REFUSED = {f"{method} {said}" for method in ("GET", "POST") for said in ("401", *GONE)}


def assert_probed_and_refused(seen: dict[str, dict[str, object]], server: str) -> None:
    """The node container on ``server`` reached the registry's port while the stage ran, was refused every
    time (401: no read, no push), and found nothing listening after."""
    answers = seen[server]["answers"]
    assert isinstance(answers, dict) and seen[server]["connected"], (server, seen[server])
    assert set(answers) <= REFUSED, (server, answers)
    assert answers.get("GET 401") and answers.get("POST 401"), (server, answers)
    assert seen[server]["after"] != 0, (server, seen[server])


def test_bare_servers_got_the_image_through_the_registry(sim_cluster: PlaybookResult) -> None:
    pushed = task_output(sim_cluster, "Push the image once, pull it on every server that lacks it")
    assert pushed.startswith("changed: [sim-server0 -> localhost]"), pushed
    assert task_output(sim_cluster, "Copy the archive to the host").count("skipping:") == 2
    assert_no_registry_left()


def test_a_code_change_reaches_every_server_as_one_small_layer(
    sim_cluster: PlaybookResult, healthy_again: None
) -> None:
    before = {server: node_image(server) for server in SERVERS}
    with code_change("registry") as changed, registry_probe(SERVERS) as seen:
        started = time.monotonic()
        result = site(project=changed, cmdline="-v")
    print(f"site.yml with a code change through the registry: {time.monotonic() - started:.0f} s")
    print(f"what the host networks' probes saw: {seen}")
    assert result.rc == 0, result.stdout[-6000:]
    # Pulled by the push's digest, each server's image the one built (the controller's ID).
    built = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", node_image("sim-server0")[1]],
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    pulled_by_digest(result, SERVERS, f"127.0.0.1:{REGISTRY_PORT}/{NODE_IMAGE}", built)
    # A node container on the host network reached each server's tunnel end while it pulled, and was refused.
    for server in SERVERS:
        assert_probed_and_refused(seen, server)
    # Each server pulled one layer (the ddp_cluster code) and had every other; the registry sent well under 1%
    # of the image.
    assert re.findall(r"layers_pulled: (\d+)", result.stdout) == ["1", "1"], result.stdout[-6000:]
    served = [int(n) for n in re.findall(r"bytes_served: (\d+)", result.stdout)]
    image = node_image("sim-server0")[1]
    size = int(subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", image],
                              capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert len(served) == 1 and 0 < served[0] < 0.01 * size * len(SERVERS), (served, size)
    for server in SERVERS:
        old_layers, new_layers = image_layers(server, before[server][1]), image_layers(server, image)
        assert new_layers[:-1] == old_layers[:-1] and new_layers[-1] != old_layers[-1]
        assert node_image(server)[1] == image != before[server][1]
    assert_no_registry_left()


def test_a_failed_pull_stops_the_stage_naming_the_server_and_leaves_the_containers(
    sim_cluster: PlaybookResult, healthy_again: None
) -> None:
    before = {server: node_image(server) for server in SERVERS}
    # Something on sim-server1 holds the loopback port the tunnel needs.
    holder = f"python3 -m http.server --bind 127.0.0.1 {REGISTRY_PORT}"
    subprocess.run(["docker", "exec", "-d", "sim-server1", *holder.split()], check=True)
    time.sleep(1)
    try:
        with code_change("failed pull") as changed:
            result = site(project=changed)
    finally:
        on_server("sim-server1", f"pkill -f '{holder}'", check=False)
    flat = " ".join(result.stdout.split())
    assert result.rc != 0
    assert (
        f"sim-server1: the node image did not arrive from 127.0.0.1:{REGISTRY_PORT}/{NODE_IMAGE}:" in flat
    ), result.stdout[-4000:]
    assert f"port {REGISTRY_PORT} on the server's loopback is taken" in flat
    assert "TASK [node_container" not in result.stdout
    assert {server: node_image(server) for server in SERVERS} == before
    assert_no_registry_left()


@contextlib.contextmanager
def registry_serving(config: Path, log_path: Path) -> Iterator[None]:
    """Docker's Distribution registry with this configuration while the block runs."""
    with log_path.open("w") as log:
        registry = subprocess.Popen(
            ["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        try:
            time.sleep(1)
            yield
        finally:
            registry.terminate()
            registry.wait(timeout=10)


@pytest.fixture(scope="module")
def registry_storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store for the user's registries of this module: the second starts with the layers the first was
    sent (as a user's registry holds earlier images'), so the whole image is pushed once, not twice."""
    return tmp_path_factory.mktemp("users-registry-storage")


@pytest.fixture
def unreachable_registry(tmp_path: Path, registry_storage: Path) -> Iterator[str]:
    """A user's registry that the controller reaches and the servers do not: on the controller's own
    loopback."""
    port = REGISTRY_PORT + 1
    config = tmp_path / "config.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {registry_storage}\nhttp:\n"
        f"  addr: 127.0.0.1:{port}\n"
    )
    with registry_serving(config, tmp_path / "registry.log"):
        yield f"127.0.0.1:{port}/ml"


def test_a_registry_the_servers_cannot_reach_stops_the_stage_naming_each_server(
    sim_cluster: PlaybookResult, unreachable_registry: str, healthy_again: None
) -> None:
    before = {server: node_image(server) for server in SERVERS}
    with code_change("unreachable registry") as changed:
        result = site(project=changed, cluster_registry=unreachable_registry)
    flat = " ".join(result.stdout.split())
    assert result.rc != 0
    for server in SERVERS:
        # The push went through; each server's own pull failed, and the message names that server and the
        # registry.
        assert f"{server}: the node image did not arrive from {unreachable_registry}/{NODE_IMAGE}:" in flat, (
            result.stdout[-4000:]
        )
    assert "the pull failed" in flat and "connection refused" in flat.lower(), result.stdout[-4000:]
    assert "TASK [node_container" not in result.stdout
    assert {server: node_image(server) for server in SERVERS} == before
    # The registry's name for the image was removed on the controller after the push.
    left = subprocess.run(
        ["docker", "image", "ls", "-q", f"{unreachable_registry}/*/*"], capture_output=True, text=True
    )
    assert left.stdout.strip() == ""
    assert_no_registry_left()


@pytest.fixture
def users_registry(tmp_path: Path, registry_storage: Path) -> Iterator[str]:
    """A second registry standing in for the user's (Harbor, a cloud one): TLS with its own CA, on the
    controller's address on the sim network, trusted by the controller's and each server's engine through
    certs.d (no restart)."""
    address = "172.30.99.1:5443"
    key, cert = tmp_path / "registry.key", tmp_path / "registry.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=ddp-test-registry", "-addext", "subjectAltName=IP:172.30.99.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    config = tmp_path / "config.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {registry_storage}\n"
        f"http:\n  addr: {address}\n  tls:\n    certificate: {cert}\n    key: {key}\n"
    )
    certs = [Path("/etc/docker/certs.d") / address]
    certs[0].mkdir(parents=True, exist_ok=True)
    shutil.copy(cert, certs[0] / "ca.crt")
    for server in SERVERS:
        on_server(server, f"mkdir -p /etc/docker/certs.d/{address}")
        subprocess.run(
            ["docker", "cp", str(cert), f"{server}:/etc/docker/certs.d/{address}/ca.crt"], check=True
        )
    try:
        with registry_serving(config, tmp_path / "registry.log"):
            yield f"{address}/ml"
    finally:
        shutil.rmtree(certs[0], ignore_errors=True)
        for server in SERVERS:
            on_server(server, f"rm -rf /etc/docker/certs.d/{address}", check=False)


def test_the_users_registry_is_pushed_to_and_pulled_from(
    sim_cluster: PlaybookResult, users_registry: str, tmp_path: Path, healthy_again: None
) -> None:
    with code_change("user's registry") as changed:
        result = site(project=changed, cluster_registry=users_registry)
    assert result.rc == 0, result.stdout[-6000:]
    image = node_image("sim-server0")[1]
    # Each server's engine fetched the manifest from the user's registry itself (no tunnel: its own address),
    # by the push's digest, with its own login (none here).
    log = (tmp_path / "registry.log").read_text()
    for index, server in enumerate(SERVERS):
        assert node_image(server)[1] == image
        assert re.search(
            rf'http\.request\.method=(GET|HEAD) http\.request\.remoteaddr="172\.30\.99\.{10 + index}:\d+" '
            rf'http\.request\.uri="/v2/ml/{NODE_IMAGE}/manifests/sha256:[0-9a-f]{{64}}"',
            log,
        ), log[-3000:]
        assert not on_server(server, "docker image ls -q '172.30.99.1:5443/*/*/*'").stdout.strip()
    assert_no_registry_left()


def test_the_cluster_is_back_on_the_repositorys_code(
    sim_cluster: PlaybookResult, healthy_again: None
) -> None:
    # The code is as it was: the image of the first run, still on every server, is taken again; nothing is
    # pulled.
    result = site()
    assert result.rc == 0, result.stdout[-6000:]
    assert task_output(result, "Push the image once, pull it on every server that lacks it").startswith(
        "skipping:"
    )
    job = job_id("back")
    done = train(job, nodes=2, script_args=QUICK)
    assert done.rc == 0, done.stdout[-5000:]


def test_an_ngc_base_keeps_its_own_torch_and_trains(
    sim_cluster: PlaybookResult, standins: None, tmp_path: Path
) -> None:
    # NVIDIA's PyTorch container as a gpu inventory takes it (inventories/gpu-example): its own torch build,
    # which no index has, stays; the gpu requirements add only the rest. Then the cpu cluster runs on it.
    ngc_torch = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "python3", NGC_BASE,
         "-c", "import torch; print(torch.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert ".nv26.10" in ngc_torch
    gpu = {"cluster_base_image": NGC_BASE, "training_image_requirements": str(GPU_REQUIREMENTS)}
    result = site(**gpu)
    assert result.rc == 0, result.stdout[-6000:]
    for server in SERVERS:
        found = on_node(server, f"python -c '{VERSIONS}' torch numpy").stdout.split()
        assert found[:2] == [ngc_torch, f"{NGC_SITE}/torch/__init__.py"], found
        assert found[3] == f"{NGC_SITE}/numpy/__init__.py", found
        assert (
            on_node(server, "ls /opt/venv/lib/python3.11/site-packages | grep -ci '^torch' || true").stdout
            == "0\n"
        )
    job = job_id("ngc")
    done = train(job, nodes=2, script_args=QUICK)
    assert done.rc == 0, done.stdout[-5000:]
    assert json.loads((RUNS / job / "output" / "summary.json").read_text())["world_size"] == 2
    # Our default requirements pin PyPI's torch: on this base that is refused naming both, before any build.
    refused = run_playbook(
        "site.yml", {**gpu, "training_image_requirements": str(REPO / "docker" / "requirements.txt")},
        inventory=SIM, cmdline="--tags training_image_base",
    )  # fmt: skip
    flat = " ".join(refused.stdout.split())
    assert refused.rc != 0
    assert f"asks for torch==2.13.0, but the base image has torch {ngc_torch} in /usr/local/lib" in flat, (
        flat[-3000:]
    )
