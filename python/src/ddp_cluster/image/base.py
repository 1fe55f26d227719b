"""The base image a node image is built on, as the controller sees it: what it is, what of it the node image
keeps, whether it can carry the node image at all, and the wheelhouse that fits it.

The base is a user's (a CANN image with its Python under ``/usr/local/python3.x``, NVIDIA's PyTorch container
with its own torch build) or the project's own Debian. Whatever it is, the node image never installs over the
base's torch, torch_npu, numpy or their installed dependencies (:attr:`Base.kept`): they become pip
constraints, a requirements line they do not satisfy is refused naming both versions, and the wheelhouse is
resolved against them. ``pip download`` cannot see a base's installed packages, and a vendor's torch
(``2.10.0a0+…nv25.12``) is on no index, so each kept package stands in the resolution as a placeholder wheel
of its exact version and requirements (metadata only, the best-ranked tag for the image), removed from the
wheelhouse afterwards: pip resolves as the image's own pip will, and downloads nothing the base already has.

- :func:`read_probe`: the probe's output (``key: value`` lines of the role's shell probe and the
  ``python_json:`` line of :mod:`ddp_cluster.image.probe`) as a :class:`Base`;
- :func:`problems`: every reason the node image cannot be built on it, each a sentence that says what to do;
- :func:`make_wheelhouse` (``python -m ddp_cluster.image.base wheelhouse ...``): constraints, placeholders,
  ``pip download``, placeholders out, and the check that torch comes from somewhere;
- :func:`pull_failure`: why ``docker pull`` of a base failed, said for the user.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.image.probe import PREFIX, canonical, requirement_name

# Package managers the image build knows (docker/install-os-packages.sh), in the order it tries them.
MANAGERS = ("apt-get", "dnf", "yum")
# A build tag ranks a placeholder above a real wheel of the same version and tags (pip: version, tag, build).
PLACEHOLDER_BUILD = "99999ddp"
KEEP = "the node image never installs over the base image's torch, torch_npu, numpy or their dependencies"


class BaseImageError(DdpClusterError):
    """The wheelhouse cannot be made for this base image; the message says why and what to do."""


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    requires: tuple[str, ...] = ()
    location: str = ""

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Base:
    image: str
    manager: str = ""  # apt-get, dnf, yum or '' (none)
    machine: str = ""
    libc: str = ""
    os: str = ""
    codename: str = ""
    python: str = ""  # X.Y.Z of the python3 on the image's PATH, '' when it has none
    executable: str = ""
    # What the node needs and the base lacks (sshd, ssh, mpirun, ip, ss, pkill, a python3 that makes
    # venvs), as docker/install-os-packages.sh reports it.
    missing: tuple[str, ...] = ()
    kept: Mapping[str, Package] = field(default_factory=dict)  # canonical name -> what the base has
    # The base's own pip constraints (NGC's PIP_CONSTRAINT file), which its pip applies inside the build too.
    pip_constraints: tuple[str, ...] = ()
    probe_error: str = ""

    @property
    def python_minor(self) -> str:
        return ".".join(self.python.split(".")[:2])

    def constraints(self) -> list[str]:
        """The kept packages' pins, then the base's own pip constraints on anything else."""
        kept = [package.pin for _, package in sorted(self.kept.items())]
        return kept + [line for line in self.pip_constraints if requirement_name(line) not in self.kept]


def read_probe(image: str, text: str) -> Base:
    """The role's probe output as a :class:`Base` (unknown lines ignored; no python_json line: no Python)."""
    lines: dict[str, list[str]] = {}
    report: dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith(PREFIX):
            report = json.loads(line[len(PREFIX) :])
            continue
        key, sep, value = line.partition(": ")
        if sep:
            lines.setdefault(key.strip(), []).append(value.strip())
    packages = report.get("packages") or {}
    assert isinstance(packages, dict)
    kept = {
        key: Package(
            name=str(entry["name"]),
            version=str(entry["version"]),
            requires=tuple(str(line) for line in entry.get("requires", [])),
            location=str(entry.get("location", "")),
        )
        for key, entry in packages.items()
    }
    first = {key: values[0] for key, values in lines.items() if values}
    return Base(
        image=image,
        manager=first.get("manager", ""),
        machine=first.get("machine", ""),
        libc=first.get("libc", ""),
        os=first.get("os", ""),
        codename=first.get("codename", ""),
        python=str(report.get("python", "")),
        executable=str(report.get("executable", "")),
        missing=tuple(lines.get("missing", [])),
        kept=kept,
        pip_constraints=tuple(str(line) for line in report.get("pip_constraints") or []),
        probe_error=first.get("probe_error", ""),
    )


