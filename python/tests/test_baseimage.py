"""The base image as the controller reads it: the probe, what is kept, the refusals, and a wheelhouse resolved
against a base's own packages (a real, offline ``pip download``)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ddp_cluster.image import probe as baseprobe
from ddp_cluster.image.base import (
    Base,
    BaseImageError,
    Package,
    best_tag,
    conflicts,
    make_wheelhouse,
    mask_pip_args,
    minimum_python,
    pip_secrets,
    placeholder_wheel,
    probe_problems,
    problems,
    pull_failure,
    read_probe,
    registry_of,
    wheelhouse_inputs,
)
from ddp_cluster.image.base import _cli as base_cli

NGC_TORCH = "2.13.0a0+4c1f3e2a9b.nv26.10"


def probe_text(
    packages: dict[str, dict[str, object]], python: str = "3.11.2", manager: str = "apt-get"
) -> str:
    report = {"python": python, "executable": "/usr/local/python3.11.2/bin/python3", "packages": packages}
    lines = [f"manager: {manager}"] if manager else []
    lines += ["machine: x86_64", "libc: 2.36", "codename: bookworm", "os: Debian GNU/Linux 12 (bookworm)"]
    return "\n".join([*lines, baseprobe.PREFIX + json.dumps(report)]) + "\n"


def ngc_like() -> Base:
    return Base(
        image="nvcr.io/nvidia/pytorch:26.10-py3",
        manager="apt-get",
        machine="x86_64",
        python="3.11.2",
        executable="/usr/bin/python3",
        kept={
            "torch": Package("torch", NGC_TORCH, ("filelock", 'numpy; extra == "numpy"'), "/usr/local/lib"),
            "filelock": Package("filelock", "3.20.0"),
            "numpy": Package("numpy", "1.24.0", (), "/usr/local/python3.11.2/lib/python3.11/site-packages"),
        },
    )


def test_the_probe_reads_its_own_interpreter_and_the_kept_closure() -> None:
    done = subprocess.run([sys.executable, baseprobe.__file__], capture_output=True, text=True, check=True)
    base = read_probe("here", "manager: apt-get\ntool: sshd\nmissing: mpirun\ntool: python3\n" + done.stdout)
    assert base.python == ".".join(map(str, sys.version_info[:3])) and base.executable == sys.executable
    assert base.manager == "apt-get" and base.missing == ("mpirun",)
    import numpy
    import torch

    assert base.kept["torch"].version == torch.__version__ and base.kept["numpy"].version == numpy.__version__
    # torch's own requirements that are installed come along (filelock is one of torch's on every release).
    assert "pip" not in base.kept and "setuptools" not in base.kept  # the venv's own
    assert "filelock" in base.kept and all(
        not line.endswith('extra == "opt-einsum"') for line in base.kept["torch"].requires
    )


def test_requirement_lines_skip_comments_and_options() -> None:
    base = ngc_like()
    text = "# torch==1.0\n--extra-index-url https://x\ntorch==2.13.0  # pinned\nnumpy>=1.24\nfilelock<3\n"
    found = conflicts(base, text, "3.11")
    assert len(found) == 2
    assert found[0].startswith(
        f"line 3 asks for torch==2.13.0, but the base image has torch {NGC_TORCH} in /usr/local/lib"
    )
    assert found[0].endswith(f"remove the line or make it torch=={NGC_TORCH}")
    assert found[1].startswith("line 5 asks for filelock<3, but the base image has filelock 3.20.0")


def test_a_requirement_the_base_satisfies_or_a_marker_excludes_is_not_a_conflict() -> None:
    text = 'numpy>=1.24\ntorch\nnumpy==2.4.6; python_version < "3.11"\nscipy==1.0\n'
    assert conflicts(ngc_like(), text, "3.11") == []
    assert len(conflicts(ngc_like(), text, "3.10")) == 1


def check(base: Base, python_version: str = "3.11", requirements: str = "", **extra: object) -> list[str]:
    return problems(
        base, requirements_text=requirements, requirements_path="r.txt", minimum="3.10",
        python_version=python_version, **extra,  # type: ignore[arg-type]
    )  # fmt: skip


def test_problems_name_old_python_missing_tools_and_conflicts() -> None:
    old = read_probe("ddp-cluster/base:bullseye", "manager: apt-get\ncodename: bullseye\nmissing: python3\n")
    (said,) = check(old, python_version="3.9")
    assert said.startswith(
        "the base image ddp-cluster/base:bullseye has Python 3.9 (bullseye's python3), older"
    )
    assert "than the 3.10 the ddp_cluster package needs" in said
    bare = read_probe(
        "mine:1", probe_text({}, manager="") + "tool: python3\ntool: sshd\nmissing: ssh\nmissing: ss\n"
    )
    (said,) = check(bare)
    assert "has no package manager (apt-get, dnf, yum) to install ssh, ss with: add them" in said
    complete = read_probe("mine:2", probe_text({}, manager="") + "tool: sshd\ntool: mpirun\n")
    assert check(complete) == []
    (said,) = check(complete, os_packages=["htop"])
    assert said.startswith(
        "training_image_os_packages asks for htop, but the base image mine:2 has no package"
    )
    (said,) = check(ngc_like(), requirements="torch==2.13.0\n")
    assert said.startswith("training_image_requirements (r.txt) line 1 asks for torch==2.13.0")
    assert "never installs over" in said


def test_a_python_version_setting_other_than_the_bases_and_a_probe_error_are_refused() -> None:
    (said,) = check(ngc_like(), python_version="3.10")
    assert said.startswith("training_image_python_version is 3.10, but the base image nvcr.io/nvidia/pytorch")
    assert "runs Python 3.11.2 (/usr/bin/python3)" in said
    broken = read_probe("mine:3", probe_text({}) + "probe_error: SyntaxError: invalid syntax\n")
    (said,) = check(broken)
    assert said.endswith("could not say what it has: SyntaxError: invalid syntax")


def test_the_roles_filters_read_the_probe_and_the_packages_minimum() -> None:
    probe = probe_text({"torch": {"name": "torch", "version": "2.6.0", "requires": []}}, python="3.9.2")
    assert wheelhouse_inputs("mine:1", probe) == {
        "machine": "x86_64", "libc": "2.36", "python": "3.9", "kept": ["torch==2.6.0"]
    }  # fmt: skip
    assert wheelhouse_inputs("mine:1", "codename: jammy\n", "3.12")["python"] == "3.12"
    assert wheelhouse_inputs("mine:1", "")["machine"] == "x86_64"
    (said,) = probe_problems(
        "mine:1", probe, requirements_text="", requirements_path="r.txt",
        pyproject_text='requires-python = ">=3.10"\n',
    )  # fmt: skip
    assert said.startswith("the base image mine:1 has Python 3.9.2") and "older than the 3.10" in said


def test_minimum_python_is_read_from_pyproject() -> None:
    assert minimum_python('[project]\nrequires-python = ">=3.10"\n') == "3.10"
    with pytest.raises(BaseImageError):
        minimum_python("[project]\n")


def test_placeholder_ranks_first_and_carries_the_exact_version_and_requirements(tmp_path: Path) -> None:
    tag = best_tag("3.11", ["manylinux_2_36_x86_64", "manylinux_2_35_x86_64", "any"])
    assert tag == "cp311-cp311-manylinux_2_36_x86_64" and best_tag("3.11", ["any"]) == "py3-none-any"
    wheel = placeholder_wheel(ngc_like().kept["torch"], tmp_path, tag)
    assert wheel.name == f"torch-{NGC_TORCH}-99999ddp-{tag}.whl"
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"torch-{NGC_TORCH}.dist-info/METADATA").decode()
    assert f"Version: {NGC_TORCH}\n" in metadata and "Requires-Dist: filelock\n" in metadata


def plain_wheel(directory: Path, name: str, version: str, requires: list[str]) -> None:
    placeholder_wheel(Package(name, version, tuple(requires)), directory, "py3-none-any").rename(
        directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    )


def offline(index: Path) -> list[str]:
    return ["--no-index", "--find-links", str(index)]


def test_the_wheelhouse_resolves_against_the_base_and_holds_none_of_it(tmp_path: Path) -> None:
    index, dest = tmp_path / "index", tmp_path / "wheelhouse"
    index.mkdir(), dest.mkdir()
    plain_wheel(index, "needs-torch", "1.0", ["torch>=2.0", "numpy"])
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("needs-torch==1.0\nnumpy>=1.24\n")
    wheels = make_wheelhouse(
        ngc_like(), requirements=requirements, dest=dest, python_version="3.11",
        platforms=["manylinux_2_36_x86_64", "any"], pip_args=offline(index),
    )  # fmt: skip
    assert wheels == ["needs_torch-1.0-py3-none-any.whl"]
    assert sorted(path.name for path in dest.iterdir()) == [
        "constraints.txt",
        "needs_torch-1.0-py3-none-any.whl",
        "requirements.txt",
    ]
    assert f"torch=={NGC_TORCH}\n" in (dest / "constraints.txt").read_text()


def test_a_dependency_that_needs_another_torch_is_refused_naming_it(tmp_path: Path) -> None:
    index, dest = tmp_path / "index", tmp_path / "wheelhouse"
    index.mkdir(), dest.mkdir()
    plain_wheel(index, "needs-new-torch", "1.0", ["torch>=2.14"])
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("needs-new-torch\n")
    with pytest.raises(BaseImageError) as raised:
        make_wheelhouse(
            ngc_like(), requirements=requirements, dest=dest, python_version="3.11",
            platforms=["manylinux_2_36_x86_64"], pip_args=offline(index),
        )  # fmt: skip
    said = str(raised.value)
    assert (
        "with the base image's packages kept as they are "
        f"(filelock==3.20.0, numpy==1.24.0, torch=={NGC_TORCH})" in said
    )
    assert "torch>=2.14" in said and list(dest.glob("*.whl")) == []


def test_every_value_of_the_pip_arguments_is_masked_and_no_option_is() -> None:
    pip_args = [
        "--extra-index-url", "https://ci-user:s3cr%40t-9@pypi.example.com/simple",
        "--index-url=https://tok-1234@pypi.fury.io/team/", "--pre", "--find-links", "/srv/wheels",
    ]  # fmt: skip
    found = pip_secrets(pip_args)
    for value in ("https://ci-user:s3cr%40t-9@pypi.example.com/simple", "ci-user", "s3cr%40t-9", "s3cr@t-9",
                  "https://tok-1234@pypi.fury.io/team/", "tok-1234", "/srv/wheels"):  # fmt: skip
        assert value in found, value
    assert not {"--extra-index-url", "--pre", "--find-links"} & set(found)
    # pip itself prints an index with its user masked; the rest of the URL is ours to hide.
    said = "Looking in indexes: https://ci-user:****@pypi.example.com/simple, https://****@pypi.fury.io/team/"
    masked = mask_pip_args(said + "\nERROR: token tok-1234 refused", pip_args)
    assert "ci-user" not in masked and "tok-1234" not in masked and "Looking in indexes:" in masked
    assert mask_pip_args("a b c", []) == "a b c"


def test_the_download_reads_its_pip_arguments_from_a_file_it_removes_and_masks_them_in_its_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index, dest = tmp_path / "index", tmp_path / "wheelhouse"
    index.mkdir(), dest.mkdir()
    plain_wheel(index, "needs-new-torch", "1.0", ["torch>=2.14"])
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("needs-new-torch\n")
    probe = tmp_path / "probe.txt"
    probe.write_text(probe_text({"torch": {"name": "torch", "version": "2.13.0", "location": "/usr/lib"}}))
    args_file = tmp_path / ".pip-args.json"
    # An argument pip refuses is said back in its error: the value is a secret's stand-in.
    args_file.write_text(json.dumps([*offline(index), "--progress-bar=tok-5678"]))
    argv = ["wheelhouse", "--image", "cann", "--probe", str(probe), "--requirements", str(requirements),
            "--dest", str(dest), "--python-version", "3.11", "--platform", "any", "--pip-args-file",
            str(args_file)]  # fmt: skip
    assert base_cli(argv) == 1
    said = capsys.readouterr().err
    assert not args_file.exists()
    assert "pip could not resolve" in said and "invalid choice: '***'" in said, said
    assert "tok-5678" not in said, said
    args_file.write_text('{"not": "a list"}')
    assert base_cli(argv) == 1
    assert "must hold a JSON list of strings" in capsys.readouterr().err and not args_file.exists()


def test_no_torch_anywhere_is_refused(tmp_path: Path) -> None:
    index, dest = tmp_path / "index", tmp_path / "wheelhouse"
    index.mkdir(), dest.mkdir()
    plain_wheel(index, "tiny", "1.0", [])
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("tiny\n")
    bare = Base(image="debian:12", python="3.11.2")
    with pytest.raises(BaseImageError, match=r"neither the base image debian:12 nor .* brings torch"):
        make_wheelhouse(
            bare,
            requirements=requirements,
            dest=dest,
            python_version="3.11",
            platforms=["any"],
            pip_args=offline(index),
        )


def test_a_placeholder_wins_over_a_real_wheel_of_the_same_version_and_tag(tmp_path: Path) -> None:
    index, dest = tmp_path / "index", tmp_path / "wheelhouse"
    index.mkdir(), dest.mkdir()
    tag = best_tag("3.11", ["manylinux_2_36_x86_64"])
    # The "real" wheel: the same name, version and tag, no build tag, and a requirement nothing can satisfy.
    real = placeholder_wheel(Package("numpy", "1.24.0", ("no-such-package",)), index, tag)
    real.rename(index / f"numpy-1.24.0-{tag}.whl")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("numpy>=1.24\n")
    base = Base(
        image="cann",
        python="3.11.2",
        kept={
            "numpy": Package("numpy", "1.24.0"),
            "torch": ngc_like().kept["torch"],
            "filelock": ngc_like().kept["filelock"],
        },
    )
    wheels = make_wheelhouse(
        base, requirements=requirements, dest=dest, python_version="3.11",
        platforms=["manylinux_2_36_x86_64"], pip_args=offline(index),
    )  # fmt: skip
    assert wheels == []


def test_placeholder_names_and_versions_are_normalised_and_bad_versions_refused(tmp_path: Path) -> None:
    wheel = placeholder_wheel(Package("Zope.Interface", "1.0-1"), tmp_path, "py3-none-any")
    assert wheel.name == "zope_interface-1.0.post1-99999ddp-py3-none-any.whl"
    with pytest.raises(BaseImageError, match="a version pip cannot compare"):
        placeholder_wheel(Package("odd", "2024.x.y"), tmp_path, "py3-none-any")


def test_the_bases_own_pip_constraints_join_the_kept_pins() -> None:
    base = read_probe(
        "ngc",
        "manager: apt-get\n"
        + baseprobe.PREFIX
        + json.dumps({"python": "3.11.2", "packages": {"numpy": {"name": "numpy", "version": "1.24.0"}},
                      "pip_constraints": ["numpy==1.24.0", "PyYAML==6.0.1"]}),
    )  # fmt: skip
    assert base.constraints() == ["numpy==1.24.0", "PyYAML==6.0.1"]


def test_registry_and_pull_failures_are_said_for_the_user() -> None:
    assert registry_of("nvcr.io/nvidia/pytorch:26.10-py3") == "nvcr.io"
    assert (
        registry_of("127.0.0.1:5000/cann:8.2") == "127.0.0.1:5000"
        and registry_of("ascendai/cann:8.2") == "docker.io"
    )
    said = pull_failure(
        "127.0.0.1:5000/cann:8.2", "Error response from daemon: no basic auth credentials", False, 60
    )
    assert "docker login 127.0.0.1:5000" in said and "docker load -i" in said
    said = pull_failure(
        "127.0.0.1:5000/x:1", "manifest for 127.0.0.1:5000/x:1 not found: manifest unknown", False, 60
    )
    assert "has no such image" in said
    said = pull_failure("nvcr.io/nvidia/pytorch:26.10-py3", "", True, 3600)
    assert "did not finish within training_image_pull_timeout (3600 s)" in said


def test_a_base_python_first_on_path_that_cannot_make_venvs_is_refused_not_doubled_from_apt() -> None:
    # CANN-like: its own Python under /usr/local first on PATH, built without ensurepip; apt is there.
    no_venv = read_probe("mine:4", probe_text({}) + "tool: sshd\nmissing: python3\n")
    (said,) = check(no_venv)
    assert said.startswith(
        "the base image mine:4 puts /usr/local/python3.11.2/bin/python3 (Python 3.11.2) first on PATH, "
        "and it cannot make venvs"
    )
    assert "never a second one from the package manager" in said
    # The distribution's own python3 without its venv package: apt's python3-venv completes that same Python.
    distro = read_probe(
        "mine:5",
        probe_text({}).replace("/usr/local/python3.11.2/bin/python3", "/usr/bin/python3")
        + "missing: python3\n",
    )
    assert check(distro) == []
