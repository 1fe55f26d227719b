"""Without torch (the controller's virtualenv): the package, the CLI, plot and run still work.

Each check runs in a subprocess whose ``sitecustomize`` puts a finder at the head of ``sys.meta_path`` that
refuses torch (and the other training-only packages), as if they were not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BLOCKER = textwrap.dedent(
    """
    import importlib.abc
    import sys

    BLOCKED = {"torch", "torch_npu", "sklearn", "scipy"}

    class NoTrainingPackages(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, NoTrainingPackages())
    """
)


@pytest.fixture
def no_torch_env(tmp_path: Path, base_environ: dict[str, str]) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    return base_environ | {"PYTHONPATH": str(site)}


def python(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_the_blocker_blocks(no_torch_env: dict[str, str], tmp_path: Path) -> None:
    result = python(["-c", "import torch"], no_torch_env, tmp_path)
    assert result.returncode == 1 and "blocked by the test" in result.stderr


def test_package_and_cli_modules_import_without_torch(no_torch_env: dict[str, str], tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import importlib, json, sys
        import ddp_cluster, ddp_cluster.cli
        names = [
            "ddp_cluster.runtime.distenv",
            "ddp_cluster.runtime.run",
            "ddp_cluster.job.plot",
            "ddp_cluster.errors",
            "ddp_cluster.checkpoint",
            "ddp_cluster.text",
            "ddp_cluster.files",
            "ddp_cluster.runtime.metrics",
        ]
        names += [module for module, _ in ddp_cluster.cli.SUBCOMMANDS.values()]
        for name in names:
            importlib.import_module(name)
        print(json.dumps({"imported": names, "torch": "torch" in sys.modules}))
        """
    )
    result = python(["-c", code], no_torch_env, tmp_path)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert "ddp_cluster.job.plot" in shown["imported"] and shown["torch"] is False


def test_cli_help_and_plot_without_torch(no_torch_env: dict[str, str], tmp_path: Path) -> None:
    rows = [{"kind": "step", "epoch": 1, "step": s, "loss": 1.0 / s} for s in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli = ["-c", "import sys; from ddp_cluster.cli import main; sys.exit(main(sys.argv[1:]))"]
    assert "plot" in python([*cli, "--help"], no_torch_env, tmp_path).stdout
    result = python([*cli, "plot", str(tmp_path)], no_torch_env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_run_without_torch(no_torch_env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text(
        "import os, sys; print(os.environ['RANK'], os.environ['WORLD_SIZE'], 'torch' in sys.modules)"
    )
    env = no_torch_env | {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "MASTER_ADDR": "node1",
    }
    result = python(["-m", "ddp_cluster.run", str(script)], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "2", "False"]


def test_train_help_without_torch_lists_the_options_in_plain_words(
    no_torch_env: dict[str, str], tmp_path: Path
) -> None:
    result = python(["-m", "ddp_cluster.train", "--help"], no_torch_env, tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "--dataset {digits,synthetic,mnist,cifar10}" in result.stdout
    assert "--device {auto,cpu,cuda,npu}" in result.stdout and "The DDP training entrypoint" in result.stdout
    assert ":mod:" not in result.stdout and "``" not in result.stdout


def test_the_training_entrypoint_without_torch_says_what_it_needs_in_one_line(
    no_torch_env: dict[str, str], tmp_path: Path
) -> None:
    for argv in (["--epochs", "1"], ["--output-dir", "x"]):
        result = python(["-m", "ddp_cluster.train", *argv], no_torch_env, tmp_path)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert "needs torch and numpy" in result.stderr
        assert "pip install 'ddp-cluster[train]'" in result.stderr
