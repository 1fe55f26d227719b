"""``python -m ddp_cluster.run``: an unmodified torchrun-style script gets torchrun variables under mpirun."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SHOW_ENV = textwrap.dedent(
    """
    import json, os, sys
    names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"]
    names += ["MASTER_ADDR", "MASTER_PORT"]
    print(json.dumps({
        "env": {n: os.environ.get(n) for n in names},
        "argv": sys.argv,
        "name": __name__,
        "path0": sys.path[0],
    }))
    import helper  # a module beside the script, found as under `python script.py`
    sys.exit(int(os.environ.get("EXIT_WITH", "0")))
    """
)

# What a torchrun user writes: no knowledge of OpenMPI at all.
TORCHRUN_SCRIPT = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    value = torch.tensor([float(os.environ["RANK"]) + 1.0])
    dist.all_reduce(value)
    local = os.environ["LOCAL_RANK"]
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} local {local} sum {value.item()}")
    dist.barrier()
    dist.destroy_process_group()
    """
)


def ompi(rank: int, world: int, local_rank: int, local_world: int) -> dict[str, str]:
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(world),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_world),
    }


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "scripts" / "show_env.py"
    path.parent.mkdir()
    path.write_text(SHOW_ENV)
    (path.parent / "helper.py").write_text("")
    return path


def run_module(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddp_cluster.run", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_openmpi_variables_become_torchrun_variables(script: Path, base_environ: dict[str, str]) -> None:
    env = base_environ | ompi(5, 8, 1, 4) | {"MASTER_ADDR": "node1"}
    result = run_module([str(script), "--epochs", "3", "--flag"], env, script.parent.parent)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["env"] == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "node1",
        "MASTER_PORT": "29501",
    }
    assert shown["argv"] == [str(script), "--epochs", "3", "--flag"]
    assert shown["name"] == "__main__"
    assert shown["path0"] == str(script.parent)


def test_slurm_variables_become_torchrun_variables(script: Path, base_environ: dict[str, str]) -> None:
    slurm = {
        "SLURM_PROCID": "2",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NODELIST": "trn[3-4]",
        "MASTER_PORT": "29777",
    }
    result = run_module([str(script)], base_environ | slurm, script.parent)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["env"] == {
        "RANK": "2",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "trn3",
        "MASTER_PORT": "29777",
    }


def test_module_form_and_exit_status(script: Path, base_environ: dict[str, str]) -> None:
    env = base_environ | {"PYTHONPATH": str(script.parent), "EXIT_WITH": "3"}
    result = run_module(["-m", "show_env", "x"], env, script.parent.parent)
    assert result.returncode == 3, result.stderr  # the script's own exit status comes through
    shown = json.loads(result.stdout)
    assert shown["argv"][1:] == ["x"] and shown["name"] == "__main__"
    assert shown["env"]["WORLD_SIZE"] == "1" and shown["env"]["MASTER_ADDR"] == "127.0.0.1"


def test_bad_environment_stops_before_the_script(script: Path, base_environ: dict[str, str]) -> None:
    env = base_environ | ompi(1, 2, 1, 2)  # no MASTER_ADDR under mpirun
    result = run_module([str(script)], env, script.parent)
    assert result.returncode == 2
    assert "MASTER_ADDR is not set" in result.stderr and "-x MASTER_ADDR" in result.stderr
    assert result.stdout == ""  # the script never ran


def test_missing_script_is_named(tmp_path: Path, base_environ: dict[str, str]) -> None:
    result = run_module(["nowhere.py"], base_environ, tmp_path)
    assert result.returncode == 2 and "script 'nowhere.py' not found" in result.stderr


def test_in_process_export(monkeypatch: pytest.MonkeyPatch, no_launcher: None) -> None:
    from ddp_cluster.runtime.run import export_torchrun_variables

    for name, value in (ompi(3, 4, 1, 2) | {"MASTER_ADDR": "h0", "MASTER_PORT": "2000"}).items():
        monkeypatch.setenv(name, value)
    exported = export_torchrun_variables()
    assert exported["RANK"] == os.environ["RANK"] == "3"
    assert os.environ["LOCAL_WORLD_SIZE"] == "2" and os.environ["MASTER_PORT"] == "2000"