# The python3 a distribution's own package manager installs, for a base that has none yet.
PYTHON_BY_CODENAME = {
    "bullseye": "3.9",
    "bookworm": "3.11",
    "trixie": "3.13",
    "focal": "3.8",
    "jammy": "3.10",
    "noble": "3.12",
}


def python_version(base: Base, override: str = "") -> str:
    """The X.Y the node image will run: the setting, else the base's python3, else its distribution's; ''."""
    return override or base.python_minor or PYTHON_BY_CODENAME.get(base.codename, "")


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def minimum_python(pyproject_text: str) -> str:
    """The X.Y of the package's ``requires-python = ">=X.Y"``."""
    match = re.search(r'^requires-python\s*=\s*">=\s*([0-9.]+)"', pyproject_text, re.MULTILINE)
    if not match:
        raise BaseImageError('python/pyproject.toml has no requires-python = ">=X.Y" line')
    return match.group(1)


def requirement_lines(text: str) -> list[tuple[int, str]]:
    """(line number, requirement) for each requirement of a pip requirements file: no comments, no options."""
    found = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if line and not line.startswith("-"):
            found.append((number, line))
    return found


def conflicts(base: Base, requirements_text: str, python_version: str) -> list[str]:
    """The requirements lines asking for a package the base keeps at a version the base's does not satisfy."""
    from packaging.markers import default_environment
    from packaging.requirements import InvalidRequirement, Requirement

    environment: dict[str, str] = {
        **{key: str(value) for key, value in default_environment().items()},
        "python_version": python_version,
        "python_full_version": base.python or f"{python_version}.0",
        "platform_machine": base.machine or "x86_64",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
    }
    found = []
    for number, line in requirement_lines(requirements_text):
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue  # pip says what is wrong with it
        package = base.kept.get(canonical(requirement.name))
        if package is None or (requirement.marker and not requirement.marker.evaluate(environment)):
            continue
        if not requirement.specifier.contains(package.version, prereleases=True):
            where = f" in {package.location}" if package.location else ""
            found.append(
                f"line {number} asks for {line}, but the base image has {package.name} {package.version}"
                f"{where}: remove the line or make it {package.pin}"
            )
    return found


