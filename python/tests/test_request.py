"""The request's rules of one value that argument_specs cannot state: env's names, and script_args that
would set what the entrypoint's launcher owns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_cluster.job import request as job_request

REPO = Path(__file__).resolve().parents[2]
OPTIONS = yaml.safe_load((REPO / "roles" / "ddp_job" / "meta" / "argument_specs.yml").read_text())[
    "argument_specs"
]["main"]["options"]


def problems(**changes: Any) -> list[str]:
    asked = {"kind": "train", "script": "", "script_args": "--epochs 2", "env": {}} | changes
    return job_request.check_request(asked, OPTIONS)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        ("--output-dir /tmp/x", "--output-dir"),
        ("--epochs 2 --output-dir=/tmp/x", "--output-dir"),
        (["--output-dir", "/tmp/x"], "--output-dir"),
        ("--out /tmp/x", "--output-dir"),  # argparse takes an unambiguous prefix
        ("--resume", "--resume"),
        ("--epochs 1 --res", "--resume"),
    ],
)
def test_an_option_the_launcher_owns_is_refused_naming_it_and_what_to_use(args: Any, option: str) -> None:
    (said,) = problems(script_args=args)
    assert said.startswith(f"script_args sets {option}")
    assert "the entrypoint's launcher owns" in said
    assert ("-e resume=true" if option == "--resume" else "runs/ID/output/") in said


def test_both_are_named_once_each() -> None:
    said = problems(script_args="--resume --output-dir a --output-dir=b --resume")
    assert [line.split(",")[0] for line in said] == [
        "script_args sets --resume",
        "script_args sets --output-dir",
    ]


@pytest.mark.parametrize(
    "args", ["--epochs 2 --dataset digits", "--lr 0.1", "-o x", "--", "-- --output-dir x", "--outputs"]
)
def test_the_entrypoints_other_options_pass(args: str) -> None:
    assert problems(script_args=args) == []


def test_a_script_of_the_users_own_owns_all_its_options() -> None:
    assert problems(script="train.py", script_args="--output-dir /tmp/x --resume") == []


def test_the_gate_and_an_unsplittable_value_are_not_this_rules() -> None:
    assert problems(kind="check", script_args="--output-dir x") == []
    assert problems(script_args="--output-dir 'x") == []  # the plan's split names it


def test_env_names_must_be_shell_names() -> None:
    (said,) = problems(env={"NCCL-DEBUG": "INFO", "OK_1": "x"})
    assert said.startswith("ddp_job_env: 'NCCL-DEBUG' is not a variable name")
    assert said.endswith("rename it, e.g. NCCL_DEBUG")
    assert problems(env={"OK": "1"}) == []
    # a value that is no mapping is named once, by its type
    (said,) = problems(env=["A"])
    assert said.startswith("ddp_job_env must be a mapping")


def test_a_typo_of_a_setting_is_named_with_the_one_meant_and_other_names_pass() -> None:
    known = set(job_request.USER_NAMES.values())
    given = ["node", "max_restart", "nodes", "epochs", "ansible_user", "dettach"]
    found = job_request.misspelled(given, known, "train.yml")
    assert [line.split(";")[0] for line in found] == [
        "-e dettach: train.yml has no setting 'dettach'",
        "-e max_restart: train.yml has no setting 'max_restart'",
        "-e node: train.yml has no setting 'node'",
    ]
    assert [line.split("? ")[0].split("; ")[1] for line in found] == [
        "did you mean -e detach=...",
        "did you mean -e max_restarts=...",
        "did you mean -e nodes=...",
    ]
    assert all(line.endswith("(a setting it does not know would be ignored)") for line in found)
    assert job_request.misspelled(["training_image_requirements", "since", "stop"], known, "train.yml") == []


def test_a_short_name_with_two_letters_swapped_is_a_typo_and_an_inventory_setting_is_not() -> None:
    jobs = ["stop", "logs", "sync", "drain", "undrain"]
    assert job_request.misspelled(["stpo"], jobs, "jobs.yml")[0].startswith(
        "-e stpo: jobs.yml has no setting 'stpo'; did you mean -e stop=...?"
    )
    roles = Path(__file__).resolve().parents[2] / "roles"
    settings = job_request.role_settings(roles)
    assert {"cluster_ssh_port", "training_image_build_address", "ddp_job_nodes"} <= settings
    known = set(job_request.USER_NAMES.values()) | settings
    assert job_request.misspelled(["cluster_ssh_port"], known, "train.yml") == []
