"""The ssh mesh across servers: the nodes log in to each other by name with pinned keys; mpirun spans them;
Slurm spans them, its ports open to the servers only."""

from __future__ import annotations

import socket
import time

import pytest

from .conftest import SERVERS, on_node, on_server
from conftest import PlaybookResult


def test_nodes_log_in_by_name_and_mpirun_spans_servers(sim_cluster: PlaybookResult) -> None:
    assert on_node("sim-server0", "ssh -o BatchMode=yes sim-server1 hostname").stdout.strip() == "sim-server1"
    assert on_node("sim-server1", "ssh -o BatchMode=yes sim-server0 hostname").stdout.strip() == "sim-server0"
    # No other node's key is accepted without being pinned.
    pinned = on_node("sim-server0", "cat /etc/ddp-cluster/known_hosts").stdout
    assert "[sim-server1]:12345" in pinned and "[sim-server0]:12345" in pinned
    out = on_node(
        "sim-server0",
        "mpirun -H sim-server0:1,sim-server1:1 --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0"
        " hostname",
        timeout=60,
    ).stdout.split()
    assert sorted(out) == SERVERS


def test_slurm_spans_the_servers_and_its_ports_answer_the_servers_only(sim_cluster: PlaybookResult) -> None:
    # Each server's node is a Slurm node at its server's address; slurmctld runs on the first.
    shown = on_node("sim-server1", "sinfo -h -N -o '%N %t'").stdout.split("\n")
    assert sorted(line for line in shown if line) == ["sim-server0 idle", "sim-server1 idle"]
    conf = on_node("sim-server0", "cat /etc/slurm/slurm.conf").stdout
    assert "SlurmctldHost=sim-server0(172.30.99.10)\n" in conf
    assert "NodeName=sim-server1 NodeAddr=172.30.99.11 " in conf
    assert on_node("sim-server1", "cat /etc/slurm/slurm.conf").stdout == conf
    # slurmctld's and slurmd's ports answer the other server, not the controller (no server of the cluster).
    probe = 'python3 -c "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)"'
    on_server("sim-server1", f"{probe} 172.30.99.10 6817")
    on_server("sim-server0", f"{probe} 172.30.99.11 6818")
    for port in (6817, 6818):
        with pytest.raises(OSError):
            socket.create_connection(("172.30.99.10", port), 3).close()
    # Two jobs across both servers: the second waits for the first's nodes, then runs on both.
    submit = "sbatch --parsable -N2 --exclusive -o /workspace/slurm-{}.out --wrap 'srun hostname; sleep {}'"
    first = on_node("sim-server0", submit.format("first", 6)).stdout.strip()
    second = on_node("sim-server0", submit.format("second", 0)).stdout.strip()
    try:
        state = on_node("sim-server0", f"squeue -h -j {second} -o '%T'").stdout.strip()
        assert state == "PENDING", state
        deadline = time.monotonic() + 90
        while on_node("sim-server0", f"squeue -h -j {first},{second} -o %i", check=False).stdout.strip():
            assert time.monotonic() < deadline, "the two jobs did not end within 90 s"
            time.sleep(1)
        out = on_node("sim-server0", "cat /workspace/slurm-second.out").stdout.split()
        assert sorted(out) == SERVERS
    finally:
        on_node("sim-server0", f"scancel {first} {second}", check=False)
