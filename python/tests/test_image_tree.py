"""The node image's tag: one SHA-256 over its inputs' names and contents (ddp_cluster.image.tree)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_cluster.image.tree import TreeHashError, tree_hash


def make(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_contents_names_and_the_extra_string_change_the_hash_and_caches_do_not(tmp_path: Path) -> None:
    make(tmp_path, {"docker/Dockerfile": "FROM x\n", "src/a.py": "a = 1\n", "pyproject.toml": "[project]\n"})
    first = tree_hash(str(tmp_path), ["docker", "src", "pyproject.toml"], "base-id")
    assert tree_hash(str(tmp_path), ["pyproject.toml", "src", "docker", "src"], "base-id") == first
    make(tmp_path, {"src/__pycache__/a.cpython-311.pyc": "x", "src/b.pyc": "x", "src/pkg.egg-info/PKG": "x"})
    assert tree_hash(str(tmp_path), ["docker", "src", "pyproject.toml"], "base-id") == first
    assert tree_hash(str(tmp_path), ["docker", "src", "pyproject.toml"], "other-id") != first
    (tmp_path / "src" / "a.py").rename(tmp_path / "src" / "c.py")
    assert tree_hash(str(tmp_path), ["docker", "src", "pyproject.toml"], "base-id") != first


def test_a_missing_input_is_named(tmp_path: Path) -> None:
    with pytest.raises(TreeHashError, match=f"{tmp_path}/nope does not exist"):
        tree_hash(str(tmp_path), ["nope"])
