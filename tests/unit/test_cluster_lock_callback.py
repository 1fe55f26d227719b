"""The callback plugins/callback/ddp_cluster_lock.py as ansible.cfg enables it: site.yml and the stages
under playbooks/ take the cluster's lock before their first task and a second run is refused there, naming
the first, with no task run; train.yml, jobs.yml and check.yml run while it is held. Playbooks of one debug
task on localhost, in a folder laid out as the repository's, HOME in a temporary folder (where the locks
are). The lock itself: python/tests/test_cluster_lock.py. Container-free."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = """- name: A play
  hosts: localhost
  gather_facts: false
  tasks:
    - name: The first task
      ansible.builtin.debug:
        msg: the first task ran
"""
# Another site.yml run, as far as the lock goes: it holds it until killed.
HOLD = """
import sys, time
from ddp_cluster.inventory import lock
lock.acquire(sys.argv[1:], "site.yml", "ansible-playbook site.yml (the first run)")
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name in ("site.yml", "train.yml", "jobs.yml", "check.yml", "playbooks/containers.yml"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(PLAYBOOK)
    (tmp_path / "home").mkdir()
    return tmp_path


def environment(project: Path) -> dict[str, str]:
    return os.environ | {
        "HOME": str(project / "home"),
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
    }


def playbook(project: Path, name: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", name]
    return subprocess.run(
        command,
        cwd=project,
        env=environment(project),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def held(project: Path) -> Iterator[int]:
    """The lock of the inventory `localhost,` held by another process; its pid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, "localhost,"],
        env=environment(project),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc.pid
    proc.kill()
    proc.wait()


def test_site_takes_the_lock_and_says_who_holds_it(project: Path) -> None:
    done = playbook(project, "site.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    locks = list((project / "home" / ".ddp-cluster" / "locks").glob("*.lock"))
    assert len(locks) == 1
    assert '"playbook": "site.yml"' in locks[0].read_text() and "-c local site.yml" in locks[0].read_text()


@pytest.mark.parametrize("name", ["site.yml", "playbooks/containers.yml"])
def test_a_second_run_is_refused_before_its_first_task_naming_the_first(
    project: Path, held: int, name: str
) -> None:
    done = playbook(project, name)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "another run of the cluster's playbooks holds its lock" in done.stderr
    assert f"pid {held}, started " in done.stderr
    assert "`ansible-playbook site.yml (the first run)`, inventory localhost," in done.stderr
    assert f"while kill -0 {held}" in done.stderr and "Nothing was changed." in done.stderr
    assert "the first task ran" not in done.stdout and "TASK [" not in done.stdout, done.stdout


@pytest.mark.parametrize("name", ["train.yml", "jobs.yml", "check.yml"])
def test_the_job_playbooks_run_while_site_holds_the_lock(project: Path, held: int, name: str) -> None:
    done = playbook(project, name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the first task ran" in done.stdout
