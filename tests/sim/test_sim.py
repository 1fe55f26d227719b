"""The real-cluster path on simulated servers (scripts/sim.sh): Ansible over ssh to servers with their own Docker
engine, image store, network namespace and firewall; node containers on each server's host network.

The tests run in file order on one set of servers made fresh for this module (engine up, no image): bring-up,
idempotence, the mesh and mpirun across servers, jobs with both launchers, the firewall, a server dying mid-job,
servers that cannot be used (engine stopped, unreachable, host key changed), then the same servers as Ascend ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, PlaybookResult, run_playbook, start_train

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
    "import importlib, sys; [print(m.__version__, m.__file__) for m in map(importlib.import_module, sys.argv[1:])]"
)


def sim(*args: str) -> None:
    env = os.environ | {"SIM_SERVERS": "2", "PYTHON": str(REPO / ".venv" / "bin" / "python")}
    done = subprocess.run(["scripts/sim.sh", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr


def on_server(server: str, command: str, check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """A command on the server itself (its console), not through the playbooks' path."""
    done = subprocess.run(
        ["docker", "exec", server, "sh", "-c", command], capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert done.returncode == 0, f"{server}: {command}: {done.stdout}{done.stderr}"
    return done


def on_node(server: str, command: str, check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """A command in the node container on a server, as a login shell would run it."""
    return on_server(server, f"docker exec {server} bash -lc {shlex_quote(command)}", check=check, timeout=timeout)


def shlex_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def forget_connections() -> None:
    """Drop Ansible's persistent ssh connections, so the next run logs in afresh (as after a server's reboot)."""
    shutil.rmtree(ANSIBLE_CONTROL_DIR, ignore_errors=True)


def wait_engine(server: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while on_server(server, "docker info >/dev/null 2>&1", check=False).returncode != 0:
        assert time.monotonic() < deadline, f"{server}: engine not back within {timeout:.0f} s"
        time.sleep(1)


def site(inventory: Path = SIM, project: Path = REPO, cmdline: str = "", **extravars: object) -> PlaybookResult:
    """site.yml on the sim, from this repository or from a copy of it (project; the same inventory in the copy)."""
    inventory = project / inventory.relative_to(REPO)
    return run_playbook(
        "site.yml", extravars=extravars, inventory=inventory, project=project, cmdline=cmdline, timeout=1200
    )


def train(job: str, inventory: Path = SIM, **extravars: object) -> PlaybookResult:
    return run_playbook("train.yml", extravars={"job_id": job, **extravars}, inventory=inventory)


def job_id(name: str) -> str:
    return f"test-sim-{name}-{uuid.uuid4().hex[:6]}"


def changed_on(result: PlaybookResult, host: str) -> int:
    return result.stats.get("changed", {}).get(host, 0)


@pytest.fixture(scope="module")
def servers() -> Iterator[list[str]]:
    """Two bare simulated servers: engine up, no image, no node container."""
    sim("down")
    sim("up")
    yield SERVERS
    if not os.environ.get("DDP_SIM_KEEP"):
        sim("down")


@pytest.fixture(scope="module")
def sim_cluster(servers: list[str]) -> PlaybookResult:
    for server in servers:
        assert on_server(server, "docker image ls -q | wc -l").stdout.strip() == "0"
        assert on_server(server, "python3 -c 'import requests'", check=False).returncode != 0
    result = site()
    assert result.rc == 0, result.stdout[-6000:]
    return result


def test_site_brings_bare_servers_up(sim_cluster: PlaybookResult) -> None:
    for server in SERVERS:
        # The hosts stage installed what the Docker tasks need; the image arrived; the node runs on the host network.
        on_server(server, "python3 -c 'import requests'")
        images = on_server(server, f"docker image ls -q {NODE_IMAGE}").stdout.split()
        assert len(images) == 1, images
        template = "'{{.HostConfig.NetworkMode}} {{.State.Running}}'"
        inspect = on_server(server, f"docker inspect -f {template} {server}")
        assert inspect.stdout.split() == ["host", "true"]
        # sshd of the node container listens in the server's own network namespace.
        assert on_server(server, "ss -Htln 'sport = :12345'").stdout.strip()
        assert on_server(server, 'test -z "$(ls /var/tmp/*.tar 2>/dev/null)"', check=False).returncode == 0


def test_second_run_changes_nothing_and_sends_no_image(sim_cluster: PlaybookResult) -> None:
    again = site()
    assert again.rc == 0, again.stdout[-4000:]
    assert again.changed_hosts() == {}, again.stdout[-6000:]
    # The image is on every server: the archive is neither exported, nor copied, nor loaded again.
    sending = again.stdout.split("TASK [training_image : Copy the archive to the host]")
    assert len(sending) == 1 or "changed:" not in sending[1].split("TASK [")[0]


def test_nodes_log_in_by_name_and_mpirun_spans_servers(sim_cluster: PlaybookResult) -> None:
    assert on_node("sim-server0", "ssh -o BatchMode=yes sim-server1 hostname").stdout.strip() == "sim-server1"
    assert on_node("sim-server1", "ssh -o BatchMode=yes sim-server0 hostname").stdout.strip() == "sim-server0"
    # No other node's key is accepted without being pinned.
    pinned = on_node("sim-server0", "cat /etc/ddp-cluster/known_hosts").stdout
    assert "[sim-server1]:12345" in pinned and "[sim-server0]:12345" in pinned
    out = on_node(
        "sim-server0",
        "mpirun -H sim-server0:1,sim-server1:1 --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0 hostname",
        timeout=60,
    ).stdout.split()
    assert sorted(out) == SERVERS


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_train_across_servers(sim_cluster: PlaybookResult, launcher: str) -> None:
    job = job_id(launcher)
    result = train(job, nodes=2, launcher=launcher, script_args=QUICK)
    assert result.rc == 0, result.stdout[-5000:]
    summary = json.loads((RUNS / job / "summary.json").read_text())
    assert summary["world_size"] == 2
    # torchrun: each worker's own log, and each node's agent's.
    agents = ["agent.0.log", "agent.1.log"] if launcher == "torchrun" else []
    assert sorted(p.name for p in (RUNS / job / "logs").iterdir()) == [*agents, "rank.0.log", "rank.1.log"]
    assert (RUNS / job / "nodes" / "sim-server1").is_dir()


def test_the_health_gate_measures_across_servers_through_their_firewalls(sim_cluster: PlaybookResult) -> None:
    job = job_id("check")
    result = run_playbook("check.yml", extravars={"job_id": job, "nodes": 2}, inventory=SIM)
    assert result.rc == 0, result.stdout[-5000:]
    assert "health gate PASSED: 2 node(s), 2 rank(s), gloo on cpu, mpirun" in result.stdout
    results = json.loads((RUNS / job / "health.json").read_text())
    assert [(pair["a"], pair["b"]) for pair in results["pairs"]] == [("sim-server0", "sim-server1")]
    assert results["pairs"][0]["busbw_gbps"] > 0 and results["check"]["ok"]


def test_firewall_lets_the_servers_through_and_keeps_everyone_else_out(sim_cluster: PlaybookResult) -> None:
    rules = on_server("sim-server1", "ufw status").stdout
    assert "Status: active" in rules
    # Every port from each server of the cluster; sshd only from the controller (this machine, the bridge's gateway).
    allowed = [line.split() for line in rules.splitlines() if "ALLOW" in line]
    assert any(rule[0] == "Anywhere" and "172.30.99.10" in rule for rule in allowed), rules
    assert any(rule[0] == "22/tcp" and "172.30.99.1" in rule for rule in allowed), rules
    subprocess.run(["docker", "exec", "-d", "sim-server1", "python3", "-m", "http.server", "9000"], check=True)
    time.sleep(1)
    try:
        probe = 'python3 -c "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)"'
        # A port no one pinned (gloo and NCCL listen on such ports) answers the other server...
        on_server("sim-server0", f"{probe} 172.30.99.11 9000")
        # ...and not the controller, which is no server of the cluster.
        with pytest.raises(OSError):
            socket.create_connection(("172.30.99.11", 9000), 3).close()
    finally:
        on_server("sim-server1", "pkill -f 'http.server 9000'", check=False)


def test_dead_server_fails_the_job_within_60s_naming_it(sim_cluster: PlaybookResult) -> None:
    job = job_id("dead")
    args = "--dataset synthetic --synthetic-samples 200000 --epochs 50 --batch-size 64 --log-every 50"
    playbook = start_train(job, args, SIM)
    status = f"{STATE}/sim-server0/workspace/jobs/{job}/status.json"
    try:
        deadline = time.monotonic() + 240
        while '"step"' not in on_server("sim-server0", f"cat {status} 2>/dev/null", check=False).stdout:
            assert playbook.poll() is None, "train.yml ended before the job made progress"
            assert time.monotonic() < deadline, "the job made no progress within 240 s"
            time.sleep(1)
        subprocess.run(["docker", "kill", "sim-server1"], check=True, capture_output=True)
        killed = time.monotonic()
        output, _ = playbook.communicate(timeout=150)
        took = time.monotonic() - killed
    finally:
        if playbook.poll() is None:
            os.killpg(playbook.pid, signal.SIGTERM)
        subprocess.run(["docker", "start", "sim-server1"], check=True, capture_output=True)
    assert playbook.returncode != 0
    assert took < 60, f"train.yml took {took:.0f} s to fail after sim-server1 died"
    assert f"job {job} failed: node sim-server1" in output, output[-4000:]
    left = on_node("sim-server0", f"pgrep -af '[/]workspace/jobs/{job}/' || true").stdout.strip()
    assert left == "", left
    wait_engine("sim-server1")


@pytest.fixture
def healthy_again() -> Iterator[None]:
    """Each failure test leaves the cluster as it found it; the next test checks it from scratch."""
    forget_connections()
    yield
    forget_connections()


def assert_stopped_naming(result: PlaybookResult, words: str) -> None:
    """site.yml stopped in preflight with a message naming the server, and nothing changed anywhere."""
    assert result.rc != 0
    assert words in result.stdout, result.stdout[-4000:]
    assert changed_on(result, "sim-server0") == 0, result.stdout[-4000:]
    assert "TASK [training_image" not in result.stdout and "TASK [node_container" not in result.stdout


def test_stopped_engine_stops_site_naming_the_server(sim_cluster: PlaybookResult, healthy_again: None) -> None:
    stop = "pkill -x dockerd; for i in $(seq 30); do docker info >/dev/null 2>&1 || exit 0; sleep 1; done; exit 1"
    on_server("sim-server1", stop)
    try:
        result = site()
        assert_stopped_naming(result, "sim-server1: no Docker engine answers")
    finally:
        on_server("sim-server1", "rm -f /var/run/docker.pid; nohup dockerd >/var/log/dockerd.log 2>&1 </dev/null &")
        wait_engine("sim-server1")


def test_a_controller_without_the_registry_stops_site_before_anything_changes(sim_cluster: PlaybookResult) -> None:
    # training_image's own preflight, run by playbooks/preflight.yml with the role's defaults and the inventory's.
    result = site(training_image_registry_command="no-such-registry")
    assert result.rc != 0
    flat = " ".join(result.stdout.split())
    assert "no-such-registry is not installed here" in flat and "cluster_image_distribution: save_load" in flat, flat
    assert changed_on(result, "sim-server0") == 0 and changed_on(result, "sim-server1") == 0
    assert "TASK [cluster_host" not in result.stdout and "TASK [training_image : Build" not in result.stdout


def test_unreachable_server_stops_site_naming_it(sim_cluster: PlaybookResult, healthy_again: None) -> None:
    # sshd refuses connections (a server whose sshd is down): the first rule of INPUT resets them.
    reject = "INPUT -p tcp --dport 22 -j REJECT --reject-with tcp-reset"
    on_server("sim-server1", f"iptables -I {reject}")
    try:
        result = site(cluster_preflight_login_timeout=6)
        assert_stopped_naming(result, "sim-server1 (172.30.99.11): cannot log in over ssh")
        assert "Connection refused" in result.stdout
    finally:
        on_server("sim-server1", f"iptables -D {reject}")


def test_changed_host_key_stops_site_naming_it(sim_cluster: PlaybookResult, healthy_again: None) -> None:
    on_server("sim-server1", "mkdir -p /root/keys.orig && cp -a /etc/ssh/ssh_host_* /root/keys.orig/")
    on_server("sim-server1", "rm /etc/ssh/ssh_host_* && ssh-keygen -A >/dev/null && pkill -HUP -o -x sshd")
    try:
        result = site(cluster_preflight_login_timeout=6)
        assert_stopped_naming(result, "sim-server1 (172.30.99.11): cannot log in over ssh")
        assert "host key differs from the one pinned" in result.stdout
    finally:
        on_server("sim-server1", "cp -a /root/keys.orig/ssh_host_* /etc/ssh/ && pkill -HUP -o -x sshd")


def test_missing_interface_stops_site_naming_the_server_and_its_interfaces(
    sim_cluster: PlaybookResult, healthy_again: None
) -> None:
    result = run_playbook("site.yml", {"cluster_network_interface": "ens9"}, inventory=SIM, cmdline="--tags preflight")
    assert result.rc != 0
    assert "sim-server1: has no interface ens9 (cluster_network_interface); its interfaces: lo " in result.stdout, (
        result.stdout[-3000:]
    )


def test_taken_port_stops_site_naming_the_server_and_the_port(sim_cluster: PlaybookResult, healthy_again: None) -> None:
    subprocess.run(["docker", "exec", "-d", "sim-server1", "python3", "-m", "http.server", "29515"], check=True)
    time.sleep(1)
    try:
        result = site()
        assert_stopped_naming(result, "sim-server1: a port the cluster pins is taken")
        assert ":29515" in result.stdout
    finally:
        on_server("sim-server1", "pkill -f 'http.server 29515'", check=False)


def test_cluster_works_after_the_failures(sim_cluster: PlaybookResult, healthy_again: None) -> None:
    # sim-server1 was killed and started again: its engine restarted its node container (restart policy), with
    # the same host keys, so a job runs with no site.yml in between (sim-ascend's site.yml follows anyway).
    job = job_id("after")
    done = train(job, nodes=2, script_args=QUICK)
    assert done.rc == 0, done.stdout[-5000:]


# --- the image through a registry -----------------------------------------------------------------------------
PACKAGE_INIT = REPO / "python" / "src" / "ddp_cluster" / "__init__.py"
REGISTRY_PORT = 15000


CHANGED_COPY = REPO / "build" / "code-change"
# Left out of the copy: the repository's history, the environment, caches and what runs produce.
CACHES = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
NOT_COPIED = {".git", ".venv", "build", "runs"} | CACHES


@contextlib.contextmanager
def code_change(tag: str) -> Iterator[Path]:
    """A copy of this repository with a one-line change under python/ (a new image tag), removed afterwards.

    A copy rather than an edit in place: the local suite may be building the image from this tree at the same time
    (make test runs the two side by side). The copy shares the wheelhouse (hard links: the image's build context
    takes it as files) and the controller's kept registry store."""
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


def image_layers(server: str, image: str) -> list[str]:
    return json.loads(on_server(server, f"docker image inspect -f '{{{{json .RootFS.Layers}}}}' {image}").stdout)


def task_output(result: PlaybookResult, task: str) -> str:
    """What a training_image task printed (the lines between its header and the next)."""
    parts = result.stdout.split(f"TASK [training_image : {task}]")
    assert len(parts) == 2, f"task {task!r} ran {len(parts) - 1} times"
    return parts[1].split("TASK [")[0].split("PLAY [")[0].lstrip("* \n")


def assert_no_registry_left() -> None:
    """The controller's registry and every tunnel end stopped with the stage; no registry name stays on a server."""
    assert (
        subprocess.run(["pgrep", "-f", "docker-registry serve /tmp/ddp-registry-"], capture_output=True).returncode != 0
    )
    assert subprocess.run(["pgrep", "-f", f"-R 127.0.0.1:{REGISTRY_PORT}"], capture_output=True).returncode != 0
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", REGISTRY_PORT)) != 0
    for server in SERVERS:
        assert not on_server(server, f"ss -Htln 'sport = :{REGISTRY_PORT}'").stdout.strip()
        assert not on_server(server, "docker image ls -q '127.0.0.1:*/*/*'").stdout.strip()


def test_bare_servers_got_the_image_through_the_registry(sim_cluster: PlaybookResult) -> None:
    pushed = task_output(sim_cluster, "Push the image once, pull it on every server that lacks it")
    assert pushed.startswith("changed: [sim-server0 -> localhost]"), pushed
    assert task_output(sim_cluster, "Copy the archive to the host").count("skipping:") == 2
    assert_no_registry_left()


def test_a_code_change_reaches_every_server_as_one_small_layer(
    sim_cluster: PlaybookResult, healthy_again: None
) -> None:
    before = {server: node_image(server) for server in SERVERS}
    with code_change("registry") as changed:
        result = site(project=changed, cmdline="-v")
    assert result.rc == 0, result.stdout[-6000:]
    # Each server pulled one layer (the ddp_cluster code) and had every other; the registry sent well under 1% of
    # the image.
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
    assert f"sim-server1: the node image did not arrive from 127.0.0.1:{REGISTRY_PORT}/{NODE_IMAGE}:" in flat, (
        result.stdout[-4000:]
    )
    assert f"port {REGISTRY_PORT} on the server's loopback is taken" in flat
    assert "TASK [node_container" not in result.stdout
    assert {server: node_image(server) for server in SERVERS} == before
    assert_no_registry_left()


@contextlib.contextmanager
def registry_serving(config: Path, log_path: Path) -> Iterator[None]:
    """Docker's Distribution registry with this configuration while the block runs."""
    with log_path.open("w") as log:
        registry = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
        try:
            time.sleep(1)
            yield
        finally:
            registry.terminate()
            registry.wait(timeout=10)


@pytest.fixture
def unreachable_registry(tmp_path: Path) -> Iterator[str]:
    """A user's registry that the controller reaches and the servers do not: on the controller's own loopback."""
    port = REGISTRY_PORT + 1
    config = tmp_path / "config.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'storage'}\nhttp:\n"
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
        # The push went through; each server's own pull failed, and the message names that server and the registry.
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
def users_registry(tmp_path: Path) -> Iterator[str]:
    """A second registry standing in for the user's (Harbor, a cloud one): TLS with its own CA, on the controller's
    address on the sim network, trusted by the controller's and each server's engine through certs.d (no restart)."""
    address = "172.30.99.1:5443"
    key, cert = tmp_path / "registry.key", tmp_path / "registry.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=ddp-test-registry",
         "-addext", "subjectAltName=IP:172.30.99.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    config = tmp_path / "config.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'storage'}\n"
        f"http:\n  addr: {address}\n  tls:\n    certificate: {cert}\n    key: {key}\n"
    )
    certs = [Path("/etc/docker/certs.d") / address]
    certs[0].mkdir(parents=True, exist_ok=True)
    shutil.copy(cert, certs[0] / "ca.crt")
    for server in SERVERS:
        on_server(server, f"mkdir -p /etc/docker/certs.d/{address}")
        subprocess.run(["docker", "cp", str(cert), f"{server}:/etc/docker/certs.d/{address}/ca.crt"], check=True)
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
    # Each server's engine fetched the manifest from the user's registry itself (no tunnel: its own address).
    log = (tmp_path / "registry.log").read_text()
    for index, server in enumerate(SERVERS):
        assert node_image(server)[1] == image
        assert re.search(
            rf'http\.request\.method=(GET|HEAD) http\.request\.remoteaddr="172\.30\.99\.{10 + index}:\d+" '
            rf"http\.request\.uri=/v2/ml/{NODE_IMAGE}/manifests/",
            log,
        ), log[-3000:]
        assert not on_server(server, "docker image ls -q '172.30.99.1:5443/*/*/*'").stdout.strip()
    assert_no_registry_left()


def test_the_cluster_is_back_on_the_repositorys_code(sim_cluster: PlaybookResult, healthy_again: None) -> None:
    # The code is as it was: the image of the first run, still on every server, is taken again; nothing is pulled.
    result = site()
    assert result.rc == 0, result.stdout[-6000:]
    assert task_output(result, "Push the image once, pull it on every server that lacks it").startswith("skipping:")
    job = job_id("back")
    done = train(job, nodes=2, script_args=QUICK)
    assert done.rc == 0, done.stdout[-5000:]


def test_an_ngc_base_keeps_its_own_torch_and_trains(sim_cluster: PlaybookResult, tmp_path: Path) -> None:
    # NVIDIA's PyTorch container as a gpu inventory takes it (inventories/gpu-example): its own torch build, which
    # no index has, stays; the gpu requirements add only the rest. Then the cpu cluster runs on it.
    ngc_torch = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "python3", NGC_BASE, "-c", "import torch; print(torch.__version__)"],
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
        assert on_node(server, "ls /opt/venv/lib/python3.11/site-packages | grep -ci '^torch' || true").stdout == "0\n"
    job = job_id("ngc")
    done = train(job, nodes=2, script_args=QUICK)
    assert done.rc == 0, done.stdout[-5000:]
    assert json.loads((RUNS / job / "summary.json").read_text())["world_size"] == 2
    # Our default requirements pin PyPI's torch: on this base that is refused naming both, before any build.
    refused = run_playbook(
        "site.yml", {**gpu, "training_image_requirements": str(REPO / "docker" / "requirements.txt")},
        inventory=SIM, cmdline="--tags training_image_base",
    )  # fmt: skip
    flat = " ".join(refused.stdout.split())
    assert refused.rc != 0
    assert f"asks for torch==2.13.0, but the base image has torch {ngc_torch} in /usr/local/lib" in flat, flat[-3000:]


