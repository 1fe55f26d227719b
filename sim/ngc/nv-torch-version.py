"""Give the installed torch NVIDIA's version label, as NGC's own build of torch carries (X.Y.Za0+<10
hex>.nvYY.MM).

Usage: python3 nv-torch-version.py VERSION. Rewrites, in the site directory pip installed torch into: the
dist-info directory's name, its METADATA Version, torch/version.py's __version__ (and its compiled copy), and
the RECORD lines for all of them (paths, sha256 digests, sizes), so that importlib.metadata.version("torch"),
torch.__version__ and pip agree on the new version. Standard library only; run by sim/ngc/Dockerfile.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import py_compile
import re
import shutil
import sys
from pathlib import Path


def digest(path: Path) -> str:
    data = path.read_bytes()
    return (
        "sha256="
        + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        + f",{len(data)}"
    )


def main() -> None:
    new = sys.argv[1]
    dist = importlib.metadata.distribution("torch")
    old = dist.version
    old_info = Path(str(dist._path))  # type: ignore[attr-defined]
    site = old_info.parent
    new_info = site / f"torch-{new}.dist-info"

    metadata = old_info / "METADATA"
    text = metadata.read_text(encoding="utf-8")
    text, count = re.subn(rf"^Version: {re.escape(old)}$", f"Version: {new}", text, count=1, flags=re.M)
    if count != 1:
        sys.exit(f"{metadata}: no 'Version: {old}' line")
    metadata.write_text(text, encoding="utf-8")

    version_py = site / "torch" / "version.py"
    text = version_py.read_text(encoding="utf-8")
    text, count = re.subn(r"^__version__ = .*$", f"__version__ = '{new}'", text, count=1, flags=re.M)
    if count != 1:
        sys.exit(f"{version_py}: no __version__ line")
    version_py.write_text(text, encoding="utf-8")
    compiled = Path(importlib.util.cache_from_source(str(version_py)))
    if compiled.exists():
        py_compile.compile(str(version_py), cfile=str(compiled), doraise=True)

    shutil.move(str(old_info), str(new_info))
    changed = {
        f"{new_info.name}/METADATA": new_info / "METADATA",
        "torch/version.py": version_py,
        compiled.relative_to(site).as_posix(): compiled,
    }
    lines = []
    for line in (new_info / "RECORD").read_text(encoding="utf-8").splitlines():
        path, _, rest = line.partition(",")
        if path.startswith(f"{old_info.name}/"):
            path = new_info.name + path[len(old_info.name) :]
        if path in changed and rest and changed[path].exists():
            rest = digest(changed[path])
        lines.append(f"{path},{rest}")
    (new_info / "RECORD").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"torch {old} -> {new}")


if __name__ == "__main__":
    main()
