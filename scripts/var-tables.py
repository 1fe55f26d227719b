#!/usr/bin/env python3
"""Each role's variable table, generated into its README from its meta/argument_specs.yml.

    python scripts/var-tables.py            # rewrite the tables in roles/*/README.md in place
    python scripts/var-tables.py --check    # exit 1 naming every role whose table differs from its specs

A role's table lies in its own README, roles/ROLE/README.md, between
``<!-- BEGIN GENERATED: vars ROLE -->`` and ``<!-- END GENERATED: vars ROLE -->``, and lists the options of
the role's ``main`` entry point (a role without one, such as ``cluster`` with its single entry point
``settings``, takes its only one): name, type, default and description. Every role with an argument_specs.yml
needs such a block in its README, and a README holds no other role's; the text around the block is the
README's own.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
FIX_COMMAND = "python scripts/var-tables.py"
BLOCK = re.compile(
    r"<!-- BEGIN GENERATED: vars (?P<role>[\w.-]+) -->\n(?P<body>.*?)<!-- END GENERATED: vars (?P=role) -->",
    re.DOTALL,
)
HEADER = "| variable | type | default | description |\n|---|---|---|---|\n"
# Characters that make a plain YAML scalar mean something else, or end it, inside a flow list or mapping.
FLOW_INDICATORS = frozenset(",[]{}")
# Outside code spans, what Markdown takes for markup: a tag (<job-id>), emphasis (*, __x__), ~strike~.
CODE_SPAN = re.compile(r"(`[^`]*`)")
MARKUP = re.compile(r"[<*~]|(?<![A-Za-z0-9])_+|_+(?![A-Za-z0-9])")


class SpecError(Exception):
    """An argument_specs.yml that has no table to give (no options, no entry point to choose)."""


def entry_point_options(role: str, specs: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]]:
    """The options of the role's ``main`` entry point, or of its only one."""
    entry_points = specs.get("argument_specs") or {}
    if "main" in entry_points:
        entry_point = entry_points["main"]
    elif len(entry_points) == 1:
        entry_point = next(iter(entry_points.values()))
    else:
        names = ", ".join(entry_points) or "none"
        raise SpecError(
            f"roles/{role}/meta/argument_specs.yml: no entry point main, and not exactly one other ({names})"
        )
    return (entry_point or {}).get("options") or {}


def literal(value: Any, in_flow: bool = False) -> str:
    """A default or choice as YAML would write it: "" and strings YAML reads otherwise quoted, flow lists."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{literal(k, True)}: {literal(v, True)}" for k, v in value.items()) + "}"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[" + ", ".join(literal(item, True) for item in value) + "]"
    text = str(value)
    try:
        plain = text != "" and text == text.strip() and yaml.safe_load(text) == text
    except yaml.YAMLError:
        plain = False
    if plain and in_flow and (FLOW_INDICATORS & set(text) or ": " in text):
        plain = False
    return text if plain else '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def cell(text: str) -> str:
    """One line of a Markdown table cell: whitespace collapsed, ``|`` escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def prose(text: str) -> str:
    """Text that reads in Markdown as it does in YAML: markup characters escaped outside code spans."""
    parts = CODE_SPAN.split(text)
    for index in range(0, len(parts), 2):
        parts[index] = MARKUP.sub(lambda match: "".join("\\" + char for char in match[0]), parts[index])
    return "".join(parts)


def type_cell(option: Mapping[str, Any]) -> str:
    kind = str(option.get("type", "str"))
    if "elements" in option:
        kind = f"{kind} of {option['elements']}"
    if "choices" in option:
        kind = f"{kind} ({', '.join(literal(choice, True) for choice in option['choices'])})"
    return cell(kind)


def default_cell(option: Mapping[str, Any]) -> str:
    if "default" in option:
        return cell(f"`{literal(option['default'])}`")
    return "required" if option.get("required") else "(derived)"


def description_cell(option: Mapping[str, Any]) -> str:
    description = option.get("description", "")
    if isinstance(description, list):
        description = " ".join(str(part) for part in description)
    return cell(prose(str(description)))


def render_table(options: Mapping[str, Mapping[str, Any]]) -> str:
    """The Markdown table of a role's options, in the order the specs give them."""
    rows = []
    for name, spec in options.items():
        option = spec or {}
        cells = [f"`{cell(name)}`", type_cell(option), default_cell(option), description_cell(option)]
        rows.append("| " + " | ".join(cells) + " |\n")
    return HEADER + "".join(rows)


