"""Every role documents exactly the settings it has: meta/argument_specs.yml options == defaults/main.yml
keys; the cluster-wide settings and the node directory layout have one home, the cluster role, that every role
depends on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from conftest import REPO

ROLES = sorted(path.parent.parent for path in (REPO / "roles").glob("*/meta/argument_specs.yml"))


def test_every_role_has_argument_specs() -> None:
    with_defaults = sorted(path.parent.parent for path in (REPO / "roles").glob("*/defaults/main.yml"))
    assert with_defaults == ROLES


CLUSTER = REPO / "roles" / "cluster"
# The cluster-wide settings of the NPU device-IP plan keep the names inventories have always used (no role
# prefix).
NPU_PLAN_SETTINGS = {"npu_product", "npu_device_netmask"}


def spec_options(role: Path) -> dict[str, dict[str, object]]:
    """The options of a role's entry point: main, or the cluster role's settings (it has no tasks)."""
    entries = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return entries["settings" if role == CLUSTER else "main"]["options"]


def load(path: Path) -> dict[str, object]:
    return yaml.safe_load(path.read_text()) or {}


@pytest.mark.parametrize("role", ROLES, ids=[role.name for role in ROLES])
def test_specs_match_defaults(role: Path) -> None:
    defaults = load(role / "defaults" / "main.yml")
    specs = spec_options(role)
    assert sorted(specs) == sorted(defaults)
    for name, spec in specs.items():
        assert spec.get("description"), f"{role.name}: {name} has no description"
        assert spec.get("type"), f"{role.name}: {name} has no type"
        assert name.startswith(role.name + "_") or (role == CLUSTER and name in NPU_PLAN_SETTINGS), (
            f"{role.name}: {name} lacks the role prefix"
        )


@pytest.mark.parametrize("role", ROLES, ids=[role.name for role in ROLES])
def test_role_has_a_readme(role: Path) -> None:
    assert (role / "README.md").is_file()


def test_the_cluster_role_has_no_main_entry_point() -> None:
    # A main entry point would make Ansible check the settings' types in every play, before
    # cluster_preflight's messages that name the fix (tests/test_bad_input.py).
    entries = yaml.safe_load((CLUSTER / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert list(entries) == ["settings"]
    assert not (CLUSTER / "tasks").exists()


def test_the_cluster_specs_state_the_defaults() -> None:
    defaults = load(CLUSTER / "defaults" / "main.yml")
    for name, spec in spec_options(CLUSTER).items():
        assert spec.get("default") == defaults[name], name


def test_every_role_depends_on_the_cluster_role() -> None:
    for role in ROLES:
        if role != CLUSTER:
            assert "cluster" in (load(role / "meta" / "main.yml").get("dependencies") or []), role.name


def test_site_requires_exactly_the_settings_documented_as_required() -> None:
    required = load(REPO / "roles" / "cluster_preflight" / "vars" / "main.yml")["_cluster_preflight_required"]
    documented = [
        name
        for name, spec in spec_options(CLUSTER).items()
        if str(spec["description"]).startswith("Required")
    ]
    assert sorted(required) == sorted(documented)


def code_files() -> list[Path]:
    """Every role's and playbook's code (not its documentation), less the cluster role's."""
    files = [*REPO.glob("*.yml"), *(REPO / "playbooks").glob("*.yml")]
    for role in ROLES:
        if role != CLUSTER:
            for part in ("defaults", "vars", "tasks", "handlers", "templates"):
                files += [path for path in (role / part).rglob("*") if path.is_file()]
    return files


def test_no_role_re_declares_a_cluster_setting() -> None:
    settings = sorted(load(CLUSTER / "defaults" / "main.yml"))
    fallback = re.compile(r"\b(" + "|".join(settings) + r")\s*\|\s*default\(")
    found = [f"{path.relative_to(REPO)}: {match.group(0)}" for path in code_files()
             for match in fallback.finditer(path.read_text())]  # fmt: skip
    assert found == []
    for role in ROLES:
        if role != CLUSTER:
            assert not set(load(role / "defaults" / "main.yml")) & set(settings), role.name


def test_no_role_re_derives_the_node_layout() -> None:
    layout = re.compile(r"/var/lib/ddp-cluster|/workspace\b|/etc/ddp-cluster/node|\.ddp-cluster/")
    found = [f"{path.relative_to(REPO)}: {match.group(0)}" for path in code_files()
             for match in layout.finditer(path.read_text())]  # fmt: skip
    assert found == []


