"""A job submitted to Slurm, seen from the controller (ddp_cluster.job.control) and from the node Slurm starts
it on (ddp_cluster.supervisor.allocation): the submit command, the wait in the queue (its place and reason,
Ctrl-C, detach, the bound), the nodes Slurm gave (followed to the first when it is another node), driven
through a fake transport whose squeue answers change as the test says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_control import Clock

from ddp_cluster.job import control, queue
from ddp_cluster.job.control import JobControl
from ddp_cluster.job.spec import JobSpec
from ddp_cluster.job.status import Status
from ddp_cluster.job.transport import Done
from ddp_cluster.supervisor import allocation

QUEUED = "7|J1|PENDING|Resources|2||100|2026-12-06T03:00:05|root|n/a|me@ctl\n"
AHEAD = "6|other|PENDING|Priority|2||200|2026-12-06T03:00:01|root|n/a|x@ctl\n"
RUNS_HERE = "7|J1|RUNNING|None|3|node[0-2]|100|2026-12-06T03:00:05|root|node0|me@ctl\n"
RUNS_THERE = "7|J1|RUNNING|None|2|node[1-2]|100|2026-12-06T03:00:05|root|node2|me@ctl\n"
DONE = Status(state="succeeded", updated=2.0, elapsed=9.0, rc=0, supervisor_node="node0", start_id="s1")


class FakeSlurmNode:
    """The submitting node's server: sbatch answers job 7; each squeue answers the next of ``queue`` (the
    last stays); the status read answers ``status`` once the job runs here."""

    def __init__(self, answers: list[str], status: Status | None = DONE) -> None:
        self.answers = list(answers)
        self.status = status
        self.commands: list[str] = []

    def run(self, command: str) -> Done:
        self.commands.append(command)
        if "sbatch" in command:
            return Done(0, f"{control.SUBMITTED}7\n")
        if "squeue" in command:
            return Done(0, self.answers.pop(0) if len(self.answers) > 1 else self.answers[0])
        if command.startswith("python3 -c ") and self.status is not None:
            return Done(0, self.status.dumps())
        return Done(0, "")

    def put(self, local: str) -> str:
        return f"/tmp/ansible-tmp/{Path(local).name}"

    def close(self) -> None:
        pass


def plan(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    run_dir = tmp_path / "runs" / "J1"
    run_dir.mkdir(parents=True, exist_ok=True)
    made = {
        "id": "J1",
        "label": "job",
        "kind": "train",
        "first": "node0",
        "nodes": ["node0", "node1"],
        "spares": ["node2"],
        "host_dirs": {node: f"/srv/{node}/jobs/J1" for node in ("node0", "node1", "node2")},
        "job_dir": "/workspace/jobs/J1",
        "run_dir": str(run_dir),
        "bundle": str(run_dir / "job.tar.gz"),
        "timeout": 600,
        "poll": 2,
        "spec": {"start_id": "s1"},
        "slurm": {"nodes": 2, "spares": 1, "nodelist": [], "exclude": ["node3"], "queue_timeout": 60},
        **changes,
    }
    (run_dir / "plan.json").write_text(json.dumps(made))
    return {**made, "plan_path": str(run_dir / "plan.json")}


def follow(
    tmp_path: Path, node: FakeSlurmNode, interrupt: Path, **changes: Any
) -> tuple[dict[str, Any], list[str], JobControl]:
    said: list[str] = []
    clock = Clock()
    job = JobControl(plan(tmp_path, **changes), "node0", node, said.append, interrupt, clock, clock.sleep)
    return job.run(), said, job


def test_the_submit_stages_the_files_and_asks_slurm_for_whole_nodes_with_spares_and_the_selection(
    tmp_path: Path,
) -> None:
    command = control.submit_command(plan(tmp_path), "node0", "/tmp/b.tgz", comment="me@ctl")
    assert "/workspace/jobs/.staged/J1" in command and "being submitted already" in command
    assert "--nodes=2-3" in command and "--exclude=node3" in command and "--comment=me@ctl" in command
    assert "--no-kill" in command and "--no-requeue" in command
    assert "--time=0-00:13:00" in command  # job_timeout, then the controller's own grace and stop wait
    assert (
        "DDP_SUBMITTED_ON=node0 exec python -m ddp_cluster.supervise --job-dir /workspace/jobs/J1" in command
    )
    assert "--job-dir /workspace/jobs/J1\n" in queue.batch_script("/workspace/jobs/J1", "node0")


def test_a_queued_job_says_its_place_and_reason_then_runs_here_and_is_followed(
    tmp_path: Path,
) -> None:
    node = FakeSlurmNode([QUEUED + AHEAD, QUEUED + AHEAD, RUNS_HERE])
    result, said, _ = follow(tmp_path, node, tmp_path / "interrupt")
    assert "job J1: submitted to Slurm as job 7" in said
    assert said.count("job J1: queued as Slurm job 7, 2 of 2 waiting: waiting for nodes that other jobs hold"
                      " (Resources)") == 1  # fmt: skip
    assert "job J1: Slurm job 7 runs on node0, node1" in said
    assert result["state"] == "succeeded" and result["allocation"] == {"nodes": ["node0", "node1"],
                                                                        "spares": ["node2"]}  # fmt: skip
    kept = json.loads((tmp_path / "runs" / "J1" / "plan.json").read_text())
    assert (kept["slurm_id"], kept["first"], kept["nodes"], kept["allocated"]) == (
        "7", "node0", ["node0", "node1"], True
    )  # fmt: skip


def test_a_job_slurm_starts_on_another_node_is_followed_there(tmp_path: Path) -> None:
    result, said, _ = follow(tmp_path, FakeSlurmNode([RUNS_THERE]), tmp_path / "interrupt")
    assert result["moved"] == "node2"
    assert result["allocation"] == {"nodes": ["node2", "node1"], "spares": []}
    assert "job J1: Slurm job 7 runs on node2, node1" in said


def test_ctrl_c_on_a_queued_job_cancels_it_in_slurm_and_removes_what_was_staged(tmp_path: Path) -> None:
    interrupt = tmp_path / "interrupt"
    node = FakeSlurmNode([QUEUED])
    original = node.run

    def pressed(command: str) -> Done:
        if "squeue" in command:
            interrupt.write_text("")
        return original(command)

    node.run = pressed  # type: ignore[method-assign]
    result, _, _ = follow(tmp_path, node, interrupt)
    assert any("scancel 7" in command for command in node.commands)
    assert any("rm -rf /workspace/jobs/.staged/J1" in command for command in node.commands)
    assert result["state"] == "failed" and "cancelled in Slurm's queue (Ctrl-C" in result["status"]["reason"]


def test_detach_returns_once_queued_and_the_bound_leaves_the_job_queued(tmp_path: Path) -> None:
    result, said, _ = follow(tmp_path, FakeSlurmNode([QUEUED]), tmp_path / "interrupt", detach=True)
    assert result["detached"] and result["state"] == "queued"
    assert any("it stays queued as Slurm job 7" in line for line in said)
    result, said, _ = follow(tmp_path, FakeSlurmNode([QUEUED]), tmp_path / "i2")
    assert result["detached"] and any("still queued after 60 s" in line for line in said)


def test_a_job_cancelled_in_slurm_before_it_ran_fails_naming_it(tmp_path: Path) -> None:
    gone = "7|J1|CANCELLED|None|2||100|2026-12-06T03:00:05|root|n/a|me@ctl\n"
    result, _, _ = follow(tmp_path, FakeSlurmNode([QUEUED, gone]), tmp_path / "interrupt")
    assert result["state"] == "failed"
    assert "Slurm job 7 ended (CANCELLED) before it was given nodes" in result["status"]["reason"]


def spec(**changes: Any) -> JobSpec:
    return JobSpec.from_dict(
        {
            "id": "J1",
            "job_dir": "/workspace/jobs/J1",
            "nodes": ["node0", "node1"],
            "nproc_per_node": 1,
            "launcher": "mpirun",
            "device": "cpu",
            "networks": ["10.0.0.0/24"],
            "timeout": 60,
            **changes,
        }
    )


def test_the_node_slurm_starts_it_on_is_its_first_and_the_rest_of_the_allocation_its_spares() -> None:
    nodes = allocation.allocated("node[1-3]", "node2")
    assert nodes == ["node2", "node1", "node3"]
    placed = allocation.assign(spec(max_restarts=1), nodes)
    assert placed.nodes == ("node2", "node1") and placed.spares == ("node3",)
    assert allocation.assign(spec(), nodes).spares == ()  # no restart: no spare
    with pytest.raises(allocation.AllocationError, match="Slurm gave 1 node"):
        allocation.assign(spec(), ["node2"])
    with pytest.raises(allocation.AllocationError, match="not in the job's allocation"):
        allocation.allocated("node[0-1]", "node2")


def test_the_supervisor_forgets_the_batch_steps_slurm_variables_so_mpirun_launches_over_ssh() -> None:
    environ = {"SLURM_JOB_ID": "7", "SLURM_NODELIST": "node[0-1]", "SBATCH_X": "1", "PATH": "/bin"}
    allocation.forget_slurm(environ)
    assert environ == {"DDP_SLURM_JOB_ID": "7", "PATH": "/bin"}


def test_a_link_planted_in_place_of_the_jobs_directory_refuses_the_submit(tmp_path: Path) -> None:
    command = control.submit_command(plan(tmp_path), "node0", "/tmp/b.tgz", comment="me@ctl")
    assert "if [ -L /workspace/jobs/J1 ]" in command
    assert "/workspace/jobs/J1 in node node0 is a symbolic link (to " in command


def test_a_link_in_place_of_the_jobs_directory_in_the_allocation_is_refused(tmp_path: Path) -> None:
    job_dir = tmp_path / "jobs" / "J1"
    job_dir.parent.mkdir()
    job_dir.symlink_to(tmp_path / "elsewhere")
    staged = queue.staged_dir(job_dir)
    staged.mkdir(parents=True)
    with pytest.raises(allocation.AllocationError, match="is a symbolic link"):
        allocation.take_files(job_dir, "node0", allocation.Mesh("node0"))
    assert staged.is_dir() and not (tmp_path / "elsewhere").exists()


def test_a_lost_node_is_given_back_to_slurm_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddp_cluster.supervisor import recovery

    asked: list[list[str]] = []

    def run(argv: list[str], **_: Any) -> Any:
        asked.append(argv)
        return type("Done", (), {"returncode": 0})()

    job = spec(nodes=["node0", "node1"], spares=["node2"], max_restarts=1)
    monkeypatch.setenv("DDP_SLURM_JOB_ID", "7")
    assert recovery.give_back_to_slurm(job, {"node1"}, run) == ["node1"]
    assert asked[-1][3] == "nodelist=node0,node2"
    assert asked[-1][:3] == ["scontrol", "update", "jobid=7"] and "node1" not in asked[-1][3]
    monkeypatch.delenv("DDP_SLURM_JOB_ID")
    assert recovery.give_back_to_slurm(job, {"node1"}, run) == [] and len(asked) == 1


def test_a_job_taken_over_by_its_standby_is_ended_in_slurm_by_its_name() -> None:
    asked: list[list[str]] = []

    def run(argv: list[str], **_: Any) -> Any:
        asked.append(argv)
        return type("Done", (), {"returncode": 0})()

    def hangs(argv: list[str], **_: Any) -> Any:
        raise allocation.subprocess.TimeoutExpired(argv, 10)

    started: list[list[str]] = []
    assert allocation.end_in_slurm("J1", run, lambda argv, **_: started.append(argv)) is True
    assert asked == [["scancel", "--quiet", "--name=J1"]] and started == []
    # Slurm does not answer (its controller was lost with the first node): asked again, detached
    assert allocation.end_in_slurm("J1", hangs, lambda argv, **_: started.append(argv)) is False
    [again] = started
    assert "scancel --quiet --name=J1 && exit 0" in again[-1] and "sleep 5" in again[-1]
