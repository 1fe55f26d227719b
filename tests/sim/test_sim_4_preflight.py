"""Servers that cannot be used stop site.yml in preflight, naming the server, before anything changes (engine
stopped, no registry on the controller, unreachable, host key changed, no such interface, a pinned port
taken); then the cluster works again after all that and the server killed mid-job (test_sim_3_job.py)."""

from __future__ import annotations

import subprocess
import time

from .conftest import QUICK, SIM, changed_on, job_id, on_server, site, train, wait_engine
from conftest import PlaybookResult, run_playbook


def assert_stopped_naming(result: PlaybookResult, words: str) -> None:
    """site.yml stopped in preflight with a message naming the server, and nothing changed anywhere."""
    assert result.rc != 0
    assert words in result.stdout, result.stdout[-4000:]
    assert changed_on(result, "sim-server0") == 0, result.stdout[-4000:]
    assert "TASK [training_image" not in result.stdout and "TASK [node_container" not in result.stdout


def test_stopped_engine_stops_site_naming_the_server(
    sim_cluster: PlaybookResult, healthy_again: None
) -> None:
    stop = (
        "pkill -x dockerd; for i in $(seq 30); do docker info >/dev/null 2>&1 || exit 0; sleep 1; done;"
        " exit 1"
    )
    on_server("sim-server1", stop)
    try:
        result = site()
        assert_stopped_naming(result, "sim-server1: no Docker engine answers")
    finally:
        on_server(
            "sim-server1", "rm -f /var/run/docker.pid; nohup dockerd >/var/log/dockerd.log 2>&1 </dev/null &"
        )
        wait_engine("sim-server1")


def test_a_controller_without_the_registry_stops_site_before_anything_changes(
    sim_cluster: PlaybookResult,
) -> None:
    # training_image's own preflight, run by playbooks/preflight.yml with the role's defaults and the
    # inventory's.
    result = site(training_image_registry_command="no-such-registry")
    assert result.rc != 0
    flat = " ".join(result.stdout.split())
    assert (
        "no-such-registry is not installed here" in flat and "cluster_image_distribution: save_load" in flat
    ), flat
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
    result = run_playbook(
        "site.yml", {"cluster_network_interface": "ens9"}, inventory=SIM, cmdline="--tags preflight"
    )
    assert result.rc != 0
    assert (
        "sim-server1: has no interface ens9 (cluster_network_interface); its interfaces: lo " in result.stdout
    ), result.stdout[-3000:]


def test_taken_port_stops_site_naming_the_server_and_the_port(
    sim_cluster: PlaybookResult, healthy_again: None
) -> None:
    subprocess.run(
        ["docker", "exec", "-d", "sim-server1", "python3", "-m", "http.server", "29515"], check=True
    )
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