# The doubles' topology for the first two chips of each server (npu-smi info -t topo's CPU Affinity): this machine
# has CPUs 0 and 1 only, so device 0 is local to CPU 1 and device 1 to CPU 0 (crossed, so that a binding by
# local rank alone would show).
DOUBLES_CONFIG = {
    "chip_count": 8,
    "npu_name": "910B",
    "version": "23.0.0",
    "devices": {"0": {"cpu_affinity": "1"}, "1": {"cpu_affinity": "0"}},
}


def write_doubles_config(server: str, config: dict[str, object]) -> None:
    on_server(server, f"echo {shlex_quote(json.dumps(config))} > /var/lib/ddp-doubles/config.json")


@pytest.fixture(scope="module")
def ascend_cluster(servers: list[str]) -> PlaybookResult:
    # sim-server0's engine gets ascend-docker-runtime registered, as its installer does (the default runtime too);
    # sim-server1's has none.
    on_server("sim-server0", "/opt/ddp-sim/ascend/install-runtime.sh")
    wait_engine("sim-server0")
    for server in servers:
        write_doubles_config(server, DOUBLES_CONFIG)
    result = site(SIM_ASCEND)
    assert result.rc == 0, result.stdout[-6000:]
    return result


def test_ascend_runtime_where_the_engine_has_it_and_devices_and_mounts_elsewhere(
    ascend_cluster: PlaybookResult,
) -> None:
    inspect = "docker inspect -f '{{json .HostConfig}} {{json .Config.Env}}' "
    host0, env0 = on_server("sim-server0", inspect + "sim-server0").stdout.split(" ", 1)
    host1, env1 = on_server("sim-server1", inspect + "sim-server1").stdout.split(" ", 1)
    config0, config1 = json.loads(host0), json.loads(host1)
    # With the runtime: asked for by name, ASCEND_VISIBLE_DEVICES in the container's own environment, no
    # explicit devices; the runtime (the stand-in, as the real one) made the device nodes and the mounts.
    assert config0["Runtime"] == "ascend"
    assert "ASCEND_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in json.loads(env0)
    assert not config0["Devices"]
    assert "create sim-server0: devices [0, 1, 2, 3, 4, 5, 6, 7]" in on_server(
        "sim-server0", "cat /var/log/ascend-docker-runtime.log"
    ).stdout.replace(on_server("sim-server0", "docker inspect -f '{{.Id}}' sim-server0").stdout.strip(), "sim-server0")
    # (The runtime edits the container's first process; docker exec takes its environment from Docker's config.)
    seen = on_node("sim-server0", "ls /dev/davinci0 /dev/davinci7 /dev/davinci_manager"
                   " && tr '\\0' '\\n' < /proc/1/environ | sed -n 's/^ASCEND_DOCKER_RUNTIME=//p'"
                   " && grep -c ' /var/queue_schedule ' /proc/mounts")  # fmt: skip
    assert seen.stdout.split()[-2:] == ["True", "1"], seen.stdout
    # Without: runc, the devices given explicitly and the runtime's base.list paths mounted read-only.
    assert config1["Runtime"] == "runc"
    assert "ASCEND_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" not in json.loads(env1)
    assert {device["PathOnHost"] for device in config1["Devices"]} >= {
        "/dev/davinci0", "/dev/davinci7", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"
    }  # fmt: skip
    assert {"/var/queue_schedule:/var/queue_schedule:ro", "/usr/local/dcmi:/usr/local/dcmi:ro"} <= set(config1["Binds"])
    for server in SERVERS:
        # The variable does nothing in node.env: it is not there.
        assert on_node(server, "grep -c ASCEND_VISIBLE_DEVICES /etc/ddp-cluster/node/node.env || true").stdout == "0\n"


