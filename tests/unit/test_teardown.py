"""teardown.yml (make clean) never removes a running job nor the controller's job results (issue 45, point 8).

The playbook runs for real on an inventory of its own (two nodes on this machine, their state under a
temporary directory, names no other test uses), with a docker CLI double that answers the node's report of
its jobs as a node container does (ddp_cluster.supervisor.jobs's JSON line): a node where a job runs is
refused, naming the job, its nodes and the ways on, before anything is removed on any node, in check mode
too; a directory to remove that holds runs/ is refused; with force=true the role's step stops each job there
as jobs.yml stops it. The refusals come before the removal tasks, so no Docker engine is reached. With a real
job on the local cluster: tests/test_site_running_job.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
NODES = ("tdnode0", "tdnode1")

# docker double: every call into $DDP_FAKE_LOG; each container runs ($DDP_FAKE_GONE lists those that do not);
# the node's report of its jobs is $DDP_FAKE_JOBS/NODE (none without it); a stop answers as the node does.
DOCKER = r"""#!/bin/sh
printf '%s\n' "$*" >> "$DDP_FAKE_LOG"
case "$1" in
  inspect)
    case " ${DDP_FAKE_GONE:-} " in *" $4 "*) echo "Error: No such object: $4" >&2; exit 1 ;; esac
    echo true ;;
  exec)
    case "$5" in
      *--stop*) echo '{"busy": [], "jobs": {}}' ;;
      *) cat "$DDP_FAKE_JOBS/$2" 2>/dev/null || echo '{"busy": [], "jobs": {}}' ;;
    esac ;;
  *) exit 3 ;;
esac
"""


def report(*jobs: str) -> str:
    """A node's answer: ``jobs`` run there, each on both nodes."""
    return json.dumps({"busy": list(jobs), "jobs": {job: {"nodes": list(NODES)} for job in jobs}})


@pytest.fixture
def cluster(tmp_path: Path) -> dict[str, Path]:
    """An inventory of two local nodes (the local inventory's settings), their state with a job's checkpoint
    in each, the docker double, and where its answers and log are."""
    inventory = tmp_path / "inventory"
    shutil.copytree(REPO / "inventories" / "local" / "group_vars", inventory / "group_vars")
    state = tmp_path / "state"
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (inventory / "hosts.yml").write_text(
        json.dumps(
            {
                "nodes": {
                    "hosts": dict.fromkeys(NODES, host),
                    "vars": {
                        "cluster_name": "teardown-test",
                        "cluster_state_dir": str(state),
                        "cluster_network_name": "ddp-teardown-test",
                    },
                }
            }
        )
    )
    for node in NODES:
        checkpoint = (
            state / node / "workspace" / "jobs" / "job-a" / "output" / "checkpoints" / "epoch-00001.ckpt"
        )
        checkpoint.parent.mkdir(parents=True)
        checkpoint.write_bytes(b"weights")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(DOCKER)
    (bin_dir / "docker").chmod(0o755)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "home").mkdir()
    return {"inventory": inventory, "state": state, "bin": bin_dir, "jobs": tmp_path / "jobs",
            "log": tmp_path / "docker.log", "home": tmp_path / "home"}  # fmt: skip