def load_specs(root: Path) -> dict[str, Mapping[str, Any]]:
    """Every role's argument_specs.yml, by role name."""
    specs = {}
    for path in sorted(root.glob("roles/*/meta/argument_specs.yml")):
        specs[path.parent.parent.name] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return specs


def expected_tables(root: Path) -> dict[str, str]:
    return {role: render_table(entry_point_options(role, spec)) for role, spec in load_specs(root).items()}


def readme_name(role: str) -> str:
    """Where a role's table lives, relative to the repository."""
    return f"roles/{role}/README.md"


def missing(role: str) -> str:
    return f"{readme_name(role)} is missing: every role has a README with its variable table"


def rewrite(text: str, role: str, table: str) -> tuple[str, list[str]]:
    """A role's README with its table replaced, and what could not be done (block missing, foreign)."""
    name = readme_name(role)
    problems: list[str] = []
    seen: list[str] = []

    def replace(match: re.Match[str]) -> str:
        found = match["role"]
        seen.append(found)
        if found != role:
            problems.append(f"{name} has a table for role {found}: a role's README holds its own table only")
            return match[0]
        return f"<!-- BEGIN GENERATED: vars {role} -->\n{table}<!-- END GENERATED: vars {role} -->"

    new_text = BLOCK.sub(replace, text)
    count = seen.count(role)
    if count == 0:
        problems.append(
            f"{name} has no table for role {role}: add the lines "
            f"<!-- BEGIN GENERATED: vars {role} --> and <!-- END GENERATED: vars {role} --> "
            f"where it belongs, then run {FIX_COMMAND}"
        )
    elif count > 1:
        problems.append(f"{name} has {count} tables for role {role}: keep one")
    return new_text, problems


def drift(text: str, role: str, table: str) -> list[str]:
    """What is wrong with a role's README table: not the one its specs give, missing, doubled or foreign."""
    messages = [
        f"{readme_name(role)}: the variable table of role {role} differs from "
        f"roles/{role}/meta/argument_specs.yml: run {FIX_COMMAND}"
        for match in BLOCK.finditer(text)
        if match["role"] == role and match["body"] != table
    ]
    return messages + rewrite(text, role, table)[1]


def orphans(root: Path, tables: Mapping[str, str]) -> list[str]:
    """Tables in the READMEs of roles that have no argument_specs.yml."""
    messages = []
    for path in sorted(root.glob("roles/*/README.md")):
        role = path.parent.name
        if role in tables:
            continue
        for match in BLOCK.finditer(path.read_text(encoding="utf-8")):
            messages.append(
                f"{readme_name(role)} has a table for role {match['role']}, but roles/{role} has no "
                "meta/argument_specs.yml: remove its block"
            )
    return messages


def check(root: Path = REPO) -> list[str]:
    """What is out of date in the roles' README tables; empty when nothing is."""
    tables = expected_tables(root)
    messages = []
    for role, table in tables.items():
        path = root / readme_name(role)
        if not path.is_file():
            messages.append(missing(role))
            continue
        messages += drift(path.read_text(encoding="utf-8"), role, table)
    return messages + orphans(root, tables)


def main(argv: Sequence[str] | None = None, root: Path = REPO) -> int:
    parser = argparse.ArgumentParser(description="role README variable tables, from argument_specs.yml")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table is stale")
    args = parser.parse_args(argv)
    try:
        tables = expected_tables(root)
    except (SpecError, yaml.YAMLError) as error:
        print(f"var-tables: {error}", file=sys.stderr)
        return 1
    if args.check:
        messages = check(root)
        for message in messages:
            print(f"var-tables: {message}", file=sys.stderr)
        return 1 if messages else 0
    problems = orphans(root, tables)
    for role, table in tables.items():
        path = root / readme_name(role)
        if not path.is_file():
            problems.append(missing(role))
            continue
        text = path.read_text(encoding="utf-8")
        new_text, role_problems = rewrite(text, role, table)
        problems += role_problems
        if new_text != text:
            path.write_text(new_text, encoding="utf-8")
            print(f"var-tables: {readme_name(role)} rewritten")
    for problem in problems:
        print(f"var-tables: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