def test_ascend_ranks_are_bound_to_their_devices_cpus_from_the_topology(ascend_cluster: PlaybookResult) -> None:
    job = job_id("npu-numa")
    result = train(job, SIM_ASCEND, nodes=2, device="cpu", cluster_nproc_per_node=2,
                   script=str(REPO / "tests" / "scripts" / "affinity_probe.py"))  # fmt: skip
    assert result.rc == 0, result.stdout[-5000:]
    flat = " ".join(result.stdout.split())
    said = "ranks bound to the CPUs of their devices (cluster_cpu_binding numa; device=CPUs): sim-server0 0=1;1=0;"
    assert said in flat, flat[-3000:]
    reports = [
        json.loads(line.split("affinity-probe ", 1)[1])
        for log in sorted((RUNS / job / "logs").glob("rank.*.log"))
        for line in log.read_text().splitlines()
        if "affinity-probe {" in line
    ]
    assert sorted((r["node"], r["local_rank"], r["affinity"]) for r in reports) == [
        ("sim-server0", 0, [1]), ("sim-server0", 1, [0]), ("sim-server1", 0, [1]), ("sim-server1", 1, [0])
    ], reports  # fmt: skip
    assert all(r["taskset"].endswith(f"current affinity list: {r['affinity'][0]}") for r in reports), reports