@pytest.mark.parametrize("role", ROLES, ids=[role.name for role in ROLES])
def test_a_setting_taken_from_a_cluster_setting_says_so_and_states_no_other_default(role: Path) -> None:
    settings = load(CLUSTER / "defaults" / "main.yml")
    defaults = load(role / "defaults" / "main.yml")
    for name, spec in spec_options(role).items():
        used = [setting for setting in settings if re.search(rf"\b{setting}\b", str(defaults[name]))]
        if role != CLUSTER and used:
            assert "default" not in spec, (
                f"{role.name}: {name} takes {used[0]}'s value, not {spec['default']!r}"
            )
            assert any(setting in str(spec["description"]) for setting in used), f"{role.name}: {name}"


# Each place a role reads other hosts' variables, and why that is not a scan of every host per host: a
# fallback for a role run alone (site.yml compiles the cluster first: the fact ddp_cluster, read instead), or
# a task run once for the play (O(N) once). A new scan of every host per host fails here: read the compiled
# cluster instead (python/src/ddp_cluster/inventory/compiled.py).
FALLBACK, ONCE = "fallback when ddp_cluster is not defined", "run_once: once for the play"
HOSTVARS_READS = {
    (
        "roles/cluster_host/defaults/main.yml",
        "hostvars | ddp_node_addresses(ansible_play_hosts_all)",
    ): FALLBACK,
    ("roles/node_container/tasks/run.yml", "hostvars | ddp_node_addresses(ansible_play_hosts_all)"): FALLBACK,
    ("roles/ssh_mesh/defaults/main.yml", "hostvars | ddp_node_addresses(ssh_mesh_nodes)"): FALLBACK,
    ("roles/ssh_mesh/templates/known_hosts.j2", "hostvars[node]"): FALLBACK,
    ("roles/ssh_mesh/vars/main.yml", "map('extract', hostvars"): ONCE,  # verify.yml's set_fact
    ("roles/hccn_network/vars/main.yml", "hostvars | ddp_npu_plan(groups[hccn_network_group],"): FALLBACK,
    (
        "roles/hccn_network/tasks/preflight.yml",
        "hostvars | ddp_npu_plan_check(groups[hccn_network_group] | default([])",
    ): FALLBACK,
    ("roles/hccn_network/tasks/tls.yml", "map('extract', hostvars"): ONCE,
    ("roles/cluster_preflight/tasks/npu.yml", "hostvars | ddp_npu_plan_check(groups['nodes'],"): FALLBACK,
    ("roles/cluster_preflight/tasks/settings.yml", "map('extract', hostvars"): ONCE,
    ("roles/training_image/tasks/distribute.yml", "hostvars[host]"): ONCE,
    (
        "roles/training_image/tasks/distribute.yml",
        "hostvars | ddp_ssh_targets(_training_image_lacking)",
    ): ONCE,
    (
        "roles/training_image/tasks/distribute.yml",
        "hostvars | ddp_ssh_targets([_training_image_build_host])",
    ): ONCE,
    ("roles/training_image/tasks/distribute.yml", "hostvars[_training_image_build_host]"): ONCE,
    ("roles/training_image/tasks/base.yml", "map('extract', hostvars"): ONCE,
    ("roles/training_image/tasks/preflight.yml", "map('extract', hostvars"): ONCE,
    ("roles/training_image/tasks/builder.yml", "map('extract', hostvars"): ONCE,
    (
        "roles/ddp_job/tasks/plan.yml",
        "hostvars | ddp_npu_plan(groups['nodes'],",
    ): "train.yml's plan, on localhost",
    ("roles/ddp_job/vars/main.yml", "hostvars[_ddp_job_planned.first]"): "one host: the job's first node",
    ("roles/ddp_job/vars/main.yml", "hostvars[_ddp_job_first_wait.moved]"): "one host: the job's first node",
}
HOSTVARS_READ = re.compile(
    r"hostvars\s*\|\s*\w+\((?!\[inventory_hostname\])[^,)]*[,)]?|hostvars\[(?!inventory_hostname\]|'localhost'\])[^\]]*\]"
    r"|map\('extract',\s*hostvars"
)


def test_no_role_reads_every_hosts_variables_per_host() -> None:
    """Per host, a role reads only its own host's variables (hostvars[inventory_hostname], a filter over
    [inventory_hostname]); the cluster-wide data comes from the compiled cluster (the fact ddp_cluster)."""
    found = set()
    for path in sorted((REPO / "roles").rglob("*")):
        if path.is_file() and path.suffix in (".yml", ".j2") and "molecule" not in path.parts:
            text = path.read_text()
            for match in HOSTVARS_READ.finditer(text):
                key = (str(path.relative_to(REPO)), match.group(0))
                assert key in HOSTVARS_READS, f"{key}: a read of other hosts' variables per host"
                if HOSTVARS_READS[key] == FALLBACK:
                    assert "ddp_cluster is defined" in text or "_compiled" in text, key
                found.add(key)
    assert found, "the pattern finds nothing: it is broken"