def run(cluster: dict[str, Path], playbook: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = os.environ | {
        "PATH": f"{cluster['bin']}:{ANSIBLE_PLAYBOOK.parent}:{os.environ['PATH']}",
        "HOME": str(cluster["home"]),
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "DDP_FAKE_LOG": str(cluster["log"]),
        "DDP_FAKE_JOBS": str(cluster["jobs"]),
        **env,
    }
    return subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(cluster["inventory"] / "hosts.yml"), str(playbook), *args],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def teardown(cluster: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    return run(cluster, REPO / "playbooks" / "teardown.yml", *args)


def flat(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join((done.stdout + done.stderr).split())


def kept(cluster: dict[str, Path]) -> bool:
    return all(
        (cluster["state"] / node / "workspace" / "jobs" / "job-a" / "output" / "checkpoints").is_dir()
        for node in NODES
    )


def test_a_teardown_of_nodes_where_a_job_runs_is_refused_naming_it_and_removes_nothing(
    cluster: dict[str, Path],
) -> None:
    for node in NODES:
        (cluster["jobs"] / node).write_text(report("job-a"))
    for args in ((), ("--check",)):
        done = teardown(cluster, *args)
        said = flat(done)
        assert done.returncode != 0, said[-3000:]
        assert (
            "job job-a (nodes tdnode0, tdnode1) runs on tdnode0; job job-a (nodes tdnode0, tdnode1) runs on "
            "tdnode1. teardown.yml removes each node's container and its directory, the jobs' checkpoints "
            "included, so nothing was removed on any node." in said
        ), said[-3000:]
        assert "Stop the job first (`ansible-playbook jobs.yml -e stop=job-a`)" in said
        assert "-e force=true (make clean FORCE=true), which stops it first" in said
        assert "TASK [Remove" not in done.stdout, "a removal task ran after the refusal"
        assert kept(cluster)
    # Only the node's report was asked: no job stopped, nothing removed.
    calls = cluster["log"].read_text().splitlines()
    assert calls and not [
        call for call in calls if "--stop" in call or call.split()[0] not in ("inspect", "exec")
    ]


def test_one_busy_node_refuses_the_whole_teardown(cluster: dict[str, Path]) -> None:
    (cluster["jobs"] / "tdnode1").write_text(report("job-a", "job-b"))
    done = teardown(cluster)
    said = flat(done)
    assert done.returncode != 0
    assert "jobs job-a (nodes tdnode0, tdnode1), job-b (nodes tdnode0, tdnode1) run on tdnode1." in said, said
    assert "runs on tdnode0" not in said
    assert (
        "Stop the jobs first (`ansible-playbook jobs.yml -e stop=job-a`, then "
        "`ansible-playbook jobs.yml -e stop=job-b`)" in said
    )
    assert "TASK [Remove" not in done.stdout and kept(cluster)


def test_a_node_directory_that_holds_the_job_results_is_never_removed(cluster: dict[str, Path]) -> None:
    runs = cluster["state"] / "tdnode0" / "results" / "runs"
    runs.mkdir(parents=True)
    (runs / "job-a").mkdir()
    done = teardown(cluster, "-e", f"ddp_job_runs_dir={runs}")
    said = flat(done)
    assert done.returncode != 0
    assert (
        f"{cluster['state'] / 'tdnode0'} holds {runs}, the jobs' results on this controller, which "
        "teardown.yml never removes: nothing was removed." in said
    ), said[-3000:]
    # Refused before the node was even asked about its jobs.
    assert "TASK [Remove" not in done.stdout and kept(cluster) and (runs / "job-a").is_dir()
    assert not cluster["log"].exists()


def test_force_stops_each_job_as_jobs_yml_does_before_the_node_goes(
    cluster: dict[str, Path], tmp_path: Path
) -> None:
    """The role's step alone (teardown.yml's first; its removals reach Docker's engine)."""
    (cluster["jobs"] / "tdnode0").write_text(report("job-a"))
    playbook = tmp_path / "jobs.yml"
    playbook.write_text(
        "- hosts: nodes\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.import_role: {name: node_container, tasks_from: teardown.yml}\n"
        "    - ansible.builtin.debug: {var: __node_container_jobs.running}\n"
    )
    done = run(cluster, playbook, "-e", "force=true", DDP_FAKE_GONE="tdnode1")
    said = flat(done)
    assert done.returncode == 0, said[-3000:]
    assert "force=true: removing tdnode0 stops job job-a (nodes tdnode0, tdnode1)" in said
    stops = [call for call in cluster["log"].read_text().splitlines() if "--stop" in call]
    assert len(stops) == 1 and stops[0].startswith("exec tdnode0 /bin/bash -c "), stops
    assert (
        "--stop 'job-a' --reason 'stopped by teardown.yml -e force=true (it removed tdnode0)'" in stops[0]
    ), stops
    # tdnode1's container is gone: it runs no job, and was not asked.
    assert not [call for call in cluster["log"].read_text().splitlines() if call.startswith("exec tdnode1")]


def test_make_clean_passes_force_on() -> None:
    shown = subprocess.run(
        ["make", "--no-print-directory", "-n", "clean", "FORCE=true"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert shown.stdout.strip().splitlines()[-1] == "ansible-playbook playbooks/teardown.yml -e force=true"
    shown = subprocess.run(
        ["make", "--no-print-directory", "-n", "clean"], cwd=REPO, capture_output=True, text=True
    )
    assert shown.stdout.strip().splitlines()[-1].strip() == "ansible-playbook playbooks/teardown.yml"
