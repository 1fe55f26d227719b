"""Plugins and role modules are shims over the package: at most 60 lines of code per plugin, 100 per role
module.

Documentation strings and comments do not count; the logic they would hold belongs in
``python/src/ddp_cluster``, where it is typed and unit-tested. Container-free.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS = sorted(p for p in (REPO / "plugins").glob("*/*.py"))
ROLE_MODULES = sorted(p for p in (REPO / "roles").glob("*/library/*.py"))
PLUGIN_LIMIT = 60
ROLE_MODULE_LIMIT = 100


def code_lines(path: Path) -> int:
    """Lines holding code: not blank, not only a comment, not inside a docstring or a string that stands alone
    as a statement (Ansible's DOCUMENTATION, EXAMPLES and RETURN assignments count as documentation)."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    documentation: set[int] = set()
    for node in ast.walk(tree):
        text = (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        )
        ansible_doc = (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN")
        )
        if (text or ansible_doc) and isinstance(node, ast.stmt) and node.end_lineno is not None:
            documentation.update(range(node.lineno, node.end_lineno + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue
        if token.type == tokenize.ENDMARKER:
            continue
        lines.update(line for line in range(token.start[0], token.end[0] + 1) if line not in documentation)
    return len(lines)


def test_counting_skips_documentation_and_comments(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Doc\nstring."""\n\n# a comment\nDOCUMENTATION = r"""\noptions: {}\n"""\n'
        "import os\n\n\ndef f(x):\n    '''Doc.'''\n    return os.path.join(\n        x, 'y'\n    )  # why\n",
        encoding="utf-8",
    )
    assert code_lines(sample) == 5  # import, def, return ( , x, 'y', )


@pytest.mark.parametrize("path", PLUGINS, ids=lambda p: str(p.relative_to(REPO)))
def test_plugin_is_a_shim(path: Path) -> None:
    count = code_lines(path)
    assert count <= PLUGIN_LIMIT, (
        f"{path.relative_to(REPO)} has {count} lines of code (at most {PLUGIN_LIMIT}): move the logic into "
        "the ddp_cluster package, with unit tests, and keep the plugin a shim"
    )


@pytest.mark.parametrize("path", ROLE_MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_role_module_is_a_shim(path: Path) -> None:
    count = code_lines(path)
    assert count <= ROLE_MODULE_LIMIT, (
        f"{path.relative_to(REPO)} has {count} lines of code (at most {ROLE_MODULE_LIMIT}): move the logic "
        "into the package's server/ (standard library, Python 3.8), shipped as the role's module_utils"
    )
