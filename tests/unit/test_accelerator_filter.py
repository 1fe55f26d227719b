"""The ddp_accelerator filter (plugins/filter/ddp_accelerator.py) and what reads it: the kinds' facts for
Jinja, and the roles and playbooks of the hosts and preflight stages asking the kind instead of naming it. No
containers needed."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "ddp_accelerator_filters", REPO / "plugins" / "filter" / "ddp_accelerator.py"
)
assert _spec is not None and _spec.loader is not None
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)
ddp_accelerator = filters.ddp_accelerator


def test_the_filter_is_registered() -> None:
    assert filters.FilterModule().filters() == {"ddp_accelerator": ddp_accelerator}


def test_facts_and_one_fact() -> None:
    assert ddp_accelerator("npu")["host_roles"] == ["npu_host", "hccn_network"]
    assert ddp_accelerator("gpu", "device") == "cuda"
    assert ddp_accelerator("cpu", "interface_variables") == ["GLOO_SOCKET_IFNAME"]
    assert ddp_accelerator("npu", "preflight") == [
        {"role": "npu_host", "tasks": "preflight"},
        {"role": "hccn_network", "tasks": "tls"},
    ]
    assert ddp_accelerator("tpu", "kinds") == ["cpu", "npu", "gpu"]


@pytest.mark.parametrize(
    ("kind", "fact", "message"),
    [
        ("tpu", None, "accelerator 'tpu' is unknown: use cpu, npu, gpu"),
        ("gpu", "colour", "no fact 'colour'"),
    ],
)
def test_errors_name_what_is_wrong(kind: str, fact: str | None, message: str) -> None:
    with pytest.raises(AnsibleFilterError, match=message):
        ddp_accelerator(kind, fact)


def test_every_host_role_and_preflight_file_a_kind_names_exists() -> None:
    for kind in ddp_accelerator("", "kinds"):
        for role in ddp_accelerator(kind, "host_roles"):
            assert (REPO / "roles" / role / "tasks" / "main.yml").is_file(), (kind, role)
        for check in ddp_accelerator(kind, "preflight"):
            tasks = REPO / "roles" / check["role"] / "tasks" / f"{check['tasks']}.yml"
            assert tasks.is_file(), (kind, check)


# The files that once branched on the kind's name; each now asks the kind (ddp_accelerator).
KIND_BLIND = [
    "playbooks/hosts.yml",
    "playbooks/preflight.yml",
    "playbooks/tasks/host-prep.yml",
    "roles/node_container/vars/main.yml",
    "roles/cluster_preflight/tasks/main.yml",
    "roles/cluster_preflight/tasks/settings.yml",
]


@pytest.mark.parametrize("path", KIND_BLIND)
def test_the_hosts_and_preflight_stages_ask_the_kind(path: str) -> None:
    text = (REPO / path).read_text()
    yaml.safe_load(text)
    named = re.findall(r"cluster_accelerator\s*(?:==|!=|in)\s*[\[']", text)
    assert named == [], f"{path} branches on the accelerator's name: {named}"
