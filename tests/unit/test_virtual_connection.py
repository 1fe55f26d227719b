"""The controller benchmark's virtual servers (bench/virtual, bench/plugins/connection/ddp_virtual.py): a
payload as ansible-core builds it is read back to its module and arguments; through Ansible itself a changing
module changes the server once and a module the stand-in does not know fails the task, loudly; bin/ssh answers
and counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

VIRTUAL = REPO / "bench" / "virtual"
sys.path.insert(0, str(VIRTUAL))

import server  # noqa: E402  (bench/virtual, put on the path above)


def payload(module: str, path: str, args: dict[str, object]) -> bytes:
    """The AnsiballZ wrapper ansible-core sends with pipelining, built by its own module_common."""
    from ansible.executor.module_common import modify_module
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar

    init_plugin_loader()
    built = modify_module(
        module_name=module,
        module_path=path,
        module_args=args,
        templar=Templar(loader=DataLoader()),
        task_vars={"ansible_python_interpreter": "/usr/bin/python3"},
    )
    return bytes(built.b_module_data)


def test_a_real_payload_is_read_back_to_its_module_and_arguments() -> None:
    import ansible.modules.command as command

    args = {"argv": ["docker", "version"], "chdir": "/tmp/a 'quoted'\n\"dir\"", "_ansible_check_mode": True}
    module, found = server.parse_payload(payload("ansible.legacy.command", command.__file__, args))
    assert module == "ansible.legacy.command"
    assert found == args


def test_what_is_not_a_payload_is_refused() -> None:
    with pytest.raises(server.Unknown, match="not an AnsiballZ payload"):
        server.parse_payload(b"#!/usr/bin/python3\nprint('hello')\n")


def test_an_unknown_module_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDP_VIRTUAL_DIR", str(tmp_path))
    with pytest.raises(server.Unknown, match=r"does not know the module ansible\.builtin\.hostname"):
        server.answer("vs0", "ansible.builtin.hostname", {"name": "other"})
    with pytest.raises(server.Unknown, match="does not know the command"):
        server.answer("vs0", "ansible.legacy.command", {"argv": ["reboot"]})


def adhoc(tmp_path: Path, module: str, args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {
        "DDP_VIRTUAL_DIR": str(tmp_path),
        "DDP_VIRTUAL_SERVERS": "2",
        "ANSIBLE_CONNECTION_PLUGINS": str(REPO / "bench" / "plugins" / "connection"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
    }
    ansible = Path(sys.executable).parent / "ansible"
    return subprocess.run(
        [str(ansible), "-i", str(VIRTUAL / "hosts.py"), "vs1", "-m", module, "-a", args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def host_result(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    report = json.loads(done.stdout)
    result: dict[str, object] = report["plays"][0]["tasks"][0]["hosts"]["vs1"]
    return result


def test_through_ansible_a_change_is_kept_and_an_unknown_module_fails(tmp_path: Path) -> None:
    rule = "rule=allow from_ip=10.64.0.1 comment=x"
    first, second = (
        adhoc(tmp_path, "community.general.ufw", rule),
        adhoc(tmp_path, "community.general.ufw", rule),
    )
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert host_result(first)["changed"] is True
    assert host_result(second)["changed"] is False
    # One module run each, sent on stdin (pipelining): one line of the server's log per run.
    log = [json.loads(line) for line in (tmp_path / "vs1" / "log.jsonl").read_text().splitlines()]
    assert log == [{"kind": "module", "what": "community.general.ufw"}] * 2
    unknown = adhoc(tmp_path, "ansible.builtin.hostname", "name=other")
    assert unknown.returncode != 0
    assert "does not know the module ansible.builtin.hostname" in json.dumps(host_result(unknown))


def test_the_ssh_stand_in_answers_from_the_state_and_counts(tmp_path: Path) -> None:
    env = os.environ | {"DDP_VIRTUAL_DIR": str(tmp_path)}
    ssh = [
        sys.executable,
        str(VIRTUAL / "bin" / "ssh"),
        "-o",
        "ControlMaster=auto",
        "-p",
        "22",
        "root@10.64.0.3",
    ]
    done = subprocess.run([*ssh, "docker", "version"], env=env, capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (0, server.DOCKER_VERSION + "\n")
    refused = subprocess.run([*ssh, "reboot"], env=env, capture_output=True, text=True, check=False)
    assert refused.returncode == 255
    assert "does not know the command" in refused.stderr
    assert len((tmp_path / "vs2" / "log.jsonl").read_text().splitlines()) == 2
