"""A warm site.yml on 40 local nodes: one probe of every node, then nothing runs on a node in sync.

The 40-node cluster is brought up once (module fixture); then a warm run changes nothing and starts no task
on any node; a node whose container was stopped is the only one that goes through the stages; the cluster
goes back to the 2 nodes the other tests use. Runs after test_site_scale.py (name order).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from conftest import KEY_DIR, PlaybookResult, docker, run_playbook, teardown_cluster

NODES = 40


def site(nodes: int = NODES) -> PlaybookResult:
    return run_playbook("site.yml", env={"DDP_LOCAL_NODES": str(nodes)}, timeout=1800)


def node_tasks(result: PlaybookResult, node: str) -> list[str]:
    """The task lines of NODE in a run's output (ok, changed, skipping, failed)."""
    found = re.findall(
        rf"^(?:ok|changed|skipping|failed|fatal): \[{node}(?: -> [^\]]+)?\]", result.stdout, re.M
    )
    return found


@pytest.fixture(scope="module")
def cluster_40() -> Iterator[PlaybookResult]:
    teardown_cluster(NODES)
    made = site()
    assert made.rc == 0, made.stdout[-6000:]
    try:
        yield made
    finally:
        names = [f"node{index}" for index in range(2, NODES)]
        docker("rm", "-f", *names, check=False)
        for name in names:
            for suffix in (".json", ".state.json"):
                (KEY_DIR / "nodes" / f"{name}{suffix}").unlink(missing_ok=True)
        back = site(2)
        assert back.rc == 0, back.stdout[-6000:]


def test_a_warm_run_on_40_nodes_probes_once_and_only_a_drifted_node_converges(
    cluster_40: PlaybookResult,
) -> None:
    started = time.monotonic()
    warm = site()
    warm_s = time.monotonic() - started
    assert warm.rc == 0, warm.stdout[-6000:]
    assert warm.changed_hosts() == {}, warm.stdout[-6000:]
    # No stage ran a task on any node: node0 holds the run_once steps of compile, regroup and record only.
    for index in range(1, NODES):
        assert node_tasks(warm, f"node{index}") == [], warm.stdout[-6000:]
    assert "PLAY [Start one node container per node, sshd on the cluster port]" in warm.stdout
    print(f"warm site.yml on {NODES} nodes: {warm_s:.1f} s")

    docker("stop", "node7")
    drifted = site()
    assert drifted.rc == 0, drifted.stdout[-6000:]
    assert set(drifted.changed_hosts()) == {"node7"}, drifted.stdout[-6000:]
    assert docker("inspect", "-f", "{{.State.Running}}", "node7").stdout.strip() == "true"
    # Only node7 went through the stages (the mesh too: its container was started, not made again, so the
    # pinned host keys did not change and no other node's mesh is written).
    assert node_tasks(drifted, "node7")
    for index in (1, 6, 8, NODES - 1):
        assert node_tasks(drifted, f"node{index}") == [], drifted.stdout[-6000:]
    state = (KEY_DIR / "nodes" / "node7.state.json").read_text()
    assert '"converged": true' in state

    again = site()
    assert again.rc == 0 and again.changed_hosts() == {}, again.stdout[-6000:]
    assert node_tasks(again, "node7") == []
