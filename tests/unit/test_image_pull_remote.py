"""ddp_image_pull on a build server (remote: true): the pull runs there in the background under timeout, its
progress read back over the task's own connection (here Ansible's local connection, with a docker CLI double
that answers as docker pull does without a terminal), the file it wrote removed; a failure names the server
and the pull's reason; a pull past the bound is stopped and named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

DOCKER = r"""#!/bin/sh
# docker double: image inspect answers from a state file; pull prints layer lines as the CLI does
# without a TTY.
state="$DDP_FAKE_DOCKER_STATE"
case "$1 $2" in
  "image inspect") [ -e "$state/present-$(echo "$3" | tr '/:' '__')" ]; exit $? ;;
esac
[ "$1" = pull ] || exit 2
readlink /proc/self/fd/2 >> "$state/logs"  # the file the pull writes to (2>&1), which must be gone at the end
name=$2
echo "${name##*:}: Pulling from ${name%:*}"
case "$name" in
  *missing*) echo "Error response from daemon: manifest for $name not found: manifest unknown"; exit 1 ;;
  *slow*) echo "0123456789ab: Pulling fs layer"; sleep 60; exit 0 ;;
esac
echo "0123456789ab: Pulling fs layer"
echo "fedcba987654: Pulling fs layer"
sleep 1.5
echo "0123456789ab: Download complete"
echo "0123456789ab: Pull complete"
sleep 1.5
echo "fedcba987654: Pull complete"
touch "$state/present-$(echo "$name" | tr '/:' '__')"
"""

PLAYBOOK = """- hosts: localhost
  gather_facts: false
  tasks:
    - ddp_image_pull:
        name: "{{ base }}"
        timeout: "{{ bound | int }}"
        every: 1
        remote: true
        where: srv0 (the build server, cluster_image_build_host)
"""


def pull(tmp_path: Path, base: str, bound: int = 60) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(DOCKER)
    (bin_dir / "docker").chmod(0o755)
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "pull.yml").write_text(PLAYBOOK)
    env = os.environ | {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DDP_FAKE_DOCKER_STATE": str(tmp_path / "state"),
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_FORCE_COLOR": "false",
    }
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         str(tmp_path / "pull.yml"),
         "-e", f"base={base}", "-e", f"bound={bound}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def leftovers(tmp_path: Path) -> list[str]:
    """The files this test's pulls wrote to that are still there."""
    logs = (tmp_path / "state" / "logs").read_text().split()
    assert logs and all(path.startswith("/var/tmp/ddp-pull.") for path in logs)
    return [path for path in logs if os.path.exists(path)]


def test_a_pull_on_the_build_server_shows_its_progress_and_leaves_no_file(tmp_path: Path) -> None:
    done = pull(tmp_path, "registry.example.com/ascend/cann:8.2.rc1")
    out = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stdout[-3000:]
    assert "base image registry.example.com/ascend/cann:8.2.rc1: pulling on srv0 (the build server" in out
    assert "layers downloaded" in out and "in place" in out
    assert "base image registry.example.com/ascend/cann:8.2.rc1: pulled in" in out
    assert "changed=1" in out
    assert leftovers(tmp_path) == []
    again = pull(tmp_path, "registry.example.com/ascend/cann:8.2.rc1")
    assert again.returncode == 0 and "changed=0" in again.stdout and "pulling" not in again.stdout


def test_a_failed_pull_on_the_build_server_names_the_server_and_the_reason(tmp_path: Path) -> None:
    done = pull(tmp_path, "registry.example.com/missing/cann:1")
    out = " ".join(done.stdout.split())
    assert done.returncode != 0
    assert (
        "srv0 (the build server, cluster_image_build_host): the base image "
        "registry.example.com/missing/cann:1 is not on the engine that builds and could not be pulled: the "
        "registry registry.example.com has no such image"
    ) in out
    assert "docker load -i" in out
    assert leftovers(tmp_path) == []


def test_a_pull_on_the_build_server_past_the_bound_is_stopped_and_named(tmp_path: Path) -> None:
    done = pull(tmp_path, "registry.example.com/slow/cann:1", bound=3)
    out = " ".join(done.stdout.split())
    assert done.returncode != 0
    assert "did not finish within training_image_pull_timeout (3 s)" in out
    assert leftovers(tmp_path) == []
