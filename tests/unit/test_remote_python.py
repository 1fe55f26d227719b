"""What Ansible ships to the servers runs on the server's Python, which may be as old as 3.8: the roles'
modules (roles/*/library) and the module_utils they import (roles/*/module_utils, plugins/module_utils; the
roles' files link to modules of the package). Each must be Python 3.8 syntax, and its annotations must not be
evaluated (builtin generics such as ``list[str]`` and ``X | None`` fail on 3.8 where they are).

Container-free: parses files, runs nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(
    [
        *REPO.glob("roles/*/library/*.py"),
        *REPO.glob("roles/*/module_utils/*.py"),
        *REPO.glob("plugins/module_utils/*.py"),
    ]
)


def test_the_shipped_files_are_found() -> None:
    names = {path.name for path in SHIPPED}
    assert {"ddp_hccn.py", "ddp_mesh_files.py", "ddp_image_distribute.py"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: str(path.relative_to(REPO)))
def test_parses_as_python_3_8(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    try:
        ast.parse(source, filename=str(path), feature_version=(3, 8))
    except SyntaxError as error:
        pytest.fail(f"{path.relative_to(REPO)}:{error.lineno}: not Python 3.8 syntax: {error.msg}")


def _annotated(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            every += [argument for argument in (arguments.vararg, arguments.kwarg) if argument is not None]
            if node.returns is not None or any(argument.annotation is not None for argument in every):
                return True
    return False


def _postponed(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module == "__future__"
        and any(alias.name == "annotations" for alias in node.names)
        for node in tree.body
    )


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: str(path.relative_to(REPO)))
def test_annotations_are_not_evaluated(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    assert _postponed(tree) or not _annotated(tree), (
        f"{path.relative_to(REPO)} has annotations but no `from __future__ import annotations`"
    )