def problems(
    base: Base,
    *,
    requirements_text: str,
    requirements_path: str,
    minimum: str,
    python_version: str,
    os_packages: Sequence[str] = (),
) -> list[str]:
    """Every reason the node image cannot be built on this base, each a sentence that says what to do; [] if
    none. python_version: the X.Y the wheelhouse is for (the setting, else the base's python3, else its
    distribution's); os_packages: training_image_os_packages."""
    found = []
    if base.probe_error:
        found.append(
            f"the base image {base.image}'s python3 ({base.executable or 'on its PATH'}) could not say what "
            f"it has: {base.probe_error}"
        )
    if not python_version:
        found.append(
            f"cannot tell which Python the base image {base.image} will have: it has no python3 and its "
            f"distribution ({base.codename or base.os or '?'}) is not one the role knows; set "
            "training_image_python_version"
        )
    elif version_tuple(python_version) < version_tuple(minimum):
        source = f"its python3, {base.executable}" if base.python else f"{base.codename or base.os}'s python3"
        found.append(
            f"the base image {base.image} has Python {base.python or python_version} ({source}), older than "
            f"the {minimum} the ddp_cluster package needs: use a base with Python {minimum} or newer "
            "(Ascend's CANN images ship 3.10 or 3.11 under /usr/local/python3.x)"
        )
    elif base.python and base.python_minor != python_version:
        found.append(
            f"training_image_python_version is {python_version}, but the base image {base.image} runs Python "
            f"{base.python} ({base.executable}), which the node's venv is made with: leave the setting empty"
        )
    distribution_python = base.executable.startswith(("/usr/bin/", "/bin/"))
    if base.python and "python3" in base.missing and not distribution_python:
        # A package manager's python3(-venv) would be a second interpreter beside the one the base puts first
        # on PATH, and the venv is made with that one: it must make venvs itself.
        found.append(
            f"the base image {base.image} puts {base.executable} (Python {base.python}) first on PATH, and "
            "it cannot make venvs (no ensurepip or venv module); the node's venv is made with the base's own "
            "Python, never a second one from the package manager: use a base whose Python has them (Ascend's "
            "CANN images' /usr/local/python3.x does), or add them to yours (build that Python with ensurepip)"
        )
    if not base.manager and base.missing:
        found.append(
            f"the base image {base.image} has no package manager ({', '.join(MANAGERS)}) to install "
            f"{', '.join(base.missing)} with: add them to it yourself (one RUN line of your own Dockerfile "
            "FROM it, for example openssh-server, openssh-clients and openmpi), or use a base that has "
            "apt-get, dnf or yum"
        )
    if not base.manager and os_packages:
        found.append(
            f"training_image_os_packages asks for {', '.join(os_packages)}, but the base image {base.image} "
            "has no package manager (apt-get, dnf, yum) to install them with: add them to the image yourself"
        )
    for line in conflicts(base, requirements_text, python_version or base.python_minor):
        found.append(f"training_image_requirements ({requirements_path}) {line}; {KEEP}")
    return found


def wheelhouse_inputs(image: str, probe: str, python_override: str = "") -> dict[str, Any]:
    """What the wheelhouse depends on, from the role's probe of image: machine, libc, python (the X.Y the
    image will run), kept (the pins of what the base keeps)."""
    base = read_probe(image, probe)
    return {
        "machine": base.machine or "x86_64",
        "libc": base.libc,
        "python": python_version(base, python_override),
        "kept": base.constraints(),
    }


def probe_problems(
    image: str,
    probe: str,
    *,
    requirements_text: str,
    requirements_path: str,
    pyproject_text: str,
    python_override: str = "",
    os_packages: Sequence[str] = (),
) -> list[str]:
    """:func:`problems` of the base the role's probe describes, against the package's requires-python."""
    base = read_probe(image, probe)
    return problems(
        base,
        requirements_text=requirements_text,
        requirements_path=requirements_path,
        minimum=minimum_python(pyproject_text),
        python_version=python_version(base, python_override),
        os_packages=os_packages,
    )


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def placeholder_wheel(package: Package, directory: Path, tag: str) -> Path:
    """A metadata-only wheel of package's exact version and requirements, tagged ``tag``."""
    from packaging.version import InvalidVersion, Version

    stem = re.sub(r"[-_.]+", "_", package.name).lower()
    try:
        version = str(Version(package.version))
    except InvalidVersion as error:
        raise BaseImageError(
            f"the base image has {package.name} {package.version}, a version pip cannot compare (PEP 440), "
            "so it cannot be kept as a constraint: install that package in a proper version in the base image"
        ) from error
    dist_info = f"{stem}-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": "".join(
            ["Metadata-Version: 2.1\n", f"Name: {package.name}\n", f"Version: {package.version}\n"]
            + [f"Requires-Dist: {line}\n" for line in package.requires]
        ).encode(),
        f"{dist_info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: ddp_cluster.image.base\nRoot-Is-Purelib: false\n"
            f"Build: {PLACEHOLDER_BUILD}\nTag: {tag}\n"
        ).encode(),
    }
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    path = directory / f"{stem}-{version}-{PLACEHOLDER_BUILD}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    return path