@pytest.fixture
def device_fabric(ascend_cluster: PlaybookResult) -> Iterator[str]:
    """A second network between the servers (eth1 on each), opened in their firewalls: each node's local rank 1
    pairs on it (DDP_GLOO_DEVICE_IFNAMES), as a chip's own NIC carries its traffic."""
    name = f"ddp-sim-dev1-{uuid.uuid4().hex[:6]}"
    subprocess.run(["docker", "network", "create", name], check=True, capture_output=True)
    try:
        for server in SERVERS:
            subprocess.run(["docker", "network", "connect", name, server], check=True, capture_output=True)
            on_server(server, "ufw allow in on eth1 >/dev/null")
        yield name
    finally:
        for server in SERVERS:
            on_server(server, "ufw delete allow in on eth1 >/dev/null; tc qdisc del dev eth1 root", check=False)
            subprocess.run(["docker", "network", "disconnect", "-f", name, server], capture_output=True, check=False)
        subprocess.run(["docker", "network", "rm", name], capture_output=True, check=False)


def test_ascend_gate_measures_every_device_pair_and_names_a_slow_device_link(device_fabric: str) -> None:
    # What sim-server1's local rank 1 sends goes through a token bucket; its local rank 0 is not slowed.
    on_server("sim-server1", "tc qdisc add dev eth1 root tbf rate 100mbit burst 64kb latency 100ms")
    job = job_id("npu-devices")
    result = run_playbook(
        "check.yml",
        extravars={"job_id": job, "nodes": 2, "device": "cpu", "cluster_nproc_per_node": 2,
                   "ddp_job_env": {"DDP_GLOO_DEVICE_IFNAMES": "eth0,eth1"}},
        inventory=SIM_ASCEND,
    )  # fmt: skip
    assert result.rc != 0
    flat = " ".join(result.stdout.split())
    assert f"health gate {job} failed: the link sim-server0 device 1 <-> sim-server1 device 1 is slow" in flat, flat[
        -4000:
    ]
    health = json.loads((RUNS / job / "health.json").read_text())
    assert [(pair["a"], pair["b"], pair["device"]) for pair in health["pairs"]] == [
        ("sim-server0", "sim-server1", 0), ("sim-server0", "sim-server1", 1)
    ]  # fmt: skip
    assert len(health["verdict"]["problems"]) == 1, health["verdict"]["problems"]
    # Before the ranks, every device pinged its counterpart on the other server with hccn_tool.
    calls = on_server("sim-server0", "cat /var/lib/ddp-doubles/calls.log").stdout
    assert "hccn_tool -i 0 -ping -g address 192.168.100.111" in calls
    assert "hccn_tool -i 1 -ping -g address 192.168.101.111" in calls


