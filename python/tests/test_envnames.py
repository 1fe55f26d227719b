"""Names of exported variables: only shell names pass, each other one is named with a fix."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.inventory import envnames

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["NCCL_DEBUG", "_x", "a1", "LD_LIBRARY_PATH", "_"])
def test_shell_names_pass(name: str) -> None:
    assert envnames.is_shell_name(name)
    assert envnames.name_problems({name: "1"}, "node_container_env") == []


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("NCCL-DEBUG", "NCCL_DEBUG"),
        ("X=1;cmd;Y", "X_1_cmd_Y"),
        ("1ST", "_1ST"),
        ("A B", "A_B"),
        ("", "_"),
        ("$(reboot)", "__reboot_"),
        ("NAME\n", "NAME_"),
    ],
)
def test_a_name_that_is_not_a_shell_name_is_named_with_a_fix(name: str, fix: str) -> None:
    assert not envnames.is_shell_name(name)
    (problem,) = envnames.name_problems({name: "1", "GOOD": "2"}, "node_container_env")
    assert problem.startswith(f"node_container_env: {name!r} is not a variable name")
    assert problem.endswith(f"rename it, e.g. {fix}")


def test_a_name_that_is_no_string_is_refused() -> None:
    assert envnames.name_problems({1: "x"}, "ddp_job_env") == [
        "ddp_job_env: '1' is not a variable name (a letter or _, then letters, digits or _):"
        " rename it, e.g. _1"
    ]


@pytest.mark.parametrize("value", [None, "", {}])
def test_nothing_set_has_no_problem(value: Any) -> None:
    assert envnames.name_problems(value, "node_container_env") == []


def test_a_value_that_is_no_mapping_is_named() -> None:
    assert envnames.name_problems(["A"], "node_container_env_append") == [
        "node_container_env_append must map variable names to values, not ['A']"
    ]


def test_several_settings_make_one_message() -> None:
    assert envnames.check_names({"node_container_env": {"OK": 1}, "node_container_env_append": {}}) == ""
    said = envnames.check_names(
        {"node_container_env": {"NCCL-DEBUG": "INFO"}, "node_container_env_prepend": {"MY.PATH": "/x"}}
    )
    assert said.count("is not a variable name") == 2 and said.endswith(".")
    assert "'NCCL-DEBUG'" in said and "node_container_env_prepend: 'MY.PATH'" in said


def test_the_filter_is_the_package_function() -> None:
    path = REPO / "plugins" / "filter" / "ddp_cluster.py"
    spec = importlib.util.spec_from_file_location("ddp_filters", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.FilterModule().filters()["ddp_env_name_problems"] is envnames.check_names


def test_the_node_preflight_checks_every_setting_node_env_exports() -> None:
    # node.env writes `export NAME=` for the names of these settings: the preflight checks each one.
    template = (REPO / "roles" / "node_container" / "templates" / "node.env.j2").read_text()
    preflight = (REPO / "roles" / "node_container" / "tasks" / "preflight.yml").read_text()
    exported = ["node_container_env", "node_container_env_append", "node_container_env_prepend"]
    for setting in exported:
        assert f"in {setting} | dictsort" in template
        assert f"'{setting}': {setting}" in preflight
    assert "| ddp_env_name_problems" in preflight