def best_tag(python_version: str, platforms: Sequence[str]) -> str:
    """The tag pip ranks first for a CPython of python_version on the first of platforms."""
    first = next((platform for platform in platforms if platform != "any"), "")
    if not first:
        return "py3-none-any"
    cp = "cp" + python_version.replace(".", "")
    return f"{cp}-{cp}-{first}"


def make_wheelhouse(
    base: Base,
    *,
    requirements: Path,
    dest: Path,
    python_version: str,
    platforms: Sequence[str],
    pip_args: Sequence[str] = (),
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> list[str]:
    """Download the wheels requirements need on top of base into dest (which must exist), with the base's kept
    packages as constraints; the wheel files, sorted. Raises BaseImageError naming what failed."""
    constraints = dest / "constraints.txt"
    constraints.write_text(
        f"# The base image's packages that the node image must not replace (read from {base.image}).\n"
        + "".join(line + "\n" for line in base.constraints())
    )
    with tempfile.TemporaryDirectory(prefix="ddp-placeholders-") as scratch:
        tag = best_tag(python_version, platforms)
        placeholders = {placeholder_wheel(package, Path(scratch), tag).name for package in base.kept.values()}
        argv = [
            sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
            "--only-binary=:all:", "--implementation", "cp", "--python-version", python_version,
            "--dest", str(dest), "--requirement", str(requirements), "--constraint", str(constraints),
            "--find-links", scratch,
            *(f"--platform={platform}" for platform in platforms),
            *pip_args,
        ]  # fmt: skip
        done = run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    for name in placeholders:
        (dest / name).unlink(missing_ok=True)
    if done.returncode != 0:
        kept = ", ".join(base.constraints()) or "none"
        raise BaseImageError(
            f"pip could not resolve {requirements} for Python {python_version} on {base.image} with the base "
            f"image's packages kept as they are ({kept}):\n{_pip_said(done.stdout)}"
        )
    wheels = sorted(path.name for path in dest.glob("*.whl"))
    if "torch" not in base.kept and not any(canonical(name.split("-")[0]) == "torch" for name in wheels):
        raise BaseImageError(
            f"neither the base image {base.image} nor {requirements} brings torch: add torch (and torch-npu "
            "on Ascend) of the pair your CANN or CUDA needs to the requirements, or use a base image with it"
        )
    shutil.copyfile(requirements, dest / "requirements.txt")
    return wheels


def _pip_said(output: str) -> str:
    """pip's error, from its first ERROR line on (the conflict's cause is there), without the lines before."""
    lines = output.strip().splitlines()
    first = next((number for number, line in enumerate(lines) if line.startswith("ERROR")), 0)
    return "\n".join(lines[first:])[-3000:]


def registry_of(image: str) -> str:
    """The registry host of an image reference as Docker reads it (docker.io when the first part is none)."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def pull_failure(image: str, output: str, timed_out: bool, timeout: int) -> str:
    """Why ``docker pull image`` failed, and what to do, from its output."""
    registry = registry_of(image)
    said = " ".join(output.split())[-400:]
    low = said.lower()
    if timed_out:
        reason = (
            f"the pull did not finish within training_image_pull_timeout ({timeout} s): raise it for an "
            f"image this size on this link, or pull it beforehand (docker pull {image})"
        )
    elif any(word in low for word in ("unauthorized", "no basic auth", "authentication required", "denied")):
        reason = (
            f"the registry refused it (unauthorized or not found: {said}): log in first with "
            f"docker login {registry}, and check the name"
        )
    elif any(word in low for word in ("manifest unknown", "not found", "does not exist")):
        reason = f"the registry {registry} has no such image ({said}): check the name and the tag"
    else:
        reason = f"the registry {registry} could not be reached or answered an error ({said})"
    return (
        f"the base image {image} is not on the engine that builds and could not be pulled: {reason}. "
        "If you have it as a file, load it first (docker load -i IMAGE.tar). No image of that name was left "
        "and nothing was changed"
    )


def read_pip_args_file(path: Path) -> list[str]:
    """The pip arguments the image stage hands over in a private file (never an argv Ansible shows), which is
    removed as soon as it is read."""
    try:
        text = path.read_text(encoding="utf-8")
    finally:
        path.unlink(missing_ok=True)
    loaded = json.loads(text)
    if not isinstance(loaded, list) or not all(isinstance(arg, str) for arg in loaded):
        raise BaseImageError("it must hold a JSON list of strings (training_image_pip_args)")
    return loaded


def pip_secrets(pip_args: Sequence[str]) -> list[str]:
    """What of training_image_pip_args may be a secret (a private index's URL with its token, in its userinfo,
    path or query): every value, as a whole and its URL's user and password, of 4 characters or more,
    longest first. Options themselves (``--extra-index-url``) are not."""
    values = []
    for arg in pip_args:
        value = arg.partition("=")[2] if arg.startswith("-") else arg
        values.append(value)
        try:
            parsed = urllib.parse.urlsplit(value)
        except ValueError:  # not a URL pip could use either
            continue
        for part in (parsed.username, parsed.password):
            values += [part, urllib.parse.unquote(part)] if part else []
    return sorted({value for value in values if len(value) >= 4}, key=len, reverse=True)


def mask_pip_args(text: str, pip_args: Sequence[str]) -> str:
    """``text`` (pip's output, an error) with every possible secret of pip_args replaced by ``***``: the
    Ansible task that passes them hides its own output (no_log), and shows this instead."""
    for value in pip_secrets(pip_args):
        text = text.replace(value, "***")
    return text


def _cli(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_cluster.image.base")
    commands = parser.add_subparsers(dest="command", required=True)
    wheelhouse = commands.add_parser("wheelhouse", help="download the wheels for a base image")
    wheelhouse.add_argument("--image", required=True)
    wheelhouse.add_argument("--probe", type=Path, required=True, help="the probe's output, - for stdin")
    wheelhouse.add_argument("--requirements", type=Path, required=True)
    wheelhouse.add_argument("--dest", type=Path, required=True)
    wheelhouse.add_argument("--python-version", required=True)
    wheelhouse.add_argument("--platform", action="append", default=[])
    wheelhouse.add_argument(
        "--pip-args-file",
        type=Path,
        help="a JSON list of extra pip download arguments, read and removed (they may hold an index's token)",
    )
    wheelhouse.add_argument(
        "pip_args", nargs=argparse.REMAINDER, help="after --: extra pip download arguments"
    )
    args = parser.parse_args(argv)
    pip_args = args.pip_args[1:] if args.pip_args[:1] == ["--"] else args.pip_args
    if args.pip_args_file is not None:
        try:
            pip_args = [*read_pip_args_file(args.pip_args_file), *pip_args]
        except (OSError, ValueError, BaseImageError) as error:
            print(f"cannot read the pip arguments from {args.pip_args_file}: {error}", file=sys.stderr)
            return 1
    probe = sys.stdin.read() if str(args.probe) == "-" else args.probe.read_text()
    base = read_probe(args.image, probe)
    try:
        wheels = make_wheelhouse(
            base,
            requirements=args.requirements,
            dest=args.dest,
            python_version=args.python_version,
            platforms=args.platform,
            pip_args=pip_args,
        )
    except BaseImageError as error:
        print(mask_pip_args(str(error), pip_args), file=sys.stderr)
        return 1
    print(json.dumps({"wheels": wheels, "kept": base.constraints()}))
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