def test_ascend_gate_names_a_device_pair_that_hccn_ping_cannot_reach(ascend_cluster: PlaybookResult) -> None:
    write_doubles_config("sim-server0", DOUBLES_CONFIG | {"unreachable": ["192.168.101.111"]})
    try:
        job = job_id("npu-ping")
        result = run_playbook(
            "check.yml",
            extravars={"job_id": job, "nodes": 2, "device": "cpu", "cluster_nproc_per_node": 2},
            inventory=SIM_ASCEND,
        )
    finally:
        write_doubles_config("sim-server0", DOUBLES_CONFIG)
    assert result.rc != 0
    flat = " ".join(result.stdout.split())
    assert (
        "sim-server0: hccn_tool -ping failed for device 1 -> sim-server1 at 192.168.101.111 (rc 1: 3 packets"
        " transmitted, 0 received, 100.00% packet loss)" in flat
    ), flat[-4000:]
    assert "device 0 ->" not in flat.split("hccn_tool -ping failed for")[1].split(".")[0]
    assert not (RUNS / job / "health.json").exists()


def test_ascend_hosts_stage_runs_on_the_doubles(ascend_cluster: PlaybookResult) -> None:
    for index, server in enumerate(SERVERS):
        calls = on_server(server, "cat /var/lib/ddp-doubles/calls.log").stdout
        assert "npu-smi info -l" in calls
        seed = 101 + 10 * index
        assert f"hccn_tool -i 0 -ip -s address 192.168.100.{seed}" in calls, calls[-2000:]
        assert on_server(server, "sysctl -n net.ipv4.ip_local_reserved_ports").stdout.strip() == "60000-60015"
        devices = on_node(server, "ls /dev/davinci0 /dev/davinci7 /dev/davinci_manager /dev/devmm_svm /dev/hisi_hdc")
        assert len(devices.stdout.split()) == 5
        # No whole-cluster rank table in the node's settings directory: each job writes its own.
        assert on_node(server, "test ! -e /etc/ddp-cluster/node/rank_table.json", check=False).returncode == 0


