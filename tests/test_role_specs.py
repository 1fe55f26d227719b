"""Every role documents exactly the settings it has: meta/argument_specs.yml options == defaults/main.yml keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import REPO

ROLES = sorted(path.parent.parent for path in (REPO / "roles").glob("*/meta/argument_specs.yml"))


def test_every_role_has_argument_specs() -> None:
    with_defaults = sorted(path.parent.parent for path in (REPO / "roles").glob("*/defaults/main.yml"))
    assert with_defaults == ROLES


@pytest.mark.parametrize("role", ROLES, ids=[role.name for role in ROLES])
def test_specs_match_defaults(role: Path) -> None:
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert sorted(specs) == sorted(defaults)
    for name, spec in specs.items():
        assert spec.get("description"), f"{role.name}: {name} has no description"
        assert spec.get("type"), f"{role.name}: {name} has no type"
        assert name.startswith(role.name + "_"), f"{role.name}: {name} lacks the role prefix"


@pytest.mark.parametrize("role", ROLES, ids=[role.name for role in ROLES])
def test_role_has_a_readme(role: Path) -> None:
    assert (role / "README.md").is_file()
