"""The requirement files we ship resolve against the bases users bring: Python 3.10 and 3.11 (CANN's images
ship both), numpy 1.24.0 kept from the base (CANN's), x86-64 and aarch64 (Atlas servers). pip resolves them
against the package index as the wheelhouse download does (binary wheels for that Python and platform),
without installing. torch and torch-npu are resolved without their dependencies: on x86-64 PyPI's torch is
the CUDA build, whose nvidia-* wheels a real Ascend site does not take (the example points
training_image_pip_args at PyTorch's CPU index); what is checked is that the pinned pair exists for each
Python and platform."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = [
    REPO / "docker/requirements.txt",
    REPO / "inventories/ascend-example/requirements-npu.txt",
    REPO / "inventories/gpu-example/requirements-gpu.txt",
]
TORCH = ("torch", "torch-npu")
CANN_NUMPY = "numpy==1.24.0"


def name_of(line: str) -> str:
    return line.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower()


def lines(path: Path) -> list[str]:
    found = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            found.append(line)
    return found


def resolve(requirements: list[str], python: str, machine: str, tmp: Path, deps: bool) -> dict[str, str]:
    """pip's resolution (name -> version) of requirements for that Python and platform, numpy held at
    1.24.0."""
    (tmp / "constraints.txt").write_text(CANN_NUMPY + "\n")
    report = tmp / f"report-{python}-{machine}-{deps}.json"
    platforms = [f"manylinux_2_{minor}_{machine}" for minor in (28, 17)] + [f"manylinux2014_{machine}"]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
         "--target", str(tmp / "target"), "--python-version", python, "--only-binary=:all:",
         *[arg for platform in platforms for arg in ("--platform", platform)],
         "--constraint", str(tmp / "constraints.txt"), "--report", str(report),
         *([] if deps else ["--no-deps"]), *requirements],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, f"{requirements} for Python {python} on {machine}:\n{done.stderr[-3000:]}"
    installed = json.loads(report.read_text())["install"]
    return {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in installed
    }


@pytest.mark.parametrize("python", ["3.10", "3.11"])
@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.name)
def test_a_shipped_requirements_file_resolves_on_a_cann_like_base(
    path: Path, python: str, machine: str, tmp_path: Path
) -> None:
    wanted = lines(path)
    rest = [line for line in wanted if name_of(line) not in TORCH]
    resolved = resolve(rest, python, machine, tmp_path, deps=True)
    assert resolved["numpy"] == "1.24.0"
    assert "scikit-learn" not in resolved
    pinned = [line for line in wanted if name_of(line) in TORCH]
    if pinned:
        pair = resolve(pinned, python, machine, tmp_path, deps=False)
        for line in pinned:
            name, _, version = line.partition("==")
            assert pair[name.strip()].split("+")[0] == version.strip(), (line, pair)
