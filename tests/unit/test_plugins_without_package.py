"""The controller-side plugins load on a controller where the ddp_cluster package is not installed: each finds
the package in this checkout through plugins/pythonpath/ddp_cluster.pth (site.addsitedir), the one place that
says where the sources are.

Each plugin is loaded in its own ``python -S`` process that sees Ansible's site-packages but none of its .pth
files, so the editable install of the package is not on sys.path there. Container-free.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import ansible
import pytest

REPO = Path(__file__).resolve().parents[2]
SITE_PACKAGES = Path(ansible.__file__).resolve().parents[1]
PLUGINS = sorted(
    path for path in REPO.glob("plugins/*/*.py") if "from ddp_cluster" in path.read_text(encoding="utf-8")
)

LOAD = """
import importlib.util, json, sys
path = sys.argv[1]
spec = importlib.util.spec_from_file_location("plugin_under_test", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps(sys.modules["ddp_cluster"].__file__))
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(SITE_PACKAGES)}
    return subprocess.run(
        [sys.executable, "-S", *args],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def without_package() -> None:
    if importlib.util.find_spec("ddp_cluster") is None:
        pytest.skip("ddp_cluster is not importable here at all")
    done = run("-c", "import ddp_cluster")
    if done.returncode == 0:
        pytest.skip(f"ddp_cluster is installed in {SITE_PACKAGES} itself, not as an editable install")
    assert "No module named 'ddp_cluster'" in done.stderr, done.stderr


def test_the_plugins_that_import_the_package_are_found() -> None:
    names = {path.name for path in PLUGINS}
    assert {"ddp_cluster.py", "ddp_image.py", "ddp_probe.py", "ddp_topology.py", "ddp_image_pull.py"} <= names


@pytest.mark.parametrize("path", PLUGINS, ids=lambda path: str(path.relative_to(REPO)))
def test_the_plugin_imports_the_checkouts_package(without_package: None, path: Path) -> None:
    done = run("-c", LOAD, str(path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert Path(json.loads(done.stdout)).is_relative_to(REPO / "python" / "src")
