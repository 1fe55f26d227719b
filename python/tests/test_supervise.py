"""The supervisor's liveness probe tells a dead node from a slow one (ssh's own messages, OpenSSH 9)."""

from __future__ import annotations

import pytest

from ddp_cluster.supervise import probe_verdict


@pytest.mark.parametrize(
    "stderr",
    [
        "ssh: connect to host node1 port 12345: Connection refused\r\n",
        "ssh: connect to host node1 port 12345: No route to host\r\n",
        "ssh: connect to host 172.30.99.11 port 12345: Connection timed out\r\n",
        "ssh: Could not resolve hostname node1: Name or service not known\r\n",
        "ssh: connect to host node1 port 12345: Network is unreachable\r\n",
    ],
)
def test_a_node_that_does_not_answer_at_all_is_down(stderr: str) -> None:
    assert probe_verdict(255, stderr) == "down"


@pytest.mark.parametrize(
    "stderr",
    [
        "Connection timed out during banner exchange\r\nConnection to 172.18.0.3 port 12345 timed out\r\n",
        "kex_exchange_identification: read: Connection reset by peer\r\n",
        "kex_exchange_identification: Connection closed by remote host\r\n",
        "Connection closed by 172.18.0.3 port 12345\r\n",
    ],
)
def test_a_node_whose_sshd_is_too_busy_to_finish_is_slow_not_dead(stderr: str) -> None:
    assert probe_verdict(255, stderr) == "slow"


def test_a_login_that_runs_past_the_bound_after_connecting_is_slow_and_success_is_up() -> None:
    assert probe_verdict(None, "") == "slow"
    assert probe_verdict(0, "") == "up"
