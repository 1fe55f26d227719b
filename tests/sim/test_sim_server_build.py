"""The node image built where the servers are (cluster_image_builder), on simulated servers made
fresh for this module, from a controller without Docker: no docker CLI on its PATH and no engine to reach.

Both servers are bare (an engine, no image). ``auto`` builds on sim-server0: its engine makes the project's
base image (debootstrap, installed there from the server's own package sources) and builds the node image from
a context of sources and wheels sent from the controller; sim-server1 pulls the image by digest from a
registry on sim-server0 over the cluster's own network, which refuses the host network's containers. (A base
already loaded on the servers, as at Ascend sites: bench/bench_builder.py.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import (
    NODE_IMAGE,
    QUICK,
    REGISTRY_PORT,
    RUNS,
    SERVERS,
    SIM,
    code_change,
    job_id,
    node_image,
    on_server,
    sim,
    task_output,
    wait_engine,
)
from .test_sim_5_image import assert_probed_and_refused, pulled_by_digest, registry_probe
from conftest import REPO, PlaybookResult, run_playbook

BASE = "ddp-cluster/base:bookworm"


@pytest.fixture(scope="module")
def no_docker(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A controller's environment without Docker: a PATH with every tool of /usr/bin but docker, and no
    engine."""
    bin_dir = tmp_path_factory.mktemp("no-docker-bin")
    for entry in Path("/usr/bin").iterdir():
        if not entry.name.startswith("docker"):
            (bin_dir / entry.name).symlink_to(entry)
    path = f"{REPO / '.venv' / 'bin'}:{bin_dir}:/usr/sbin:/sbin"
    env = {"PATH": path, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    assert subprocess.run(["sh", "-c", "command -v docker"], env=env, capture_output=True).returncode != 0
    return env


def site(env: dict[str, str], project: Path = REPO, cmdline: str = "", **extravars: object) -> PlaybookResult:
    return run_playbook(
        "site.yml", extravars=extravars, env=env, inventory=project / SIM.relative_to(REPO), project=project,
        cmdline=cmdline, timeout=1200,
    )  # fmt: skip


def controller_has(image_id: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", image_id], capture_output=True).returncode == 0


def image_id(server: str, name: str) -> str:
    return on_server(server, f"docker image inspect -f '{{{{.Id}}}}' {name}").stdout.strip()


def assert_nothing_left() -> None:
    """No registry, tunnel, ephemeral key, work directory or registry name left on any server."""
    for server in SERVERS:
        assert not on_server(server, f"ss -Htln 'sport = :{REGISTRY_PORT}'").stdout.strip(), server
        assert on_server(server, "pgrep -f '[r]egistry serve|[s]sh -N -i' || true").stdout.strip() == "", (
            server
        )
        assert "ddp-cluster-image-" not in on_server(server, "cat /root/.ssh/authorized_keys").stdout, server
        assert (
            on_server(server, "ls -d /tmp/ddp-registry.* /tmp/ddp-pull.* 2>/dev/null || true").stdout == ""
        ), server
        assert not on_server(server, "docker image ls -q '127.0.0.1:*/*/*'").stdout.strip(), server


@pytest.fixture(scope="module")
def built_on_server(no_docker: dict[str, str]) -> Iterator[PlaybookResult]:
    sim("down")
    sim("up")
    for server in SERVERS:
        assert on_server(server, "docker image ls -q | wc -l").stdout.strip() == "0"
    result = site(no_docker)
    assert result.rc == 0, result.stdout[-6000:]
    assert on_server("sim-server0", f"docker image inspect {BASE} >/dev/null", check=False).returncode == 0
    assert on_server("sim-server1", f"docker image inspect {BASE} >/dev/null", check=False).returncode != 0
    yield result
    if not os.environ.get("DDP_SIM_KEEP"):
        sim("down")


def test_auto_builds_on_the_first_server_when_the_controller_has_no_docker(
    built_on_server: PlaybookResult,
) -> None:
    # Said in preflight (the image stage reuses the choice).
    said = " ".join(built_on_server.stdout.split())
    assert (
        said.count("node image: built on the server sim-server0 (this controller has no Docker engine") == 1
    )
    # Every server runs one image, made by sim-server0's engine; this controller's engine never held it.
    ref = node_image("sim-server0")[1]
    assert ref.startswith(f"{NODE_IMAGE}:")
    built = image_id("sim-server0", ref)
    assert image_id("sim-server1", ref) == built
    for server in SERVERS:
        container = on_server(server, f"docker inspect -f '{{{{.Image}}}}' {server}").stdout.strip()
        assert container == built, server
    assert not controller_has(built)
    assert task_output(
        built_on_server, "Push the image once, pull it on every server that lacks it"
    ).startswith("changed: [sim-server0 -> localhost]")
    assert_nothing_left()


def test_second_run_changes_nothing(built_on_server: PlaybookResult, no_docker: dict[str, str]) -> None:
    again = site(no_docker)
    assert again.rc == 0, again.stdout[-4000:]
    assert again.changed_hosts() == {}, again.stdout[-6000:]


def test_a_job_trains_across_the_servers(built_on_server: PlaybookResult, no_docker: dict[str, str]) -> None:
    job = job_id("server-build")
    done = run_playbook(
        "train.yml", extravars={"job_id": job, "nodes": 2, "script_args": QUICK}, env=no_docker, inventory=SIM
    )
    assert done.rc == 0, done.stdout[-5000:]
    assert json.loads((RUNS / job / "output" / "summary.json").read_text())["world_size"] == 2


def test_a_code_change_is_built_on_the_server_and_reaches_the_other(
    built_on_server: PlaybookResult, no_docker: dict[str, str]
) -> None:
    before = image_id("sim-server0", node_image("sim-server0")[1])
    with code_change("server build") as changed, registry_probe(SERVERS) as seen:
        started = time.monotonic()
        result = site(no_docker, project=changed, cmdline="-v")
    print(f"site.yml with a code change built on a server: {time.monotonic() - started:.0f} s")
    print(f"what the host networks' probes saw: {seen}")
    assert result.rc == 0, result.stdout[-6000:]
    # sim-server1 pulled by the digest of the build server's push and holds the image sim-server0 built; the
    # registry on sim-server0's loopback and the tunnel's end on sim-server1's refused the host network's
    # containers.
    pulled_by_digest(result, ["sim-server1"], f"127.0.0.1:{REGISTRY_PORT}/{NODE_IMAGE}",
                     image_id("sim-server0", node_image("sim-server0")[1]))  # fmt: skip
    for server in SERVERS:
        assert_probed_and_refused(seen, server)
    # The build server built it; the other pulled one layer (the package's code), over the cluster's network.
    assert re.findall(r"layers_pulled: (\d+)", result.stdout) == ["1"], result.stdout[-6000:]
    ref = node_image("sim-server0")[1]
    after = image_id("sim-server0", ref)
    assert after != before and image_id("sim-server1", ref) == after
    for server in SERVERS:
        assert on_server(server, f"docker inspect -f '{{{{.Image}}}}' {server}").stdout.strip() == after, (
            server
        )
    assert not controller_has(after)
    assert_nothing_left()


def test_a_base_the_build_server_cannot_pull_stops_site_in_preflight_naming_the_server(
    built_on_server: PlaybookResult, no_docker: dict[str, str]
) -> None:
    base = "127.0.0.1:1/ascend/cann:8.2.rc1-910b-ubuntu22.04-py3.11"  # nothing listens there on the server
    containers = {server: node_image(server) for server in SERVERS}
    result = site(no_docker, cluster_image_builder="server", cluster_base_image=base)
    flat = " ".join(result.stdout.split())
    assert result.rc != 0
    assert (
        f"sim-server0 (the build server, cluster_image_build_host): the base image {base} is not on the "
        "engine that builds and could not be pulled: the registry 127.0.0.1:1 could not be reached"
    ) in flat, flat[-3000:]
    assert "docker load -i" in flat
    # Preflight's stop: the hosts stage never ran, nothing of that name on the server, no pull file left.
    assert "PLAY [Prepare the hosts" not in result.stdout
    assert on_server("sim-server0", f"docker image inspect {base} >/dev/null", check=False).returncode != 0
    assert on_server("sim-server0", "ls /var/tmp/ddp-pull.* 2>/dev/null || true").stdout == ""
    assert {server: node_image(server) for server in SERVERS} == containers


def test_the_build_servers_engine_stopped_fails_the_stage_naming_it(
    built_on_server: PlaybookResult, no_docker: dict[str, str]
) -> None:
    other = node_image("sim-server1")
    on_server("sim-server0", "pkill -x dockerd; for i in $(seq 30); do docker info >/dev/null 2>&1 || exit 0;"
                             " sleep 1; done; exit 1")  # fmt: skip
    try:
        with code_change("engine stopped") as changed:
            result = site(no_docker, project=changed, cmdline="--tags image")
    finally:
        on_server(
            "sim-server0", "rm -f /var/run/docker.pid; nohup dockerd >/var/log/dockerd.log 2>&1 </dev/null &"
        )
        wait_engine("sim-server0")
    flat = " ".join(result.stdout.split())
    assert result.rc != 0
    assert "sim-server0 (the build server, cluster_image_build_host): no Docker engine answers" in flat, flat[
        -3000:
    ]
    assert node_image("sim-server1") == other  # the other server's container untouched
    assert_nothing_left()
