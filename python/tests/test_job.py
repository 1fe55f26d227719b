"""The job's spec (ddp_cluster.job.spec): checked in one place with errors naming the field, and every
artifact it
implies (launcher argv, hostfile, program, log paths) from it; job.json round-trips."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.job import spec as job
from ddp_cluster.job.spec import JobSpec, JobSpecError

BASE: dict[str, Any] = {
    "id": "j1",
    "job_dir": "/workspace/jobs/j1",
    "nodes": ["node0", "node1"],
    "nproc_per_node": 2,
    "launcher": "mpirun",
    "device": "cpu",
    "networks": ["10.0.0.0/24"],
    "timeout": 600,
}


def make(**changes: Any) -> JobSpec:
    return JobSpec.from_dict(BASE | changes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"nodes": []}, "nodes=[] must list at least one"),
        ({"nodes": ["node0", "node0"]}, "names a node twice"),
        ({"nproc_per_node": 0}, "nproc_per_node=0 must be at least 1"),
        ({"nproc_per_node": "two"}, "nproc_per_node='two' must be a whole number"),
        ({"nproc_per_node": 1.5}, "nproc_per_node=1.5 must be a whole number"),
        ({"launcher": "deepspeed"}, "launcher='deepspeed' is unknown"),
        ({"launcher": "torch_npu_run"}, "torch_npu_run needs torch_npu"),
        ({"device": "gpu"}, "device='gpu' is unknown"),
        ({"timeout": 0}, "timeout=0 must be above 0"),
        ({"master_port": 70000}, "master_port=70000 must be at least 1 and at most 65535"),
        ({"id": "a b"}, "id='a b' is not a job id"),
        ({"job_dir": "jobs/j1"}, "job_dir='jobs/j1' must be an absolute path"),
        ({"workdir": True}, "workdir is set but script is empty"),
        ({"resume": "maybe"}, "resume='maybe' must be true or false"),
        ({"env": {"1BAD": "x"}}, "env: '1BAD' is not a variable name"),
        ({"launcher_ports": "29510:29519"}, "launcher_ports='29510:29519' must be a port or a range"),
        ({"colour": "red"}, "unknown field(s) colour"),
    ],
)
def test_a_bad_field_is_named(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(
        JobSpecError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        make(**changes)


def test_a_missing_field_is_named() -> None:
    fields = dict(BASE)
    del fields["timeout"]
    with pytest.raises(JobSpecError, match="timeout is missing"):
        JobSpec.from_dict(fields)


def test_job_json_round_trips(tmp_path: Path) -> None:
    spec = make(env={"NCCL_DEBUG": "INFO"}, script_args=["--lr", "0.1"], resume=True)
    (tmp_path / "job.json").write_text(spec.dumps())
    assert job.load(tmp_path / "job.json") == spec
    (tmp_path / "job.json").write_text("{")
    with pytest.raises(JobSpecError, match="cannot read the job from"):
        job.load(tmp_path / "job.json")


def test_what_the_spec_implies() -> None:
    spec = make()
    assert spec.world_size == 4 and not spec.agents and spec.processes_per_node == 2
    assert [spec.node_of_process(process) for process in range(5)] == [
        "node0",
        "node0",
        "node1",
        "node1",
        None,
    ]
    assert spec.hostfile().splitlines()[1:] == ["node0 slots=2", "node1 slots=2"]
    assert spec.mpirun_log(3) == Path("/workspace/jobs/j1/logs/1/rank.3/stdout")
    torchrun = make(launcher="torchrun")
    assert torchrun.agents and torchrun.processes_per_node == 1 and torchrun.node_of_process(1) == "node1"


@pytest.mark.parametrize(
    ("changes", "program"),
    [
        ({}, ["-m", "ddp_cluster.train", "--output-dir", "/workspace/jobs/j1/output"]),
        (
            {"resume": True, "script_args": ["--epochs", "9"]},
            [
                "-m",
                "ddp_cluster.train",
                "--output-dir",
                "/workspace/jobs/j1/output",
                "--resume",
                "--epochs",
                "9",
            ],
        ),
        (
            {"script": "/home/u/train_me.py"},
            ["-m", "ddp_cluster.run", "/workspace/jobs/j1/train_me.py"],
        ),
        (
            {"script": "src/train.py", "workdir": True},
            ["-m", "ddp_cluster.run", "/workspace/jobs/j1/workdir/src/train.py"],
        ),
        (
            {"kind": "check", "script_args": ["--fraction", "0.5"]},
            [
                "-m",
                "ddp_cluster.gate",
                "--output-dir",
                "/workspace/jobs/j1/output",
                "--fraction",
                "0.5",
            ],
        ),
    ],
)
def test_the_program_every_rank_runs(changes: dict[str, Any], program: list[str]) -> None:
    spec = make(**changes)
    assert spec.program() == program
    assert spec.launch_argv()[-len(program) :] == program


def test_no_network_no_launch() -> None:
    with pytest.raises(JobSpecError, match="no cluster network"):
        make(networks=[]).launch_argv()


def test_the_stop_grace_is_bounded_by_slurms_kill_wait() -> None:
    assert make(stop_grace=25).stop_grace == 25
    for wrong in (0, 26):
        with pytest.raises(JobSpecError, match="stop_grace"):
            make(stop_grace=wrong)