def test_unmodified_torchrun_script_runs_under_openmpi_variables(
    tmp_path: Path, base_environ: dict[str, str]
) -> None:
    script = tmp_path / "torchrun_style.py"
    script.write_text(TORCHRUN_SCRIPT)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "ddp_cluster.run", str(script)],
            env=base_environ
            | ompi(rank, 2, rank, 2)
            | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err
            outputs.append(out.strip())
    finally:
        for proc in procs:
            proc.kill()
    assert outputs == ["rank 0 of 2 local 0 sum 3.0", "rank 1 of 2 local 1 sum 3.0"]


def test_a_rank_that_cannot_use_the_jobs_accelerator_stops_naming_node_rank_and_reason(
    script: Path, base_environ: dict[str, str]
) -> None:
    # No torch_npu here: a job on an npu cluster must fail, not train on cpu.
    env = (
        base_environ
        | ompi(1, 2, 1, 2)
        | {"MASTER_ADDR": "node0", "DDP_DEVICE": "npu", "DDP_NODE_NAME": "node7"}
    )
    result = run_module([str(script)], env, script.parent.parent)
    assert result.returncode == 2
    assert (
        "node node7 rank 1/2: the job's device is npu (DDP_DEVICE) but device npu needs torch_npu"
        in result.stderr
    )
    assert result.stdout == ""  # the script never ran


def test_cpu_asked_on_purpose_runs_the_script(script: Path, base_environ: dict[str, str]) -> None:
    env = base_environ | ompi(0, 1, 0, 1) | {"DDP_DEVICE": "cpu"}
    result = run_module([str(script)], env, script.parent.parent)
    assert result.returncode == 0, result.stderr


ENDINGS = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from pathlib import Path

    out = Path(sys.argv[1])

    class Finalized:
        def __del__(self):
            out.joinpath("finalized").write_text("yes")

    KEPT = Finalized()  # a module global: only the interpreter's finalization would delete it
    atexit.register(lambda: out.joinpath("atexit").write_text("yes"))

    def late_writer():
        time.sleep(0.5)
        out.joinpath("thread").write_text("yes")

    threading.Thread(target=late_writer).start()  # non-daemon: a normal exit waits for it
    print("script done")
    how = sys.argv[2]
    if how == "raise":
        raise ValueError("the script's own error")
    if how == "message":
        sys.exit("stopped: bad input")
    if how == "code":
        sys.exit(4)
    """
)


@pytest.mark.parametrize(
    ("how", "status", "stderr_has"),
    [
        ("return", 0, ""),
        ("code", 4, ""),
        ("message", 1, "stopped: bad input"),
        ("raise", 1, "ValueError: the script's own error"),
    ],
)
def test_a_script_ends_as_under_python_without_the_interpreters_teardown(
    tmp_path: Path, base_environ: dict[str, str], how: str, status: int, stderr_has: str
) -> None:
    # Under torch 2.13 and gloo a finished rank could die of SIGABRT in the interpreter's finalization (see
    # ddp_cluster.runtime.finish): the script's status, threads, atexit handlers and output are what `python
    # SCRIPT`
    # gives, but module globals are not torn down.
    script = tmp_path / "endings.py"
    script.write_text(ENDINGS)
    result = run_module([str(script), str(tmp_path), how], base_environ, tmp_path)
    assert result.returncode == status, result.stderr
    assert result.stdout == "script done\n"
    assert stderr_has in result.stderr
    if how == "raise":
        assert "Traceback (most recent call last)" in result.stderr
    assert (tmp_path / "thread").read_text() == "yes"  # the non-daemon thread finished first
    assert (tmp_path / "atexit").read_text() == "yes"
    assert not (tmp_path / "finalized").exists()  # no finalization of the interpreter
