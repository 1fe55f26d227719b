"""One declaration per setting: a role's meta/argument_specs.yml states each setting's type, choices and
default; what else must know a default (the role's defaults/main.yml, which Ansible reads; the job's spec; a
rank's environment; the planner's names for what a user types) holds the same value, and these tests say where
one drifts. Container-free, no torch."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_cluster.job import request as job_request
from ddp_cluster.job import spec as job
from ddp_cluster.job import workdir
from ddp_cluster.runtime import distenv

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(path.parent.parent for path in (REPO / "roles").glob("*/meta/argument_specs.yml"))
# A role variable that reads an extra var: "{{ extra | default(FALLBACK) }}", or "{{ extra }}".
READS = re.compile(r"^\{\{\s*([a-z_]+)\s*(?:\|\s*default\((.*)\)\s*)?\}\}$")
# Defaults that are expressions (a path under the playbook or the role, or what another setting gives):
# argument_specs states what they come to in the common case.
COMPUTED = {
    "ddp_job_script_args",  # ddp_job_default_args without a script
    "ddp_job_resume",  # true when resume_from is set
    "ddp_job_runs_dir",
    "training_image_requirements",
    "training_image_build_dir",
    "training_image_registry_dir",
}
# A field of the job's spec -> the setting whose default it is (ddp_job_<name> unless named here).
SPEC_SETTINGS = {
    "hccl_init": "cluster_hccl_init",
    "master_port": "cluster_master_port",
    "accelerator": "cluster_accelerator",
}
# Fields whose default is no setting's: the plan always sets them (launcher_ports "" is "not pinned", what a
# spec made without the cluster role means), or the supervisor does.
SPEC_OWN = {
    "workdir",
    "resume",
    "script_args",
    "launcher_ports",
    "spares",
    "recovery",
    "restart",
    "resume_from",
    "start_id",
}


def options(role: Path) -> dict[str, dict[str, Any]]:
    entries = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    entry = entries.get("main") or entries["settings"]
    return dict(entry["options"])


def defaults(role: Path) -> dict[str, Any]:
    return dict(yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {})


def stated(name: str) -> Any:
    """A setting's default as argument_specs states it, from whichever role declares it."""
    for role in ROLES:
        found = options(role).get(name)
        if found is not None:
            return found["default"]
    raise KeyError(name)


@pytest.mark.parametrize("role", ROLES, ids=[role.name for role in ROLES])
def test_the_defaults_ansible_reads_are_the_ones_argument_specs_states(role: Path) -> None:
    values = defaults(role)
    for name, spec in options(role).items():
        if "default" not in spec or name in COMPUTED:
            continue
        value = values[name]
        read = READS.match(value) if isinstance(value, str) else None
        if read and read.group(2) is not None:
            value = yaml.safe_load(read.group(2))  # the extra var's fallback, as a YAML literal
        assert value == spec["default"], (
            f"{role.name}: {name} defaults to {value!r}, argument_specs says otherwise"
        )


def test_the_planner_names_the_extra_var_each_job_setting_reads() -> None:
    role = REPO / "roles" / "ddp_job"
    reads = {}
    for name, value in defaults(role).items():
        read = READS.match(value) if isinstance(value, str) else None
        if read:
            reads[name.removeprefix(job_request.PREFIX)] = read.group(1)
    assert reads == job_request.USER_NAMES


def test_the_job_specs_defaults_are_the_settings() -> None:
    for field in dataclasses.fields(job.JobSpec):
        if field.name in SPEC_OWN:
            continue
        default = (
            field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        )
        if default is dataclasses.MISSING:
            continue  # required: the plan always gives it
        if isinstance(default, tuple):
            default = list(default)  # the spec's lists are tuples (it is frozen)
        setting = SPEC_SETTINGS.get(field.name, job_request.PREFIX + field.name)
        assert default == stated(setting), (
            f"JobSpec.{field.name} defaults to {default!r}, {setting} is not that"
        )


def test_a_ranks_master_port_is_the_clusters() -> None:
    assert stated("cluster_master_port") == distenv.DEFAULT_MASTER_PORT


def test_the_workdir_command_bounds_a_project_as_the_job_does() -> None:
    assert stated("ddp_job_workdir_max_mb") == workdir.DEFAULT_MAX_MB
