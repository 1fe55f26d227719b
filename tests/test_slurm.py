"""Slurm on the local cluster site.yml makes (the slurm role): every node container is a Slurm node that
answers slurmctld, the settings are the same on every node and the munge key is the cluster's own (never
the image's); a user in a node runs `sinfo`, `srun` across the nodes (a gloo all-reduce through
``ddp_cluster.run``) and `sbatch`, whose second job waits for the first's nodes; a node container restarted
comes back into Slurm by itself."""

from __future__ import annotations

import hashlib
import json
import re
import time
from datetime import datetime

from conftest import KEY_DIR, PlaybookResult, docker, node_exec

NODES = ("node0", "node1")
COMPILED = KEY_DIR / "compiled"

# Two ranks, one per node, through the package's run wrapper (which reads srun's variables): the sum of the
# ranks' values over gloo, and where each rank ran.
ALL_REDUCE = """
import os, socket, torch, torch.distributed as dist
dist.init_process_group("gloo")
value = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(value)
rank, size = dist.get_rank(), dist.get_world_size()
print(f"rank {rank}/{size} on {socket.gethostname()} sum {value.item():.0f}", flush=True)
dist.destroy_process_group()
"""


def states() -> dict[str, str]:
    """Each node's Slurm state (sinfo's short form), asked from node1."""
    shown = node_exec("node1", "sinfo -h -N -o '%N %t'").stdout.split("\n")
    return dict(line.split() for line in shown if line.strip())


def wait_until(what: str, check: object, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not within {seconds:.0f} s"
        time.sleep(0.5)


def test_every_node_is_an_idle_slurm_node_with_the_clusters_own_settings(
    local_cluster: PlaybookResult,
) -> None:
    assert states() == {"node0": "idle", "node1": "idle"}
    partitions = node_exec("node0", "sinfo -h -o '%P %a %D'").stdout.split()
    assert partitions == ["ddp*", "up", "2"]
    # slurm.conf: the compiled one, the same bytes on every node; slurmctld runs on the first node only.
    wanted = (COMPILED / "slurm.conf").read_bytes()
    for node in NODES:
        assert node_exec(node, "cat /etc/slurm/slurm.conf").stdout.encode() == wanted
    assert b"SlurmctldHost=node0\n" in wanted and b"NodeName=node1 CPUs=1 State=UNKNOWN" in wanted
    daemons = {node: node_exec(node, "pgrep -x slurmctld >/dev/null && echo yes || echo no").stdout.strip()
               for node in NODES}  # fmt: skip
    assert daemons == {"node0": "yes", "node1": "no"}
    # The munge key: made on the controller (0600), installed 0600 root and for munged 0400 munge, the same on
    # every node; the image holds none.
    key = KEY_DIR / "munge.key"
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) >= 1024
    digest = hashlib.sha256(key.read_bytes()).hexdigest()
    for node in NODES:
        shown = node_exec(
            node, "stat -c '%a %U' /etc/ddp-cluster/munge.key /etc/munge/munge.key"
        ).stdout.split()
        assert shown == ["600", "root", "400", "munge"]
        assert node_exec(node, "sha256sum < /etc/ddp-cluster/munge.key").stdout.split()[0] == digest
    image = docker("inspect", "-f", "{{.Config.Image}}", "node0").stdout.strip()
    in_image = docker("run", "--rm", "--entrypoint", "sh", image, "-c", "ls /etc/munge/ /etc/slurm/").stdout
    assert "munge.key" not in in_image and "slurm.conf" not in in_image
    # A credential made on one node is accepted on the other: the two hold the same key.
    assert node_exec("node1", "munge -n | ssh node0 unmunge >/dev/null && echo ok").stdout.strip() == "ok"


def test_srun_across_two_nodes_trains_through_the_run_wrapper(local_cluster: PlaybookResult) -> None:
    node_exec(
        "node0",
        f"mkdir -p /workspace/slurm-test && cat > /workspace/slurm-test/reduce.py <<'EOF'{ALL_REDUCE}EOF",
    )
    node_exec(
        "node1",
        f"mkdir -p /workspace/slurm-test && cat > /workspace/slurm-test/reduce.py <<'EOF'{ALL_REDUCE}EOF",
    )
    ran = node_exec(
        "node1",
        "cd /workspace/slurm-test"
        " && timeout 120 srun -N2 --ntasks-per-node=1 python -m ddp_cluster.run reduce.py",
        check=False,
        timeout=150,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = sorted(line for line in ran.stdout.splitlines() if line.startswith("rank "))
    assert lines == ["rank 0/2 on node0 sum 3", "rank 1/2 on node1 sum 3"], ran.stdout + ran.stderr


def test_a_second_batch_job_waits_for_the_first_ones_nodes_then_runs(local_cluster: PlaybookResult) -> None:
    submit = (
        "sbatch --parsable -N2 --exclusive -o /workspace/slurm-test/%j.out --wrap 'srun hostname; sleep {}'"
    )
    node_exec("node0", "mkdir -p /workspace/slurm-test")
    first = node_exec("node0", submit.format(8)).stdout.strip()
    second = node_exec("node0", submit.format(0)).stdout.strip()
    try:
        wait_until("the first job runs", lambda: job_state(first) == "RUNNING")
        pending = node_exec("node0", f"squeue -h -j {second} -o '%T %r'").stdout.split()
        assert pending == ["PENDING", "Resources"] or pending == ["PENDING", "Priority"], pending
        wait_until("the second job ends", lambda: job_state(second) in ("", "COMPLETED"), 90)
        out = node_exec("node0", f"cat /workspace/slurm-test/{second}.out", check=False).stdout.split()
        assert sorted(out) == ["node0", "node1"]
        # The second started within 10 s of the first's end (Slurm keeps ended jobs' times for MinJobAge).
        ended, started = job_time(first, "EndTime"), job_time(second, "StartTime")
        assert 0 <= (started - ended).total_seconds() <= 10, (ended, started)
    finally:
        node_exec("node0", f"scancel {first} {second}", check=False)


def job_time(job: str, field: str) -> datetime:
    shown = node_exec("node0", f"scontrol show job {job}").stdout
    found = re.search(rf"\b{field}=(\S+)", shown)
    assert found, shown
    return datetime.fromisoformat(found.group(1))


def job_state(job: str) -> str:
    return node_exec("node0", f"squeue -h -j {job} -o %T 2>/dev/null", check=False).stdout.strip()


def test_a_restarted_node_container_comes_back_into_slurm_by_itself(local_cluster: PlaybookResult) -> None:
    docker("restart", "-t", "2", "node1")
    wait_until(
        "node1's slurmd runs again",
        lambda: node_exec("node1", "pgrep -x slurmd", check=False).returncode == 0,
    )
    wait_until("node1 is idle in Slurm", lambda: states().get("node1") == "idle")
    docker("restart", "-t", "2", "node0")
    wait_until("slurmctld runs again on node0",
               lambda: node_exec("node0", "pgrep -x slurmctld", check=False).returncode == 0)  # fmt: skip
    wait_until("both nodes are idle", lambda: states() == {"node0": "idle", "node1": "idle"})


def test_the_compiled_settings_name_the_first_node_and_no_address_on_a_bridge_network() -> None:
    cluster = json.loads((COMPILED / "cluster.json").read_text())
    assert cluster["slurm"]["controllers"] == ["node0"] and cluster["slurm"]["errors"] == []