def test_ascend_node_gets_what_real_training_needs(ascend_cluster: PlaybookResult) -> None:
    for server in SERVERS:
        template = "'{{.HostConfig.IpcMode}} {{range .HostConfig.Ulimits}}{{.Name}}={{.Soft}} {{end}}'"
        # memlock stays at the VM's hard limit here (no CAP_SYS_RESOURCE; see inventories/sim-ascend).
        assert on_server(server, f"docker inspect -f {template} {server}").stdout.split() == ["host", "stack=67108864"]
        # npu-smi where ascend-docker-runtime mounts it, found on the host.
        assert "Total Count" in on_node(server, "npu-smi info -l").stdout
        assert on_node(server, "command -v npu-smi").stdout.strip() == "/usr/local/sbin/npu-smi"
        # The venv is made with the Python the CANN base puts first on PATH (built into /usr/local/python3.11.2),
        # keeps the base's numpy 1.24.0, and has torch and torch_npu from the wheelhouse by the example's pins.
        assert on_node(server, "readlink -f /opt/venv/bin/python3").stdout.strip() == CANN_PYTHON
        found = on_node(server, f"python -c '{VERSIONS}' numpy torch torch_npu").stdout.split()
        assert found[:2] == ["1.24.0", f"{CANN_SITE}/numpy/__init__.py"], found
        assert found[2:4] == ["2.13.0+cpu", "/opt/venv/lib/python3.11/site-packages/torch/__init__.py"], found
        assert found[4:] == ["2.13.0", "/opt/venv/lib/python3.11/site-packages/torch_npu/__init__.py"], found
        assert on_node(server, "ls /opt/venv/lib/python3.11/site-packages | grep -ci '^numpy' || true").stdout == "0\n"
        # No whole-inventory rank table in every shell: each job sets its own.
        assert on_node(server, 'echo "${RANK_TABLE_FILE:-unset}"').stdout.strip() == "unset"


def npu_reports(job: str) -> list[dict[str, object]]:
    """The npu_probe.py report of every rank, from each rank's own log (the agents' logs repeat them)."""
    return [
        json.loads(line.split("npu-probe ", 1)[1])
        for log in sorted((RUNS / job / "logs").glob("rank.*.log"))
        for line in log.read_text().splitlines()
        if "npu-probe {" in line
    ]


def test_ascend_ranks_on_both_servers_import_torch_npu(ascend_cluster: PlaybookResult) -> None:
    job = job_id("npu")
    result = train(
        job, SIM_ASCEND, nodes=2, launcher="torch_npu_run", script=str(REPO / "tests" / "scripts" / "npu_probe.py")
    )
    assert result.rc == 0, result.stdout[-5000:]
    reports = npu_reports(job)
    assert sorted(report["node"] for report in reports) == SERVERS
    job_dir = f"/workspace/jobs/{job}"
    for report in reports:
        assert report["torch_npu"], report
        assert report["npu_count"] == 8
        assert report["ranks_with_torch_npu"] == 2
        env = report["env"]
        assert env["DDP_DEVICE"] == "npu" and env["DDP_LAUNCHER"] == "torch_npu_run"
        # The base image's library dirs (and set_env.sh's), the site's appended directory last.
        assert "/usr/local/Ascend/driver/lib64/common:/usr/local/Ascend/driver/lib64/driver:" in env["LD_LIBRARY_PATH"]
        assert env["LD_LIBRARY_PATH"].endswith(":/opt/ddp-sim/lib64")
        assert "/usr/local/Ascend/ascend-toolkit/latest/bin" in env["PATH"]
        assert env["RANK_TABLE_FILE"] == f"{job_dir}/rank_table.json"
        assert env["ASCEND_PROCESS_LOG_PATH"] == f"{job_dir}/ascend"
    # The rank started by docker exec and the one started by sshd see the same environment; but for
    # ASCEND_VISIBLE_DEVICES, which sim-server0's container has in its own environment for ascend-docker-runtime
    # (read at creation; CANN reads ASCEND_RT_VISIBLE_DEVICES), and which docker exec passes on.
    first = {name: value for name, value in reports[0]["env"].items() if name != "ASCEND_VISIBLE_DEVICES"}
    second = {name: value for name, value in reports[1]["env"].items() if name != "ASCEND_VISIBLE_DEVICES"}
    assert first == second
    table = json.loads((RUNS / job / "nodes" / "sim-server1" / "rank_table.json").read_text())
    assert [server["server_id"] for server in table["server_list"]] == ["172.30.99.10", "172.30.99.11"]
    # CANN's process logs came back with the job, from both servers.
    for server in SERVERS:
        assert list((RUNS / job / "nodes" / server / "ascend" / "plog").glob("plog-*.log")), server


