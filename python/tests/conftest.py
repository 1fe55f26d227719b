"""Shared fixtures: a clean launcher environment, and a launcher of real multi-process training runs."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

LAUNCHER_PREFIXES = ("OMPI_", "SLURM_", "PMI_", "PMIX_")
LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def clean_environ() -> dict[str, str]:
    """os.environ without any launcher variable (the test runner itself may run under one), one thread."""
    env = {
        k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)
    }
    env["OMP_NUM_THREADS"] = "1"  # two cores here: one thread per rank keeps runs fast and comparable
    return env


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """For in-process runs: no launcher variables, so the process is a world of one."""
    for name in list(os.environ):
        if name in LAUNCHER_VARS or name.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(name)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rank_environ(style: str, rank: int, world: int, port: int) -> dict[str, str]:
    """What a launcher of ``style`` (torchrun or openmpi) gives rank ``rank`` of a one-node world."""
    env = clean_environ()
    if style == "torchrun":
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    elif style == "openmpi":
        env.update(
            OMPI_COMM_WORLD_RANK=str(rank),
            OMPI_COMM_WORLD_SIZE=str(world),
            OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
            OMPI_COMM_WORLD_LOCAL_SIZE=str(world),
        )
    else:
        raise ValueError(style)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return env


@dataclass
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str


@dataclass
class Run:
    output_dir: Path
    ranks: list[RankResult]

    @property
    def ok(self) -> bool:
        return all(r.returncode == 0 for r in self.ranks)

    def summary(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.output_dir / "summary.json").read_text())
        return data

    def explain(self) -> str:
        return "\n".join(f"--- rank {r.rank} rc={r.returncode}\n{r.stdout}\n{r.stderr}" for r in self.ranks)


def launch_training(
    args: Sequence[str], output_dir: Path, nproc: int, style: str = "torchrun", timeout: float = 120
) -> Run:
    """Start ``nproc`` processes of ``python -m ddp_cluster.train`` on this host, as a launcher would."""
    port = free_port()
    logs = output_dir.parent / f"{output_dir.name}-logs-{time.monotonic_ns()}"
    logs.mkdir(parents=True)
    procs = []
    for rank in range(nproc):
        out = open(logs / f"rank{rank}.out", "w")  # noqa: SIM115 (closed below)
        err = open(logs / f"rank{rank}.err", "w")  # noqa: SIM115
        command = [sys.executable, "-m", "ddp_cluster.train", "--output-dir", str(output_dir), *args]
        env = rank_environ(style, rank, nproc, port)
        procs.append((subprocess.Popen(command, stdout=out, stderr=err, env=env), out, err))
    deadline = time.monotonic() + timeout
    try:
        for proc, _, _ in procs:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for proc, _, _ in procs:
            proc.kill()
        pytest.fail(f"training {list(args)} on {nproc} processes did not finish within {timeout}s")
    finally:
        for proc, out, err in procs:
            proc.wait()
            out.close()
            err.close()
    ranks = [
        RankResult(
            rank,
            proc.returncode,
            (logs / f"rank{rank}.out").read_text(),
            (logs / f"rank{rank}.err").read_text(),
        )
        for rank, (proc, _, _) in enumerate(procs)
    ]
    return Run(output_dir, ranks)


@pytest.fixture(scope="session")
def launch() -> Iterator[Any]:
    """``launch(args, output_dir, nproc, style="torchrun", timeout=120) -> Run``"""
    yield launch_training


@pytest.fixture
def base_environ() -> dict[str, str]:
    """An environment for subprocesses: this one without launcher variables, one thread per process."""
    return clean_environ()


# The tiers (markers registered in pyproject.toml): every test here needs no container; those that need torch
# are marked `torch` (a whole file, or single tests where the rest of their file needs none), so that
# `pytest -m "not torch"` (make check) runs the rest on a controller without it.
TORCH_FILES = {
    "test_checkpoint.py",
    "test_data.py",
    "test_device.py",
    "test_gate.py",
    "test_gate_settings.py",
    "test_train.py",
    "test_train_ddp.py",
}
TORCH_TESTS = {
    "test_baseimage.py::test_the_probe_reads_its_own_interpreter_and_the_kept_closure",
    "test_cliargs.py::test_train_options_have_the_config_defaults",
    "test_cliargs.py::test_the_jobs_default_arguments_are_options_of_the_entrypoint",
    "test_run.py::test_unmodified_torchrun_script_runs_under_openmpi_variables",
    "test_run.py::test_a_rank_that_cannot_use_the_jobs_accelerator_stops_naming_node_rank_and_reason",
}


def torch_installed() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except ImportError:  # a finder that refuses torch (tests/unit/test_controller_setup.py's)
        return False


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    # These files import torch at their top: without it they cannot even be collected to be deselected.
    if collection_path.name in TORCH_FILES and not torch_installed():
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.unit)
        name = getattr(item, "originalname", item.name)
        if item.path.name in TORCH_FILES or f"{item.path.name}::{name}" in TORCH_TESTS:
            item.add_marker(pytest.mark.torch)
