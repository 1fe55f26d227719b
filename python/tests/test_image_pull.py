"""The user's base image found, pulled or refused on the engine that builds (ddp_cluster.image.pull): the
decision with a fake engine, and both engines against a docker CLI double that answers as ``docker pull`` does
without a terminal (this controller's directly, a build server's through a local shell). The action plugin
through Ansible: tests/unit/test_image_pull_remote.py; against a real registry: tests/test_base_images.py."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.image import pull
from ddp_cluster.image.pull import Here, Layers, Pulled, There, find_or_pull

DOCKER = r"""#!/bin/sh
state="$DDP_FAKE_DOCKER_STATE"
case "$1 $2" in
  "image inspect") [ -e "$state/present-$(echo "$3" | tr '/:' '__')" ]; exit $? ;;
esac
[ "$1" = pull ] || exit 2
name=$2
echo "${name##*:}: Pulling from ${name%:*}"
case "$name" in
  *missing*) echo "Error response from daemon: manifest for $name not found: manifest unknown"; exit 1 ;;
  *slow*) echo "0123456789ab: Pulling fs layer"; sleep 30; exit 0 ;;
esac
echo "0123456789ab: Pulling fs layer"
echo "fedcba987654: Already exists"
sleep 0.6
echo "0123456789ab: Download complete"
printf '0123456789ab: Pull'
sleep 0.3
echo ' complete'
touch "$state/present-$(echo "$name" | tr '/:' '__')"
"""


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The docker CLI double first on PATH; yields its state folder (one file per image present)."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "docker").write_text(DOCKER)
    (tmp_path / "bin" / "docker").chmod(0o755)
    (tmp_path / "state").mkdir()
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{Path('/usr/bin')}:{Path('/bin')}")
    monkeypatch.setenv("DDP_FAKE_DOCKER_STATE", str(tmp_path / "state"))
    yield tmp_path / "state"


# The files the build server's pulls wrote their output to (each must be gone at the end).
LOGS: list[str] = []


def local_shell(command: str) -> Mapping[str, Any]:
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    LOGS.extend(word for word in done.stdout.split() if word.startswith(pull.REMOTE_LOG))
    return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


class FakeEngine:
    def __init__(self, present: bool, pulled: Pulled, arrives: bool) -> None:
        self.there, self.pulled, self.arrives, self.pulls = present, pulled, arrives, 0

    def present(self, name: str) -> bool:
        return self.there

    def pull(self, name: str, timeout: int, every: float, layers: Layers, show: Callable[[], None]) -> Pulled:
        self.pulls += 1
        layers.read("0123456789ab: Pull complete")
        show()
        self.there = self.arrives
        return self.pulled


def decide(engine: FakeEngine, said: list[str], **given: Any) -> dict[str, Any]:
    options: dict[str, Any] = {"timeout": 60, "every": 1.0, "pull": True, "check_mode": False, "where": ""}
    return find_or_pull(engine, "nvcr.io/nvidia/pytorch:26.10-py3", say=said.append, **(options | given))


def test_a_present_base_is_used_an_absent_one_is_only_looked_for_or_said_in_check_mode() -> None:
    said: list[str] = []
    ok = Pulled(0, (), False)
    assert decide(FakeEngine(True, ok, True), said) == {
        "changed": False, "present": True, "msg": "nvcr.io/nvidia/pytorch:26.10-py3 is present"
    }  # fmt: skip
    project = FakeEngine(False, ok, True)
    assert decide(project, said, pull=False)["msg"].endswith("is not present") and project.pulls == 0
    checked = FakeEngine(False, ok, True)
    assert decide(checked, said, check_mode=True)["changed"] and checked.pulls == 0
    assert said == []


def test_a_pull_says_what_it_does_and_how_long_it_took() -> None:
    said: list[str] = []
    result = decide(FakeEngine(False, Pulled(0, (), False), True), said, where="srv0 (the build server)")
    assert result["changed"] and result["pulled"] and result["seconds"] >= 0
    assert said[0] == (
        "base image nvcr.io/nvidia/pytorch:26.10-py3: pulling on srv0 (the build server) (at most 60 s; "
        "docker pull nvcr.io/nvidia/pytorch:26.10-py3 shows the same)"
    )
    assert said[1] == "base image nvcr.io/nvidia/pytorch:26.10-py3: 1/1 layers downloaded, 1/1 in place, 0 s"
    assert said[2].startswith("base image nvcr.io/nvidia/pytorch:26.10-py3: pulled in ")
    # Stopped at the bound just after the image was tagged: it is there, so it is used.
    assert decide(FakeEngine(False, Pulled(124, (), True), True), [])["present"]


def test_a_failed_pull_names_the_build_server_and_the_reason() -> None:
    refused = Pulled(1, ("Error response from daemon: unauthorized: authentication required",), False)
    result = decide(FakeEngine(False, refused, False), [], where="srv0")
    assert result["failed"] and not result["present"]
    assert result["msg"].startswith(
        "srv0: the base image nvcr.io/nvidia/pytorch:26.10-py3 is not on the engine"
    )
    assert "docker login nvcr.io" in result["msg"]
    late = decide(FakeEngine(False, Pulled(124, (), True), False), [], timeout=5)
    assert "did not finish within training_image_pull_timeout (5 s)" in late["msg"]


def test_layers_are_counted_from_the_pulls_lines() -> None:
    layers = Layers()
    assert layers.describe() == "asking the registry"
    for line in ("26.10-py3: Pulling from nvidia/pytorch", "0123456789ab: Pulling fs layer",
                 "fedcba987654: Verifying Checksum", "aaaaaaaaaaaa: Already exists",
                 "Digest: sha256:0"):  # fmt: skip
        layers.read(line)
    assert layers.describe() == "2/3 layers downloaded, 1/3 in place"


@pytest.mark.parametrize("engine", [Here(), There(local_shell)], ids=["here", "there"])
def test_each_engine_pulls_shows_progress_and_says_why_it_failed(docker: Path, engine: pull.Engine) -> None:
    said: list[str] = []
    name = "registry.example.com/ascend/cann:8.2.rc1"
    options: dict[str, Any] = {"timeout": 60, "every": 0.2, "pull": True, "check_mode": False, "where": ""}
    result = find_or_pull(engine, name, say=said.append, **options)
    assert result["changed"] and result["present"], said
    assert LOGS or isinstance(engine, Here)
    assert any("layers downloaded" in line for line in said) and engine.present(name)
    assert said[-1].startswith(f"base image {name}: pulled in ")
    missing = find_or_pull(engine, "registry.example.com/missing/cann:1", say=said.append, **options)
    assert missing["failed"] and "the registry registry.example.com has no such image" in missing["msg"]
    assert not [path for path in LOGS if os.path.exists(path)]


def test_this_controllers_pull_past_the_bound_is_stopped(docker: Path) -> None:
    stopped = Here().pull("registry.example.com/slow/cann:1", 1, 5.0, Layers(), lambda: None)
    assert stopped.timed_out and "0123456789ab: Pulling fs layer" in stopped.said


def test_a_pull_that_cannot_start_on_the_build_server_says_why() -> None:
    def refusing(command: str) -> Mapping[str, Any]:
        return {"rc": 1, "stdout": "", "stderr": "mktemp: failed to create file: Read-only file system"}

    began = There(refusing).pull("x:1", 60, 1.0, Layers(), lambda: None)
    assert began == Pulled(1, ("mktemp: failed to create file: Read-only file system",), False)