def test_ascend_job_on_one_node_trains_on_cpu_when_asked_with_its_own_rank_table(
    ascend_cluster: PlaybookResult,
) -> None:
    # torchrun from the venv's torch (python -m torch.distributed.run), on the CANN base's own Python.
    job = job_id("npu-cpu")
    result = train(job, SIM_ASCEND, nodes=1, launcher="torchrun", device="cpu", script_args=QUICK)
    assert result.rc == 0, result.stdout[-5000:]
    assert "device cpu (asked for, on this npu cluster)" in result.stdout
    assert json.loads((RUNS / job / "summary.json").read_text())["world_size"] == 1
    table = json.loads((RUNS / job / "nodes" / "sim-server0" / "rank_table.json").read_text())
    assert table["server_count"] == "1"
    assert [device["device_id"] for device in table["server_list"][0]["device"]] == ["0"]


def test_ascend_gate_reports_cann_and_the_driver_and_names_a_server_whose_driver_differs(
    ascend_cluster: PlaybookResult,
) -> None:
    job = job_id("npu-check")
    result = run_playbook("check.yml", extravars={"job_id": job, "nodes": 2, "device": "cpu"}, inventory=SIM_ASCEND)
    assert result.rc == 0, result.stdout[-5000:]
    report = json.loads((RUNS / job / "health.json").read_text())["reports"][1]
    # CANN's version from the toolkit's <arch>-linux/ascend_toolkit_install.info, as the CANN 8 package lays it out.
    assert report["versions"]["cann"] == "8.2.RC1" and report["versions"]["npu_driver"] == "23.0.0"
    assert report["versions"]["torch_npu"] == "2.13.0"
    # The driver is the server's, mounted into its node: one server upgraded alone is named.
    info = "/usr/local/Ascend/driver/version.info"
    on_server("sim-server1", f"sed -i.orig 's/^Version=23.0.0$/Version=24.1.0/' {info}")
    try:
        job = job_id("npu-driver")
        result = run_playbook("check.yml", extravars={"job_id": job, "nodes": 2, "device": "cpu"}, inventory=SIM_ASCEND)
    finally:
        on_server("sim-server1", f"mv {info}.orig {info}")
    assert result.rc != 0
    assert (
        f"health gate {job} failed: npu_driver differs: node sim-server0 (rank 0) has '23.0.0'; node sim-server1"
        " (rank 1) has '24.1.0'; no value is held by a majority" in result.stdout
    ), result.stdout[-5000:]


def test_ascend_rank_that_cannot_use_the_npu_fails_the_job_naming_it(ascend_cluster: PlaybookResult) -> None:
    # The driver's library is gone on sim-server1: torch_npu cannot load there; no rank trains on cpu instead.
    hal = "/usr/local/Ascend/driver/lib64/driver/libascend_hal.so"
    on_server("sim-server1", f"mv {hal} {hal}.away")
    try:
        job = job_id("npu-broken")
        result = train(job, SIM_ASCEND, nodes=2, script=str(REPO / "tests" / "scripts" / "npu_probe.py"))
    finally:
        on_server("sim-server1", f"mv {hal}.away {hal}")
    assert result.rc != 0
    assert (
        "node sim-server1 rank 1/2: the job's device is npu (DDP_DEVICE) but device npu needs torch_npu"
        in result.stdout
    ), result.stdout[-5000:]
    assert "libascend_hal.so" in result.stdout


def test_ascend_taken_hccl_port_stops_site_naming_it(ascend_cluster: PlaybookResult) -> None:
    subprocess.run(["docker", "exec", "-d", "sim-server1", "python3", "-m", "http.server", "60005"], check=True)
    time.sleep(1)
    try:
        result = run_playbook("site.yml", inventory=SIM_ASCEND, cmdline="--tags preflight")
        assert result.rc != 0
        flat = " ".join(result.stdout.split())
        taken = "sim-server1: the HCCL ports 60000-60015 (npu_host_hccl_base_port, npu_host_hccl_port_count) are taken"
        assert taken in flat, result.stdout[-3000:]
        assert ":60005" in flat and "nothing was changed" in flat
    finally:
        on_server("sim-server1", "pkill -f 'http.server 60005'", check=False)


def test_ascend_mixed_tls_stops_site_naming_the_device(ascend_cluster: PlaybookResult) -> None:
    tool = "/usr/local/Ascend/driver/tools/hccn_tool"
    on_server("sim-server1", f"{tool} -i 3 -tls -s enable 1")
    try:
        result = run_playbook("site.yml", inventory=SIM_ASCEND, cmdline="--tags preflight")
    finally:
        on_server("sim-server1", f"{tool} -i 3 -tls -s enable 0")
    flat = " ".join(result.stdout.split())
    assert result.rc != 0
    assert "NPU devices differ in their TLS setting" in flat, result.stdout[-3000:]
    assert "Most devices have 0; these differ: sim-server1 device 3: tls switch 1 (enabled)." in flat


