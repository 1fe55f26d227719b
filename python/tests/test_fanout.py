"""One command on many servers (ddp_cluster.inventory.fanout): ssh as Ansible runs it, retries, bounds."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ddp_cluster.inventory import fanout

SSH_ARGS = "-o ControlMaster=auto -o ControlPersist=60s -o StrictHostKeyChecking=yes"


def test_ssh_argv_follows_the_hosts_settings_as_ansible_does() -> None:
    variables = {
        "ansible_host": "10.0.0.7",
        "ansible_port": 2222,
        "ansible_user": "root",
        "ansible_ssh_private_key_file": "~/k",
        "ansible_ssh_common_args": "-o UserKnownHostsFile=/kh",
        "ansible_ssh_executable": "/opt/bin/ssh",
    }
    argv = fanout.ssh_argv("n1", variables, ssh_args=SSH_ARGS, control_path_dir="/cp")
    assert argv[0] == "/opt/bin/ssh"
    assert argv[-1] == "10.0.0.7"
    for option in ("Port=2222", "User=root", "BatchMode=yes", "ControlMaster=auto", "UserKnownHostsFile=/kh"):
        assert option in argv
    assert f"IdentityFile={Path('~/k').expanduser()}" in argv
    # Ansible's own master socket for this host, port and user.
    assert fanout.control_path("10.0.0.7", 2222, "root", "/cp") in " ".join(argv)
    assert fanout.ssh_argv("n2", {}, ssh_args="", control_path_dir="/cp")[-1] == "n2"


def test_a_local_node_runs_here_and_become_goes_through_sudo() -> None:
    local = fanout.job(
        "n", {"ansible_connection": "local"}, "/bin/sh -s", "", ssh_args="", control_path_dir="/"
    )
    assert local.local and local.argv == ("/bin/sh", "-c", "/bin/sh -s")
    remote = fanout.job("n", {"ansible_become": True}, "/bin/sh -s", "", ssh_args="", control_path_dir="/")
    assert not remote.local and remote.argv[-1] == "sudo -n /bin/sh -s"


def counter_script(tmp_path: Path, rc_first: int) -> Path:
    """A stand-in for ssh: exits RC_FIRST on its first call, then prints its stdin and exits 0."""
    script = tmp_path / "fake-ssh"
    count = tmp_path / "count"
    script.write_text(
        f"#!/bin/sh\nn=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}\n"
        f'[ "$n" = 0 ] && exit {rc_first}\ncat\n'
    )
    script.chmod(0o755)
    return script


def test_ssh_failure_255_is_retried_and_other_failures_are_answers(tmp_path: Path) -> None:
    pauses: list[float] = []
    ssh = counter_script(tmp_path, 255)
    result = fanout.run_one(fanout.Job("a", (str(ssh),), "hello", False), sleep=pauses.append)
    assert (result.rc, result.stdout, result.attempts) == (0, "hello", 2)
    assert len(pauses) == 1 and 0.4 <= pauses[0] <= 0.6
    other = tmp_path / "other"
    other.mkdir()
    failing = counter_script(other, 3)
    result = fanout.run_one(fanout.Job("b", (str(failing),), "", False), sleep=pauses.append)
    assert (result.rc, result.attempts) == (3, 1)


def test_attempts_end_and_a_missing_executable_is_named(tmp_path: Path) -> None:
    always = tmp_path / "always"
    always.write_text("#!/bin/sh\nexit 255\n")
    always.chmod(0o755)
    result = fanout.run_one(fanout.Job("a", (str(always),), "", False), sleep=lambda _: None)
    assert (result.rc, result.attempts) == (255, 3)
    missing = fanout.run_one(fanout.Job("a", ("/nonexistent/ssh",), "", False), sleep=lambda _: None)
    assert missing.rc == 127 and "/nonexistent/ssh" in missing.stderr


def test_run_all_bounds_what_is_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    lock = threading.Lock()
    now = {"local": 0, "remote": 0}
    peak = {"local": 0, "remote": 0}

    def fake(job: fanout.Job, **_: object) -> fanout.Result:
        kind = "local" if job.local else "remote"
        with lock:
            now[kind] += 1
            peak[kind] = max(peak[kind], now[kind])
        time.sleep(0.02)
        with lock:
            now[kind] -= 1
        return fanout.Result(job.name, 0, job.name, "", 1)

    monkeypatch.setattr(fanout, "run_one", fake)
    jobs = [fanout.Job(f"l{i}", ("x",), "", True) for i in range(12)]
    jobs += [fanout.Job(f"r{i}", ("x",), "", False) for i in range(12)]
    results = fanout.run_all(jobs, remote_limit=6, local_limit=2)
    assert sorted(results) == sorted(job.name for job in jobs)
    assert peak["local"] <= 2
    assert peak["remote"] <= 6
    assert peak["local"] == 2 and peak["remote"] > 2  # bounded, not serial
    assert fanout.run_all([]) == {}
