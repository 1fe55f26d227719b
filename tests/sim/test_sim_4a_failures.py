"""A server lost mid-run, after preflight: site.yml goes on without it, the other server converges, the run's
last line names the lost one (stage and why) and its state file says it did not converge; once it is back,
the next site.yml converges it, and the cluster is as the next stage expects it.

Runs after test_sim_4_preflight.py (the cluster converged and in use) and before test_sim_5_image.py. The
server is lost as a real one is, for the controller: every packet to its sshd answered by a reset (an
iptables rule on the server), which also ends Ansible's open connection to it, inserted when the containers
stage starts. ``-e converge=all`` takes both servers through (a warm run would take none);
``-e max_fail_percent=50``: at 2 servers one failure is half of them."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from .conftest import SIM, forget_connections, on_server, site
from conftest import REPO, PlaybookResult

LOST = "sim-server1"
KEPT = "sim-server0"
RESET = "INPUT -p tcp --dport 22 -j REJECT --reject-with tcp-reset"
# The containers stage's play (playbooks/containers.yml): the servers went through preflight, hosts and image.
CONTAINERS_START = "PLAY [Start one node container per node"
STATES = Path.home() / ".ddp-cluster" / "sim" / "nodes"


def state(node: str) -> dict[str, object]:
    return dict(json.loads((STATES / f"{node}.state.json").read_text()))


def site_losing_a_server(within: float = 600) -> tuple[int, str]:
    """site.yml, every server through; LOST's sshd made to reset every connection once the containers stage
    starts. Its exit status and output."""
    command = [
        *(str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(SIM), "site.yml"),
        *("-e", "converge=all", "-e", "max_fail_percent=50"),
    ]
    playbook = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=os.environ | {"ANSIBLE_NOCOLOR": "1"},
        start_new_session=True,
    )
    assert playbook.stdout is not None
    lines: list[str] = []
    lost = False
    deadline = time.monotonic() + within
    try:
        for line in playbook.stdout:
            lines.append(line)
            if not lost and line.startswith(CONTAINERS_START):
                on_server(LOST, f"iptables -I {RESET}")
                lost = True
            assert time.monotonic() < deadline, f"site.yml still running after {within:.0f} s"
        rc = playbook.wait(timeout=60)
    finally:
        if playbook.poll() is None:
            playbook.kill()
            playbook.wait()
    output = "".join(lines)
    assert lost, f"the containers stage never started:\n{output[-6000:]}"
    return rc, output


def test_a_server_lost_mid_run_is_named_the_other_converges_and_the_next_run_converges_it(
    sim_cluster: PlaybookResult, healthy_again: None
) -> None:
    try:
        rc, output = site_losing_a_server()
    finally:
        on_server(LOST, f"iptables -D {RESET}", check=False)
    tail = output[-6000:]
    assert rc != 0, tail
    last = output.rstrip().splitlines()[-1]
    named = f"site.yml: 1 of 2 servers converged; not: {LOST} (unreachable in containers: "
    assert last.startswith(named), tail
    assert last.endswith("; run site.yml again for them") and f"{KEPT} (" not in last, tail
    kept = output.split("PLAY RECAP")[-1].split(KEPT)[1].splitlines()[0]
    assert "unreachable=0" in kept and "failed=0" in kept, tail
    # The other server went through the last stages without it: its mesh written, its state recorded.
    mesh = output.split("PLAY [Wire passwordless SSH")[-1]
    assert f"[{KEPT}]" in mesh and f"[{LOST}]" not in mesh, tail
    assert state(KEPT)["converged"] is True
    assert state(LOST)["converged"] is False, state(LOST)

    forget_connections()  # the reset ended the connections; the next run logs in afresh, as after a repair
    again = site()
    assert again.rc == 0, again.stdout[-6000:]
    assert "servers converged" not in again.stdout, again.stdout[-3000:]
    assert state(LOST)["converged"] is True
    for server in (KEPT, LOST):
        running = on_server(server, f"docker inspect -f '{{{{.State.Running}}}}' {server}").stdout
        assert running.strip() == "true", server
