"""The controller's setup scripts, with fake interpreters and package managers on PATH (no Docker, no root).

scripts/find-python.sh picks the Python `make venv` uses; scripts/install-tool.sh installs a tool's package
with apt-get, dnf or yum. Each runs with PATH set to a folder of fakes and a folder of the few real tools it
needs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIND_PYTHON = REPO / "scripts" / "find-python.sh"
INSTALL_TOOL = REPO / "scripts" / "install-tool.sh"
TOOLS = ("bash", "env", "sed", "head", "tr", "basename", "dirname", "chmod", "cat")

UBUNTU_2204 = 'NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nID_LIKE=debian\n'
DEBIAN_12 = 'NAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n'
OPENEULER_2203 = 'NAME="openEuler"\nVERSION="22.03 (LTS-SP4)"\nID="openEuler"\nVERSION_ID="22.03"\n'
OPENEULER_2403 = 'NAME="openEuler"\nVERSION="24.03 (LTS)"\nID="openEuler"\nVERSION_ID="24.03"\n'
AFTER = "then make venv again (or make venv PYTHON=/path/to/python3.X)"


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    """Links to the real tools the scripts use, and nothing else (no real python3, apt-get or dnf)."""
    folder = tmp_path / "tools"
    folder.mkdir()
    for name in TOOLS:
        real = shutil.which(name)
        assert real, name
        (folder / name).symlink_to(real)
    return folder


@pytest.fixture
def fakes(tmp_path: Path) -> Path:
    folder = tmp_path / "fakes"
    folder.mkdir()
    return folder


def fake_python(folder: Path, name: str, version: str, venv: bool = True) -> Path:
    """An interpreter that answers the version query with VERSION, and the venv check as VENV says."""
    return write_script(
        folder / name,
        f'case "$2" in *version_info*) echo {version} ;; *ensurepip*) exit {0 if venv else 1} ;; esac\n',
    )


def find_python(
    tmp_path: Path, fakes: Path, tools: Path, os_release: str, *args: str, python: str | None = None
) -> subprocess.CompletedProcess[str]:
    release = tmp_path / "os-release"
    release.write_text(os_release)
    env = {"PATH": f"{fakes}:{tools}", "OS_RELEASE": str(release)}
    if python is not None:
        env["PYTHON"] = python
    return subprocess.run(
        [str(FIND_PYTHON), *args], env=env, capture_output=True, text=True, check=False, timeout=30
    )


def test_picks_the_newest_supported_python(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_python(fakes, "python3.11", "3.11")
    fake_python(fakes, "python3.13", "3.13")
    fake_python(fakes, "python3", "3.11")
    result = find_python(tmp_path, fakes, tools, DEBIAN_12)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{fakes}/python3.13\n", "")


def test_python3_itself_when_it_is_supported(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_python(fakes, "python3", "3.12")
    result = find_python(tmp_path, fakes, tools, DEBIAN_12)
    assert (result.returncode, result.stdout) == (0, f"{fakes}/python3\n")


def test_python_that_does_not_run_is_passed_over(tmp_path: Path, fakes: Path, tools: Path) -> None:
    # pyenv's shims for versions not selected exist on PATH and exit 127.
    write_script(fakes / "python3.13", "echo 'pyenv: python3.13: command not found' >&2; exit 127\n")
    fake_python(fakes, "python3.11", "3.11")
    result = find_python(tmp_path, fakes, tools, DEBIAN_12)
    assert (result.returncode, result.stdout) == (0, f"{fakes}/python3.11\n")


def test_only_310_on_ubuntu_2204_names_the_apt_line(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_python(fakes, "python3.10", "3.10")
    fake_python(fakes, "python3", "3.10")
    result = find_python(tmp_path, fakes, tools, UBUNTU_2204)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        "make venv: the pinned Ansible (ansible-core 2.19) needs Python 3.11-3.13 on the controller,"
        " found python3 is 3.10; install one as root: apt-get install -y python3.11 python3.11-venv,"
        f" {AFTER}\n"
    )


@pytest.mark.parametrize(
    ("os_release", "command"),
    [
        (OPENEULER_2203, "dnf install -y python3.11"),
        (OPENEULER_2403, "dnf install -y python3"),
        (DEBIAN_12, "apt-get install -y python3 python3-venv"),
    ],
)
def test_install_line_follows_the_os(
    tmp_path: Path, fakes: Path, tools: Path, os_release: str, command: str
) -> None:
    fake_python(fakes, "python3", "3.9")
    result = find_python(tmp_path, fakes, tools, os_release)
    assert result.returncode == 1
    assert result.stderr == (
        "make venv: the pinned Ansible (ansible-core 2.19) needs Python 3.11-3.13 on the controller,"
        f" found python3 is 3.9; install one as root: {command}, {AFTER}\n"
    )


def test_python_newer_than_the_pin_is_passed_over(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_python(fakes, "python3", "3.14")
    result = find_python(tmp_path, fakes, tools, DEBIAN_12)
    assert result.returncode == 1
    assert "needs Python 3.11-3.13 on the controller, found python3 is 3.14; install one" in result.stderr


def test_no_python_at_all(tmp_path: Path, fakes: Path, tools: Path) -> None:
    result = find_python(tmp_path, fakes, tools, UBUNTU_2204)
    assert result.returncode == 1
    assert (
        "on the controller, no python3 on PATH; install one as root: apt-get install -y python3.11"
        in result.stderr
    )


def test_python_given_too_old_is_refused(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_python(fakes, "python3.10", "3.10")
    fake_python(fakes, "python3.11", "3.11")
    result = find_python(tmp_path, fakes, tools, UBUNTU_2204, python="python3.10")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        "make venv: PYTHON=python3.10 is Python 3.10, and the pinned Ansible (ansible-core 2.19) needs Python"
        f" 3.11-3.13; install one as root: apt-get install -y python3.11 python3.11-venv, {AFTER}\n"
    )


def test_python_given_in_range_is_used(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_python(fakes, "python3.13", "3.13")
    custom = fake_python(tmp_path, "mypython", "3.12")
    result = find_python(tmp_path, fakes, tools, DEBIAN_12, python=str(custom))
    assert (result.returncode, result.stdout) == (0, f"{custom}\n")


def test_python_without_venv_names_its_venv_package(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_python(fakes, "python3", "3.11", venv=False)
    write_script(fakes / "apt-get", "exit 0\n")
    result = find_python(tmp_path, fakes, tools, DEBIAN_12)
    assert result.returncode == 1
    assert result.stderr == (
        f"make venv: {fakes}/python3 (Python 3.11) cannot make a virtualenv; install, as root:"
        " apt-get install -y python3.11-venv\n"
    )


def make_venv(tmp_path: Path, version: str) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake_python(venv / "bin", "python", version)
    return venv


def test_supported_venv_is_kept(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_python(fakes, "python3.13", "3.13")
    venv = make_venv(tmp_path, "3.11")
    result = find_python(tmp_path, fakes, tools, DEBIAN_12, str(venv))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_venv_on_another_python_than_the_one_given_is_rebuilt(
    tmp_path: Path, fakes: Path, tools: Path
) -> None:
    fake_python(fakes, "python3.13", "3.13")
    venv = make_venv(tmp_path, "3.11")
    result = find_python(tmp_path, fakes, tools, DEBIAN_12, str(venv), python="python3.13")
    assert (result.returncode, result.stdout) == (0, f"{fakes}/python3.13\n")
    assert (
        result.stderr
        == f"make venv: {venv} is on Python 3.11, PYTHON=python3.13 is 3.13; rebuilding {venv}\n"
    )


def test_venv_on_too_old_python_is_rebuilt(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_python(fakes, "python3.11", "3.11")
    venv = make_venv(tmp_path, "3.10")
    result = find_python(tmp_path, fakes, tools, UBUNTU_2204, str(venv))
    assert (result.returncode, result.stdout) == (0, f"{fakes}/python3.11\n")
    assert result.stderr == (
        f"make venv: {venv} was made with Python 3.10, which the pinned Ansible (ansible-core 2.19) does not"
        f" support; rebuilding {venv}\n"
    )


def test_venv_on_too_old_python_and_nothing_newer(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_python(fakes, "python3", "3.10")
    venv = make_venv(tmp_path, "3.10")
    result = find_python(tmp_path, fakes, tools, UBUNTU_2204, str(venv))
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"make venv: {venv} was made with Python 3.10")
    assert (
        "found python3 is 3.10; install one as root: apt-get install -y python3.11 python3.11-venv"
        in lines[1]
    )


def fake_manager(folder: Path, name: str) -> None:
    """A package manager that logs its argv and, for a package in FAKE_PACKAGES (package=command ...), puts
    that command next to itself; other packages fail, as with no such package."""
    write_script(
        folder / name,
        f'echo "{name} $*" >> "$FAKE_LOG"\n'
        '[ "$1" = install ] || exit 0\n'
        'for package in "$@"; do :; done\n'
        "for pair in $FAKE_PACKAGES; do\n"
        '  if [ "${pair%%=*}" = "$package" ]; then\n'
        '    printf "#!/bin/sh\\n" > "$(dirname "$0")/${pair#*=}"'
        '; chmod +x "$(dirname "$0")/${pair#*=}"; exit 0\n'
        "  fi\n"
        "done\n"
        'echo "No match for argument: $package" >&2; exit 1\n',
    )


def install_tool(
    tmp_path: Path, fakes: Path, tools: Path, tool: str, packages: str = "", uid: int = 0
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    write_script(fakes / "id", f'[ "$1" = -u ] && echo {uid}\n')
    log = tmp_path / "manager.log"
    env = {"PATH": f"{fakes}:{tools}", "FAKE_LOG": str(log), "FAKE_PACKAGES": packages}
    result = subprocess.run(
        [str(INSTALL_TOOL), tool], env=env, capture_output=True, text=True, check=False, timeout=30
    )
    return result, log.read_text().splitlines() if log.exists() else []


def test_apt_installs_debootstrap(tmp_path: Path, fakes: Path, tools: Path) -> None:
    for name in ("apt-get", "dnf"):
        fake_manager(fakes, name)
    result, calls = install_tool(tmp_path, fakes, tools, "debootstrap", "debootstrap=debootstrap")
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert calls == ["apt-get update -qq", "apt-get install -y -qq debootstrap"]
    assert result.stdout == "install-tool: installing debootstrap for debootstrap (apt-get)\n"
    assert (fakes / "debootstrap").exists()


def test_apt_installs_docker_io_for_dockerd(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_manager(fakes, "apt-get")
    result, calls = install_tool(tmp_path, fakes, tools, "dockerd", "docker.io=dockerd")
    assert result.returncode == 0, result.stderr
    assert calls == ["apt-get update -qq", "apt-get install -y -qq docker.io"]


def test_present_tool_runs_nothing(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_manager(fakes, "apt-get")
    write_script(fakes / "docker-registry", "exit 0\n")
    result, calls = install_tool(tmp_path, fakes, tools, "docker-registry")
    assert (result.returncode, result.stdout, result.stderr, calls) == (0, "", "", [])


REGISTRY_NOTE = (
    "; docker-distribution's command is 'registry', not 'docker-registry':"
    " set training_image_registry_command: registry (group_vars, or -e) for registry distribution"
)


def test_dnf_installs_docker_distribution_and_names_its_command(
    tmp_path: Path, fakes: Path, tools: Path
) -> None:
    fake_manager(fakes, "dnf")
    fake_manager(fakes, "yum")
    result, calls = install_tool(tmp_path, fakes, tools, "docker-registry", "docker-distribution=registry")
    assert result.returncode == 0, result.stderr
    assert calls == ["dnf install -y -q docker-distribution"]
    assert result.stdout == (
        "install-tool: installing docker-distribution for registry (dnf)\n"
        f"install-tool: installed docker-distribution{REGISTRY_NOTE}\n"
    )


def test_dnf_registry_already_there_under_its_own_name(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_manager(fakes, "dnf")
    write_script(fakes / "registry", "exit 0\n")
    result, calls = install_tool(tmp_path, fakes, tools, "docker-registry")
    assert (result.returncode, calls) == (0, [])
    assert result.stdout == f"install-tool: registry is installed, docker-registry is not{REGISTRY_NOTE}\n"


def test_dnf_falls_back_to_moby_engine_for_dockerd(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_manager(fakes, "dnf")
    result, calls = install_tool(tmp_path, fakes, tools, "dockerd", "moby-engine=dockerd")
    assert result.returncode == 0, result.stderr
    assert calls == ["dnf install -y -q docker", "dnf install -y -q moby-engine"]


def test_dnf_without_a_package_for_dockerd(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_manager(fakes, "dnf")
    result, calls = install_tool(tmp_path, fakes, tools, "dockerd")
    assert result.returncode == 1
    assert calls == ["dnf install -y -q docker", "dnf install -y -q moby-engine"]
    # dnf's own errors, then the script's line.
    assert result.stderr.splitlines() == [
        "No match for argument: docker",
        "No match for argument: moby-engine",
        "install-tool: dnf installed no dockerd (tried docker moby-engine): install it yourself",
    ]


def test_yum_as_the_last_resort(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_manager(fakes, "yum")
    result, calls = install_tool(tmp_path, fakes, tools, "debootstrap", "debootstrap=debootstrap")
    assert result.returncode == 0, result.stderr
    assert calls == ["yum install -y -q debootstrap"]


def test_not_root_gets_one_line_and_nothing_runs(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_manager(fakes, "apt-get")
    result, calls = install_tool(tmp_path, fakes, tools, "debootstrap", "debootstrap=debootstrap", uid=1000)
    assert (result.returncode, result.stdout, calls) == (1, "", [])
    assert (
        result.stderr
        == "install-tool: debootstrap is missing; install it as root: apt-get install -y debootstrap\n"
    )


def test_not_root_on_dnf_names_the_registry_command(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_manager(fakes, "dnf")
    result, calls = install_tool(tmp_path, fakes, tools, "docker-registry", uid=1000)
    assert (result.returncode, calls) == (1, [])
    assert result.stderr == (
        "install-tool: docker-registry is missing; install it as root: dnf install -y docker-distribution"
        f"{REGISTRY_NOTE}\n"
    )


def test_no_package_manager(tmp_path: Path, fakes: Path, tools: Path) -> None:
    result, calls = install_tool(tmp_path, fakes, tools, "debootstrap")
    assert (result.returncode, calls) == (1, [])
    assert result.stderr == (
        "install-tool: debootstrap is missing and there is no apt-get, dnf or yum here:"
        " install debootstrap yourself\n"
    )


def test_unknown_tool(tmp_path: Path, fakes: Path, tools: Path) -> None:
    fake_manager(fakes, "apt-get")
    result, calls = install_tool(tmp_path, fakes, tools, "kubectl")
    assert (result.returncode, calls) == (2, [])


def make_dry_run(*targets: str, env: dict[str, str] | None = None) -> str:
    """The recipes make would run (make -n runs none of them)."""
    env = {key: value for key, value in os.environ.items() if key != "ANSIBLE_INVENTORY"} | {
        "MAKEFLAGS": "",
        **(env or {}),
    }
    result = subprocess.run(
        ["make", "-n", "--no-print-directory", *targets],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return result.stdout


def test_site_installs_no_registry_and_sim_targets_do() -> None:
    assert "install-tool.sh docker-registry" not in make_dry_run("site")
    assert "install-tool.sh debootstrap" in make_dry_run("site")
    for target in ("sim-up", "sim-e2e", "registry"):
        assert "scripts/install-tool.sh docker-registry" in make_dry_run(target), target


def test_debootstrap_only_for_the_project_base() -> None:
    assert "install-tool.sh debootstrap" not in make_dry_run("base-image", "BASE_IMAGE=debian:bookworm-slim")
    # The inventory Ansible reads names the base: a GPU inventory on NGC's image builds no Debian base.
    gpu = make_dry_run("site", env={"ANSIBLE_INVENTORY": "inventories/gpu-example"})
    assert "debootstrap" not in gpu
    assert "base image nvcr.io/nvidia/pytorch:25.12-py3: yours, used as found or pulled" in gpu
    assert "install-tool.sh debootstrap" in make_dry_run(
        "site", env={"ANSIBLE_INVENTORY": "inventories/local"}
    )
    assert "debootstrap" not in make_dry_run("docker")


def test_demo_installs_what_running_needs_only() -> None:
    demo = make_dry_run("-B", "demo")
    assert "pip install --quiet -r requirements/controller.txt -e python" in demo
    assert "scripts/install-collections.sh" in demo
    assert "dev.txt" not in demo and "torch" not in demo


def test_check_installs_the_tools_but_no_torch() -> None:
    check = make_dry_run("-B", "check")
    assert "pip install --quiet -r requirements/dev.txt" in check
    assert 'pytest -q -m "not torch"' in check and 'pytest -q -m "not network" tests/unit' in check
    assert "torch==" not in check and "[train" not in check


NO_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, NoTorch())
"""


def test_the_package_tests_make_check_runs_are_collected_without_torch(tmp_path: Path) -> None:
    # A test file that imports torch (or a module that does) at its top, and is not in TORCH_FILES
    # (python/tests/conftest.py), would stop make check on a controller without torch.
    (tmp_path / "sitecustomize.py").write_text(NO_TORCH)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", "-m", "not torch"],
        cwd=REPO / "python",
        env=os.environ | {"PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "tests collected" in result.stdout
