"""The ssh mesh across servers: the nodes log in to each other by name with pinned keys; mpirun spans them."""

from __future__ import annotations

from .conftest import SERVERS, on_node
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
