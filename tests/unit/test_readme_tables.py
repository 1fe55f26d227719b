"""Each role README's variable table against the role's meta/argument_specs.yml (scripts/var-tables.py).

Container-free: reads files, runs no playbook and needs no Docker.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "var-tables.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("var_tables", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


var_tables = load_script()


def write_role(root: Path, role: str, specs: dict) -> None:
    meta = root / "roles" / role / "meta"
    meta.mkdir(parents=True)
    (meta / "argument_specs.yml").write_text(yaml.safe_dump(specs), encoding="utf-8")


def block(role: str, body: str) -> str:
    return f"<!-- BEGIN GENERATED: vars {role} -->\n{body}<!-- END GENERATED: vars {role} -->\n"


DEMO_SPECS = {
    "argument_specs": {
        "main": {"options": {"demo_port": {"type": "int", "default": 8080, "description": "Port."}}},
    },
}


def test_role_readme_tables_are_those_of_the_argument_specs() -> None:
    problems = var_tables.check(REPO)
    assert problems == [], "\n".join(problems)


def test_every_role_with_argument_specs_has_a_table_in_its_own_readme() -> None:
    roles = sorted(path.parent.parent.name for path in REPO.glob("roles/*/meta/argument_specs.yml"))
    assert roles, "no roles/*/meta/argument_specs.yml found"
    for role in roles:
        readme = (REPO / "roles" / role / "README.md").read_text(encoding="utf-8")
        assert f"<!-- BEGIN GENERATED: vars {role} -->" in readme, role


def test_the_front_readme_and_the_docs_keep_no_role_table_and_the_reference_links_every_role() -> None:
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        assert "BEGIN GENERATED: vars" not in path.read_text(encoding="utf-8"), path.name
    reference = (REPO / "docs" / "reference.md").read_text(encoding="utf-8")
    for path in sorted(REPO.glob("roles/*/meta/argument_specs.yml")):
        role = path.parent.parent.name
        assert f"(../roles/{role}/README.md" in reference, role


def test_a_changed_spec_gives_another_table_and_the_check_names_the_role() -> None:
    specs = yaml.safe_load((REPO / "roles/ssh_mesh/meta/argument_specs.yml").read_text(encoding="utf-8"))
    original = var_tables.render_table(var_tables.entry_point_options("ssh_mesh", specs))
    changed = copy.deepcopy(specs)
    changed["argument_specs"]["main"]["options"]["ssh_mesh_key_type"]["default"] = "rsa"
    table = var_tables.render_table(var_tables.entry_point_options("ssh_mesh", changed))
    assert table != original

    readme = (REPO / "roles/ssh_mesh/README.md").read_text(encoding="utf-8")
    messages = var_tables.drift(readme, "ssh_mesh", table)
    assert len(messages) == 1
    assert "roles/ssh_mesh/README.md" in messages[0] and "role ssh_mesh" in messages[0]
    assert "python scripts/var-tables.py" in messages[0]


def test_cells_join_descriptions_escape_markup_and_show_yaml_literals() -> None:
    options = {
        "x_empty": {"type": "str", "default": "", "description": ["First part,", "second | part."]},
        "x_list": {"type": "list", "elements": "str", "default": [], "description": "runs/<id>/ __pycache__"},
        "x_dict": {"type": "dict", "default": {}},
        "x_int": {"type": "int", "default": 3600},
        "x_float": {"type": "float", "default": 0.5},
        "x_true": {"type": "bool", "default": True},
        "x_false": {"type": "bool", "default": False},
        "x_version": {"type": "str", "default": "3.8"},
        "x_word": {"type": "str", "default": "ed25519", "choices": ["ed25519", "rsa"]},
        "x_items": {"type": "list", "default": ["a", "b c"]},
        "x_jinja": {"type": "str", "default": "{{ a | default('') }}"},
        "x_required": {"type": "str", "required": True},
        "x_derived": {"type": "str", "choices": ["no", "", "0"], "description": "Defaults to x_other."},
    }
    rows = {}
    for line in var_tables.render_table(options).splitlines()[2:]:
        rows[line.split(" | ")[0].strip("|` ")] = line
    assert rows["x_empty"] == '| `x_empty` | str | `""` | First part, second \\| part. |'
    assert rows["x_list"] == "| `x_list` | list of str | `[]` | runs/\\<id>/ \\_\\_pycache\\_\\_ |"
    assert rows["x_dict"] == "| `x_dict` | dict | `{}` |  |"
    assert "| `3600` |" in rows["x_int"]
    assert "| `0.5` |" in rows["x_float"]
    assert "| `true` |" in rows["x_true"]
    assert "| `false` |" in rows["x_false"]
    assert '| `"3.8"` |' in rows["x_version"]
    assert "| str (ed25519, rsa) | `ed25519` |" in rows["x_word"]
    assert "| `[a, b c]` |" in rows["x_items"]
    assert "`\"{{ a \\| default('') }}\"`" in rows["x_jinja"]
    assert rows["x_required"] == "| `x_required` | str | required |  |"
    assert rows["x_derived"] == '| `x_derived` | str ("no", "", "0") | (derived) | Defaults to x_other. |'


def test_a_role_without_main_takes_its_only_entry_point() -> None:
    specs = {"argument_specs": {"settings": {"options": {"a_b": {"type": "int", "default": 1}}}}}
    assert "`a_b`" in var_tables.render_table(var_tables.entry_point_options("a", specs))
    two = {"argument_specs": {"one": {"options": {}}, "two": {"options": {}}}}
    with pytest.raises(var_tables.SpecError, match="no entry point main"):
        var_tables.entry_point_options("a", two)


def write_readme(root: Path, role: str, text: str) -> Path:
    readme = root / "roles" / role / "README.md"
    readme.parent.mkdir(parents=True, exist_ok=True)
    readme.write_text(text, encoding="utf-8")
    return readme


def test_check_fails_on_a_stale_table_and_the_rewrite_fixes_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_role(tmp_path, "demo", DEMO_SPECS)
    readme = write_readme(tmp_path, "demo", "# demo\n\n" + block("demo", "| stale |\n") + "\nAfter.\n")

    assert var_tables.main(["--check"], root=tmp_path) == 1
    error = capsys.readouterr().err
    assert "roles/demo/README.md" in error and "python scripts/var-tables.py" in error

    assert var_tables.main([], root=tmp_path) == 0
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# demo\n\n<!-- BEGIN GENERATED: vars demo -->\n| variable |")
    assert "| `demo_port` | int | `8080` | Port. |\n<!-- END GENERATED: vars demo -->\n\nAfter.\n" in text
    assert var_tables.main(["--check"], root=tmp_path) == 0


def test_check_names_a_missing_a_foreign_and_an_orphan_table(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_role(tmp_path, "demo", DEMO_SPECS)
    write_readme(tmp_path, "demo", block("other", ""))
    write_readme(tmp_path, "bare", block("bare", ""))
    assert var_tables.main(["--check"], root=tmp_path) == 1
    error = capsys.readouterr().err
    assert "roles/demo/README.md has no table for role demo" in error
    assert "roles/demo/README.md has a table for role other" in error
    assert "roles/bare has no meta/argument_specs.yml" in error


def test_a_role_without_a_readme_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_role(tmp_path, "demo", DEMO_SPECS)
    assert var_tables.main(["--check"], root=tmp_path) == 1
    assert "roles/demo/README.md is missing" in capsys.readouterr().err