def test_ascend_requirements_that_would_shadow_the_base_numpy_are_refused(
    ascend_cluster: PlaybookResult, tmp_path: Path
) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("torch==2.13.0\ntorch-npu==2.13.0\nnumpy==2.4.6\nPyYAML>=6\n")
    result = run_playbook(
        "site.yml",
        {"training_image_requirements": str(requirements)},
        inventory=SIM_ASCEND,
        cmdline="--tags training_image_base",
    )
    flat = " ".join(result.stdout.split())
    assert result.rc != 0
    assert (
        f"training_image_requirements ({requirements}) line 3 asks for numpy==2.4.6, but the base image has numpy "
        f"1.24.0 in {CANN_SITE}: remove the line or make it numpy==1.24.0" in flat
    ), flat[-3000:]
    assert "Nothing was built" in flat


def test_ascend_two_nodes_train_on_the_cann_base(ascend_cluster: PlaybookResult) -> None:
    job = job_id("npu-2")
    result = train(job, SIM_ASCEND, nodes=2, device="cpu", script_args=QUICK)
    assert result.rc == 0, result.stdout[-5000:]
    summary = json.loads((RUNS / job / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["accuracy"] >= 0.8


# --- Ansible run on a server of the cluster (ansible_connection: local for that one) ---------------------------
SITE_PACKAGES = REPO / ".venv" / "lib" / "python3.11" / "site-packages"
# What ansible-playbook and the modules of the hosts stage import, from this controller's venv (pure Python or
# cp311 wheels: the server's Python is 3.11 too); ansible_collections only for the three collections used.
ANSIBLE_PACKAGES = (
    "ansible", "ansible_core-*.dist-info", "yaml", "_yaml", "jinja2", "markupsafe", "cryptography", "cffi",
    "_cffi_backend*.so", "resolvelib", "packaging", "docker", "requests", "urllib3", "idna", "charset_normalizer",
    "certifi", "ansible_collections/community/docker", "ansible_collections/community/general",
    "ansible_collections/ansible/posix", "ansible_collections/community/library_inventory_filtering_v1",
)  # fmt: skip


def test_a_server_that_runs_ansible_itself_gets_the_same_hosts_stage(servers: list[str], tmp_path: Path) -> None:
    """Ansible on sim-server0 (ansible_connection: local for it), sim-server1 over ssh: the hosts stage opens
    sim-server0's firewall to sim-server1 as it opens sim-server1's to sim-server0."""
    bundle = tmp_path / "controller.tar"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    subprocess.run(["tar", "-cf", str(bundle), "-C", str(REPO), "--transform", "s,^,ddp-cluster/,", *files], check=True)
    names = [*ANSIBLE_PACKAGES, *(f"{name.lstrip('_')}-*.dist-info" for name in ANSIBLE_PACKAGES if "/" not in name)]
    names += ["pyyaml-*.dist-info"]
    packages = sorted({str(path.relative_to(SITE_PACKAGES)) for name in names for path in SITE_PACKAGES.glob(name)})
    subprocess.run(["tar", "-rf", str(bundle), "-C", str(SITE_PACKAGES), "--transform", "s,^,site-packages/,",
                    *packages], check=True)  # fmt: skip
    access = Path.home() / ".ddp-cluster" / "sim-servers"
    subprocess.run(["docker", "cp", str(bundle), "sim-server0:/root/controller.tar"], check=True)
    subprocess.run(["docker", "cp", str(access / "id_ed25519"), "sim-server0:/root/id_ed25519"], check=True)
    subprocess.run(["docker", "cp", str(access / "known_hosts"), "sim-server0:/root/known_hosts"], check=True)
    on_server("sim-server0", "mkdir -p /root/ctl /root/.ddp-cluster/sim-servers"
              " && tar -xf /root/controller.tar -C /root/ctl"
              " && mv /root/id_ed25519 /root/known_hosts /root/.ddp-cluster/sim-servers/"
              " && chmod 0600 /root/.ddp-cluster/sim-servers/id_ed25519")  # fmt: skip
    # sim-server0 is where Ansible runs: a local connection, the server's own Python.
    on_server("sim-server0", "printf '%s\\n' 'all:' '  children:' '    nodes:' '      hosts:' '        sim-server0:'"
              " '          ansible_connection: local' '          ansible_python_interpreter: /usr/bin/python3'"
              " > /root/ctl/ddp-cluster/inventories/sim/local.yml")  # fmt: skip
    # sim-server0's firewall as at its first boot (an earlier site.yml from this machine opened it): only ssh.
    on_server("sim-server0", "ufw --force reset >/dev/null && ufw default deny incoming >/dev/null"
              " && ufw allow 22/tcp >/dev/null && ufw --force enable >/dev/null")  # fmt: skip
    assert "172.30.99.11" not in on_server("sim-server0", "ufw status").stdout
    run = on_server(
        "sim-server0",
        "cd /root/ctl/ddp-cluster && PYTHONPATH=/root/ctl/site-packages ANSIBLE_PYTHON_INTERPRETER=/usr/bin/python3"
        " python3 -c 'import sys; from ansible.cli.playbook import main; sys.argv[0] = \"ansible-playbook\"; main()'"
        " -i inventories/sim/hosts.yml -i inventories/sim/local.yml playbooks/hosts.yml 2>&1",
        check=False,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-5000:]
    assert "TASK [cluster_host : Let the cluster's servers through ufw, from each one]" in run.stdout
    assert "changed: [sim-server0] => (item=172.30.99.11)" in run.stdout, run.stdout[-5000:]
    assert "172.30.99.11" in on_server("sim-server0", "ufw status").stdout
    assert "172.30.99.10" in on_server("sim-server1", "ufw status").stdout
    # sim-server1 now reaches a port on sim-server0 that only the opening lets through.
    on_server("sim-server0", "(timeout 20 python3 -m http.server 29599 >/dev/null 2>&1 &)")
    probe = "timeout 2 bash -c '</dev/tcp/172.30.99.10/29599'"
    reached = on_server("sim-server1", f"for i in 1 2 3 4 5; do {probe} && exit 0; sleep 1; done; exit 1", check=False)
    assert reached.returncode == 0
