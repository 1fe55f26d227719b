#!/usr/bin/env python3
"""Build the torch_npu stand-in (sim/cann/torch_npu) as a wheel:
OUTDIR/torch_npu-V-1-cp311-cp311-manylinux_2_28_M.whl.

Real nodes get torch_npu from a wheel (PyPI's, or a site wheelhouse), not from the CANN image, so the
simulated ones do too. The wheel carries the real torch-npu wheel's metadata for version V (default: the
package's torch_npu/version.py): Name torch_npu, Requires-Dist torch==V.*, numpy, pyyaml; the console
script torch_npu_run and torch's autoload entry point (group torch.backends); WHEEL Root-Is-Purelib false and
the real wheel's tag for CPython 3.11 on this machine (M: `uname -m`). The build tag 1 makes pip prefer it
over PyPI's wheel of the same version and tags (pip orders candidates by version, then tag priority, then
build tag).

Usage: make-torch-npu-wheel.py [--version V] OUTDIR. Standard library only (Python >= 3.9); the wheel is
written beside its final name and renamed into place, so a concurrent reader never sees half a file.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import platform
import re
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent / "torch_npu"
BUILD_TAG = "1"
PYTHON_TAG = "cp311"
# A fixed timestamp: the same sources give the same bytes.
DATE_TIME = (2026, 1, 1, 0, 0, 0)

# What the real wheel's entry_points.txt declares, kept where the stand-in has the callable (the real one also
# declares torch_dynamo_backends from torch_npu.dynamo, which the stand-in does not have).
ENTRY_POINTS = {
    "console_scripts": ("torch_npu_run", "torch_npu.distributed.run", "_main"),
    "torch.backends": ("torch_npu", "torch_npu", "_autoload"),
}


def package_version() -> str:
    text = (PACKAGE / "version.py").read_text(encoding="utf-8")
    match = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.M)
    if not match:
        sys.exit(f"{PACKAGE / 'version.py'}: no __version__")
    return match.group(1)


def defines(module: str, name: str) -> bool:
    """True when the stand-in's module source defines NAME at top level (a function or an assignment)."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    if not source.is_file():
        return False
    pattern = rf"^(?:def\s+{re.escape(name)}\s*\(|{re.escape(name)}\s*[:=])"
    return re.search(pattern, source.read_text(encoding="utf-8"), re.M) is not None


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(outdir: Path, version: str) -> Path:
    release = version.split("+")[0]
    torch_pin = ".".join(release.split(".")[:3]) + ".*"
    machine = platform.machine()
    tag = f"{PYTHON_TAG}-{PYTHON_TAG}-manylinux_2_28_{machine}"
    dist_info = f"torch_npu-{version}.dist-info"

    files: list[tuple[str, bytes]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        data = path.read_bytes()
        if path.name == "version.py" and path.parent == PACKAGE:
            data = f'__version__ = "{version}"\n'.encode()
        files.append((path.relative_to(PACKAGE.parent).as_posix(), data))

    sections = []
    for group, (name, module, attribute) in ENTRY_POINTS.items():
        if not defines(module, attribute):
            sys.exit(
                f"the stand-in's {module} has no {attribute}: the {group} entry point {name} would not load"
            )
        sections.append(f"[{group}]\n{name} = {module}:{attribute}\n")
    metadata = (
        "Metadata-Version: 2.4\n"
        "Name: torch_npu\n"
        f"Version: {version}\n"
        "Summary: NPU bridge for PyTorch\n"
        "Home-page: https://gitcode.com/ascend/pytorch\n"
        "License: BSD License\n"
        "Classifier: Programming Language :: Python :: 3 :: Only\n"
        f"Requires-Dist: torch=={torch_pin}\n"
        "Requires-Dist: numpy\n"
        "Requires-Dist: pyyaml\n"
        "\n"
        "ddp-cluster's stand-in of torch_npu (sim/cann/torch_npu): no kernels, imports only "
        "with the Ascend driver's\n"
        "libraries on LD_LIBRARY_PATH.\n"
    )
    wheel = (
        "Wheel-Version: 1.0\n"
        "Generator: ddp-cluster make-torch-npu-wheel.py\n"
        "Root-Is-Purelib: false\n"
        f"Build: {BUILD_TAG}\n"
        f"Tag: {tag}\n"
    )
    files += [
        (f"{dist_info}/METADATA", metadata.encode()),
        (f"{dist_info}/WHEEL", wheel.encode()),
        (f"{dist_info}/entry_points.txt", "\n".join(sections).encode()),
        (f"{dist_info}/top_level.txt", b"torch_npu\n"),
    ]
    record = "".join(record_line(name, data) + "\n" for name, data in files) + f"{dist_info}/RECORD,,\n"
    files.append((f"{dist_info}/RECORD", record.encode()))

    outdir.mkdir(parents=True, exist_ok=True)
    target = outdir / f"torch_npu-{version}-{BUILD_TAG}-{tag}.whl"
    handle, temporary = tempfile.mkstemp(prefix=".torch_npu-", suffix=".whl.tmp", dir=outdir)
    os.close(handle)
    try:
        with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in files:
                info = zipfile.ZipInfo(name, DATE_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                archive.writestr(info, data)
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    # Wheels of other versions of the stand-in would compete with this one in the wheelhouse.
    for stale in outdir.glob(f"torch_npu-*-{BUILD_TAG}-*.whl"):
        if stale != target:
            stale.unlink()
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--version", help="the wheel's version (default: the package's torch_npu/version.py)")
    args = parser.parse_args(argv)
    print(build(args.outdir, args.version or package_version()))


if __name__ == "__main__":
    main()
