"""The image stage's choice of the engine that builds (plugins/filter/ddp_image.py over
ddp_cluster.image.builder),
from the registered results of `docker version` as the role passes them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "ddp_image_filters", REPO / "plugins" / "filter" / "ddp_image.py"
)
assert spec is not None and spec.loader is not None
filters = importlib.util.module_from_spec(spec)
spec.loader.exec_module(filters)
choose = filters.FilterModule().filters()["ddp_image_builder"]

ARM = {"atlas0": "26.1.5 arm64", "atlas1": "26.1.5 arm64"}


def test_no_docker_cli_on_the_controller_builds_on_the_first_server() -> None:
    # The command module's result when the executable is missing: no stdout, rc 2, the reason in msg.
    missing = {"rc": 2, "msg": "[Errno 2] No such file or directory: b'docker'", "failed": True}
    chosen = choose("auto", missing, ARM, [], "atlas0")
    assert chosen["builder"] == "server" and chosen["host"] == "atlas0" and chosen["error"] == ""
    assert "no Docker engine ([Errno 2] No such file or directory: b'docker')" in chosen["reason"]


def test_an_engine_that_does_not_answer_is_named_by_its_stderr() -> None:
    down = {
        "rc": 1,
        "stdout": "",
        "stderr": "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.",
    }
    chosen = choose("controller", down, ARM, [], "atlas0")
    assert chosen["builder"] == "" and "Cannot connect to the Docker daemon" in chosen["error"]


def test_an_x86_laptop_in_front_of_arm64_servers() -> None:
    laptop = {"rc": 0, "stdout": "28.5.1 amd64\n", "stderr": ""}
    assert choose("auto", laptop, ARM, [], "atlas1")["host"] == "atlas1"
    refused = choose("controller", laptop, ARM, [], "")
    assert "this controller is amd64, but atlas0 is arm64, atlas1 is arm64" in refused["error"]
    assert filters.FilterModule().filters()["ddp_docker_arch"]("aarch64") == "arm64"
