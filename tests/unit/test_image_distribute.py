"""The image stage's registry distribution (ddp_cluster.image.distribute, the role's module
ddp_image_distribute ships it as module_utils), each server's side of it (the role's files/pull-image.sh, with
a docker double) and the ssh targets it logs in with (plugins/filter/ddp_cluster.py): the pieces, without a
registry or an engine, and the module run by Ansible; and the stage's secrets (the registry's password, the
pip arguments) kept out of argv, Ansible's output and the image. The controller's registry started and stopped
for real: tests/test_controller_registry.py; the whole path runs on the simulated servers
(tests/sim/test_sim_5_image.py)."""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import importlib.util
import json
import os
import re
import shlex
import socket
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from rolemodule import run_role_module

from ddp_cluster.image import distribute as dist

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "training_image"
PULL_SCRIPT = ROLE / "files" / "pull-image.sh"
PULL = dist.with_listeners(PULL_SCRIPT.read_text())  # as the controller sends it
DIGEST = "sha256:6087a7c117ca9ea0ac4b4e3b45534ac95779d8b0ca533dfdff6a1cc1e293bcc4"
BUILT_ID = "sha256:2ada85227f55b01da1014b2f82fb37d388f0511e20173b6555aa40f2b19e371e"
OTHER_ID = "sha256:" + "e" * 64
PULLED = f"127.0.0.1:15000/ddp-cluster/node@{DIGEST}"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


filters = _load("ddp_cluster_filters_ssh", REPO / "plugins" / "filter" / "ddp_cluster.py")

PULL_ONE_LAYER = """\
2a4e3b1f: Pulling from ddp-cluster/node
0c8d71f0a3b2: Already exists
5e1ab3d4c9f0: Already exists
9f00aa11bb22: Already exists
77aa3c2d1e0f: Pulling fs layer
77aa3c2d1e0f: Verifying Checksum
77aa3c2d1e0f: Download complete
77aa3c2d1e0f: Pull complete
Digest: sha256:0123
Status: Downloaded newer image for 127.0.0.1:15000/ddp-cluster/node:2a4e3b1f
"""


def test_the_servers_pull_from_the_users_registry_or_the_tunnelled_loopback() -> None:
    assert (
        dist.registry_reference("ddp-cluster/node:ab12", "", 15000) == "127.0.0.1:15000/ddp-cluster/node:ab12"
    )
    assert (
        dist.registry_reference("ddp-cluster/node:ab12", "harbor.example.com/ml/", 15000)
        == "harbor.example.com/ml/ddp-cluster/node:ab12"
    )


def test_pulled_layers_are_counted_from_the_pull_output() -> None:
    assert dist.layer_counts(PULL_ONE_LAYER) == (1, 3)
    assert dist.layer_counts("Status: Image is up to date for x\n") == (0, 0)


def test_bytes_served_sum_the_registrys_get_responses() -> None:
    log = (
        'time="t" level=info msg="response completed" http.request.method=GET '
        "http.request.uri=/v2/x/blobs/sha256:a http.response.status=200 http.response.written=1000\n"
        'time="t" level=info msg="response completed" http.request.method=HEAD '
        "http.request.uri=/v2/x/blobs/sha256:b http.response.status=200 http.response.written=0\n"
        'time="t" level=info msg="rewriting manifest" http.request.method=GET '
        "http.request.uri=/v2/x/manifests/1\n"
        'time="t" level=info msg="response completed" http.request.method=GET '
        "http.request.uri=/v2/x/manifests/1 http.response.written=736\n"
        '127.0.0.1 - - [22/Nov/2026:18:50:54 +0000] "GET /v2/x/manifests/1 HTTP/1.1" 200 736 "" "docker"\n'
    )
    assert dist.bytes_served(log) == 1736


def test_the_pull_runs_the_servers_script_over_ssh_with_the_tunnel_only_for_the_controllers_registry() -> (
    None
):
    ssh = ["ssh", "-o", "StrictHostKeyChecking=yes", "-p", "2222", "10.0.0.5"]
    command = dist.pull_command("SCRIPT", PULLED, "ddp-cluster/node:ab", BUILT_ID)
    assert shlex.split(command) == ["sh", "-c", "SCRIPT", "ddp-pull", PULLED, "ddp-cluster/node:ab", BUILT_ID]
    argv = dist.ssh_pull_argv(ssh, command, 15000)
    assert argv[:5] == ssh[:5] and argv[-2:] == ["10.0.0.5", command]
    assert "BatchMode=yes" in argv
    assert argv[argv.index("-R") + 1] == "127.0.0.1:15000:127.0.0.1:15000"
    # A forward sshd could not bind still runs the script, which names the port's holder and sends it nothing
    # (tests/unit/test_registry_listeners.py), rather than ssh ending without saying who holds it.
    assert "ExitOnForwardFailure=yes" not in argv
    assert "-R" not in dist.ssh_pull_argv(ssh, command, None)
    # The registry's login and the tunnel's key travel on stdin, the login first.
    assert dist.pull_input("QVVUSA==") == "QVVUSA==\n"
    assert dist.pull_input("QVVUSA==", "-----BEGIN KEY-----\n") == "QVVUSA==\n-----BEGIN KEY-----\n"


PUSH = f"""The push refers to repository [127.0.0.1:15000/ddp-cluster/node]
02c5ea5f2dfa: Preparing
9f00aa11bb22: Layer already exists
02c5ea5f2dfa: Pushed
ab12: digest: {DIGEST} size: 1573
"""


def test_the_servers_pull_by_the_digest_the_push_said() -> None:
    assert dist.pushed_digest(PUSH, "r") == DIGEST
    with pytest.raises(
        dist.DistributionError, match="did not say the image's digest, which the servers pull by"
    ):
        dist.pushed_digest("02c5ea5f2dfa: Pushed\n", "127.0.0.1:15000/ddp-cluster/node:ab12")
    assert dist.digest_reference("127.0.0.1:15000/ddp-cluster/node:ab12", DIGEST) == PULLED
    assert (
        dist.digest_reference("harbor.example.com:5443/ml/ddp-cluster/node:ab12", DIGEST)
        == f"harbor.example.com:5443/ml/ddp-cluster/node@{DIGEST}"
    )
    assert dist.digest_reference("registry:5000/node", DIGEST) == f"registry:5000/node@{DIGEST}"


def _crypt(password: str, setting: str) -> str:
    library = ctypes.CDLL(ctypes.util.find_library("crypt"))
    library.crypt.restype = ctypes.c_char_p
    library.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    return str(library.crypt(password.encode(), setting.encode()).decode())


def test_the_registrys_password_is_new_each_time_and_stored_as_bcrypt() -> None:
    password = dist.registry_password()
    assert re.fullmatch(r"[0-9a-f]{32}", password) and password != dist.registry_password()
    hashed = dist.bcrypt_hash(password)
    assert re.fullmatch(r"\$2b\$04\$[./A-Za-z0-9]{53}", hashed), hashed
    assert hashed != dist.bcrypt_hash(password)  # salted
    # Checked as the registry checks it: the hash is its own setting.
    assert _crypt(password, hashed) == hashed and _crypt("another", hashed) != hashed
    assert base64.b64decode(dist.registry_auth(password)).decode() == f"ddp-cluster:{password}"


def test_the_push_is_logged_in_by_a_configuration_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = dist.docker_config(str(tmp_path / "docker"), "127.0.0.1:15000", "QVVUSA==")
    path = Path(directory) / "config.json"
    assert json.loads(path.read_text()) == {"auths": {"127.0.0.1:15000": {"auth": "QVVUSA=="}}}
    assert path.stat().st_mode & 0o777 == 0o600 and Path(directory).stat().st_mode & 0o777 == 0o700
    # The engine that built: the default socket unless DOCKER_HOST names one, whatever context the user's
    # configuration (absent from this one) would choose.
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert dist.engine_env(directory) == {"DOCKER_CONTEXT": "default", "DOCKER_CONFIG": directory}
    assert dist.engine_env() == {"DOCKER_CONTEXT": "default"}
    monkeypatch.setenv("DOCKER_HOST", "ssh://root@10.0.0.5")
    assert dist.engine_env(directory) == {"DOCKER_CONFIG": directory}


DOCKER = r"""#!/bin/sh
# docker double: each call and the client configuration it ran with; `image inspect` answers $DDP_FAKE_ID.
{ printf 'docker %s\n' "$*"; printf 'config %s\n' "${DOCKER_CONFIG:-none}"
  [ -n "${DOCKER_CONFIG:-}" ] && cat "$DOCKER_CONFIG/config.json"; } >> "$DDP_FAKE_LOG"
case "$1" in
  pull) echo "0123456789ab: Pull complete"; echo "Digest: ${2#*@}" ;;
  image) echo "$DDP_FAKE_ID" ;;
esac
"""


def run_pull_script(tmp_path: Path, stdin: str, got: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """files/pull-image.sh as a server runs it (no tunnel), with a docker double whose pulled image has the ID
    ``got``; its result and the double's log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(DOCKER)
    (bin_dir / "docker").chmod(0o755)
    log = tmp_path / "docker.log"
    log.unlink(missing_ok=True)
    env = os.environ | {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DDP_FAKE_LOG": str(log),
        "DDP_FAKE_ID": got,
    }
    env.pop("DOCKER_CONFIG", None)
    done = subprocess.run(
        ["sh", "-c", PULL, "ddp-pull", PULLED, "ddp-cluster/node:ab12", BUILT_ID],
        input=stdin, capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    return done, log.read_text()


def test_a_server_pulls_by_digest_logged_in_for_the_pull_only_and_names_the_image_it_checked(
    tmp_path: Path,
) -> None:
    done, log = run_pull_script(tmp_path, "QVVUSA==\n", BUILT_ID)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = [line for line in log.splitlines() if line.startswith("docker ")]
    assert calls == [
        f"docker pull {PULLED}",
        f"docker image inspect --format {{{{.Id}}}} {PULLED}",
        f"docker tag {BUILT_ID} ddp-cluster/node:ab12",
        f"docker rmi {PULLED}",
    ]
    # Logged in to the registry only, in a configuration of its own, gone with the script.
    assert '{"auths": {"127.0.0.1:15000": {"auth": "QVVUSA=="}}}' in log
    config = next(line for line in log.splitlines() if line.startswith("config "))[len("config ") :]
    assert config.startswith("/tmp/ddp-pull.") and not Path(config).exists()
    assert done.stdout.splitlines()[-2:] == [f"pulled: {PULLED}", f"image_id: {BUILT_ID}"]
    result = dist.pull_result(done, 0.0, 60, "")
    assert (result["pulled"], result["image_id"], result["layers_pulled"]) == (PULLED, BUILT_ID, 1)
    # The user's registry: no login line, the server's own configuration.
    done, log = run_pull_script(tmp_path, "\n", BUILT_ID)
    assert done.returncode == 0 and "config none" in log and "auths" not in log


def test_an_image_pulled_by_digest_with_another_id_is_removed_and_refused_naming_both(tmp_path: Path) -> None:
    done, log = run_pull_script(tmp_path, "QVVUSA==\n", OTHER_ID)
    assert done.returncode == dist.WRONG_IMAGE
    calls = [line for line in log.splitlines() if line.startswith("docker ")]
    assert calls[-1] == f"docker rmi {PULLED}" and not any(call.startswith("docker tag") for call in calls)
    said = dist.pull_error(done.returncode, done.stdout + done.stderr, 15000)
    assert said.startswith(f"the image pulled by digest ({PULLED}) has the ID {OTHER_ID}, not {BUILT_ID}"), (
        said
    )
    assert "nothing was named ddp-cluster/node:ab12" in said
    assert dist.receiver_error(done.returncode, done.stdout, "atlas0", 15000) == said


def test_a_tunnel_that_cannot_open_says_what_to_do() -> None:
    error = dist.pull_error(255, "Error: remote port forwarding failed for listen port 15000\n", 15000)
    assert "port 15000 on the server's loopback is taken" in error and "cluster_registry_port" in error
    assert dist.pull_error(
        255, "ssh: connect to host 10.0.0.5 port 22: No route to host\n", 15000
    ).startswith("ssh to the server failed: ssh: connect to host 10.0.0.5")
    assert dist.pull_error(1, "Error response from daemon: manifest unknown\n", None) == (
        "the pull failed (rc 1): Error response from daemon: manifest unknown"
    )


def test_ssh_targets_log_in_as_ansible_does() -> None:
    hostvars = {
        "a": {"ansible_host": "10.0.0.5"},
        "b": {
            "ansible_host": "10.0.0.6",
            "ansible_port": 2222,
            "ansible_user": "admin",
            "ansible_ssh_private_key_file": "/keys/id",
            "ansible_ssh_common_args": "-o UserKnownHostsFile=/k/known_hosts",
            "ansible_ssh_extra_args": "-o ProxyJump=bastion",
        },
        "c": {},
    }
    targets = filters.ssh_targets(hostvars, ["a", "b", "c"])
    assert targets[0] == {"name": "a", "ssh": ["ssh", "-o", "StrictHostKeyChecking=yes", "10.0.0.5"]}
    assert targets[1]["ssh"] == [
        "ssh", "-o", "StrictHostKeyChecking=yes", "-p", "2222", "-l", "admin", "-i", "/keys/id",
        "-o", "UserKnownHostsFile=/k/known_hosts", "-o", "ProxyJump=bastion", "10.0.0.6",
    ]  # fmt: skip
    assert targets[2]["ssh"][-1] == "c"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_taken_port_or_a_missing_registry_is_named(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        taken = pytest.raises(
            dist.DistributionError, match=f"port {port} on the controller's loopback is taken"
        )
        with (
            taken,
            dist.controller_registry("docker-registry", str(tmp_path / "s"), port, str(tmp_path), "pw"),
        ):
            pass
    missing = pytest.raises(dist.DistributionError, match="apt-get install docker-registry")
    with (
        missing,
        dist.controller_registry(
            "/nonexistent/registry", str(tmp_path / "s"), _free_port(), str(tmp_path), "pw"
        ),
    ):
        pass


def test_the_build_servers_address_port_and_user_come_from_its_ssh_targets() -> None:
    argv = ["ssh", "-o", "StrictHostKeyChecking=yes", "-p", "2222", "-l", "ops", "-i", "/k", "10.0.0.5"]
    assert dist.split_ssh(argv) == ("10.0.0.5", "2222", "ops")
    assert dist.split_ssh(["ssh", "admin@atlas0"]) == ("atlas0", "22", "admin")
    assert dist.split_ssh(["ssh", "atlas0"]) == ("atlas0", "22", "")


def test_the_source_sessions_lines_arrive_one_by_one_within_a_deadline() -> None:
    import time

    read, write = os.pipe()
    lines = dist.SessionLines(read)
    os.write(write, b"pushed: 3\nhostkey: ssh-ed25519 AAAA\nready\npartial")
    deadline = time.monotonic() + 2
    # All three lines arrived in one read: each is given without waiting for more from the pipe.
    assert [lines.next(deadline), lines.next(deadline), lines.next(deadline)] == [
        "pushed: 3", "hostkey: ssh-ed25519 AAAA", "ready"
    ]  # fmt: skip
    started = time.monotonic()
    assert lines.next(time.monotonic() + 0.3) is None  # an unfinished line: nothing within the deadline
    assert 0.25 < time.monotonic() - started < 2
    os.close(write)
    assert lines.next(time.monotonic() + 2) == "partial"  # the session ended: its last words
    assert lines.next(time.monotonic() + 2) is None
    os.close(read)


def test_a_server_that_cannot_reach_the_build_server_is_told_what_to_check() -> None:
    said = dist.receiver_error(
        4, "tunnel: ssh: connect to host 10.0.0.5 port 22: No route to host", "atlas0", 15000
    )
    assert "could not reach the image registry on the build server atlas0" in said
    assert (
        "No route to host" in said and "training_image_build_address" in said and "AllowTcpForwarding" in said
    )
    assert dist.receiver_error(1, "manifest unknown", "atlas0", 15000).startswith(
        "the pull from the build server atlas0 failed (rc 1)"
    )


def test_docker_over_ssh_runs_the_servers_docker_through_the_controllers_ssh(tmp_path: Path) -> None:
    import subprocess

    fake = tmp_path / "ssh"
    fake.write_text('#!/bin/sh\nfor word in "$@"; do printf "%s\\n" "$word"; done\n')
    fake.chmod(0o755)
    shim = REPO / "scripts" / "docker-over-ssh"
    env = os.environ | {"PATH": f"{tmp_path}:{os.environ['PATH']}"}
    args = ["-H", "ssh://root@172.30.99.10:2222", "exec", "-i", "node0", "/bin/sh", "-c", "echo 'a b'"]
    done = subprocess.run([str(shim), *args], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == [
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-p", "2222", "-l", "root", "--",
        "172.30.99.10",
        "docker exec -i node0 /bin/sh -c 'echo '\"'\"'a b'\"'\"''",
    ]  # fmt: skip
    refused = subprocess.run([str(shim), "-H", "ssh://root@h", "cp", "node0:/x", "/tmp"], env=env,
                             capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 1 and "cp is not passed through" in refused.stderr
    local = subprocess.run([str(shim), "version"], env=env, capture_output=True, text=True)
    assert local.returncode == 127 and "-H ssh://USER@ADDRESS" in local.stderr


def params(**given: Any) -> dict[str, Any]:
    return {"image": "ddp-cluster/node:ab12", "servers": [], "registry": "", "port": 15000,
            "registry_command": "docker-registry", "storage": "/nonexistent", "parallel": 16, "timeout": 60,
            "source": None, "source_address": "", "source_script": "", "receiver_script": "",
            **given}  # fmt: skip


def test_check_mode_and_no_server_lacking_it_only_name_the_reference() -> None:
    assert dist.run(params(), check_mode=False) == (False, {
        "changed": False, "reference": "127.0.0.1:15000/ddp-cluster/node:ab12", "servers": {},
        "failed_servers": [], "push_seconds": 0.0, "pushed_layers": 0, "bytes_served": 0,
    })  # fmt: skip
    failed, result = dist.run(params(servers=[{"name": "a", "ssh": ["ssh", "a"]}]), check_mode=True)
    assert not failed and result["changed"] and result["servers"] == {}
    source = params(source={"name": "a", "ssh": ["ssh", "a"]}, registry="harbor.example.com")
    assert dist.run(source, check_mode=True)[1]["reference"] == "127.0.0.1:15000/ddp-cluster/node:ab12"


def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, image_id: str = BUILT_ID) -> Path:
    """The docker double first on PATH, the image's ID ``image_id``; its log."""
    bin_dir = tmp_path / "docker-bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(DOCKER)
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("DDP_FAKE_LOG", str(tmp_path / "docker.log"))
    monkeypatch.setenv("DDP_FAKE_ID", image_id)
    return tmp_path / "docker.log"


def test_a_registry_that_cannot_start_fails_the_call_naming_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_docker(tmp_path, monkeypatch)
    given = params(servers=[{"name": "a", "ssh": ["ssh", "a"]}], registry_command="/nonexistent/registry",
                   storage=str(tmp_path / "storage"), port=_free_port())  # fmt: skip
    failed, result = dist.run(given, check_mode=False)
    assert failed and "apt-get install docker-registry" in result["msg"] and result["failed_servers"] == []


def test_every_server_is_pulled_and_the_failed_ones_are_named() -> None:
    servers = [{"name": f"s{index}", "ssh": ["ssh", f"s{index}"]} for index in range(5)]

    def pull_one(server: dict[str, Any]) -> dict[str, Any]:
        return {"ok": server["name"] != "s3"}

    report = dist.pull_everywhere(servers, 2, pull_one)
    assert list(report["servers"]) == ["s0", "s1", "s2", "s3", "s4"] and report["failed_servers"] == ["s3"]


def test_a_pull_past_the_bound_says_so() -> None:
    done = subprocess.CompletedProcess(["ssh"], 124, "0c8d71f0a3b2: Already exists\n", "timed out after 5 s")
    result = dist.pull_result(done, 0.0, 5, "the pull failed")
    assert not result["ok"] and result["layers_present"] == 1
    assert result["error"] == "the pull did not finish within 5 s (training_image_pull_timeout)"
    assert dist.run_bounded(["sleep", "5"], 1).returncode == 124


def test_the_module_runs_through_ansible_with_the_package_as_module_utils() -> None:
    servers = [{"name": "a", "ssh": ["ssh", "a"]}]
    arguments = {
        "image": "ddp-cluster/node:ab12",
        "storage": "/nonexistent",
        "registry": "h.example/ml",
        "servers": servers,
    }
    result = run_role_module("training_image", "ddp_image_distribute", arguments, check=True)
    assert result["changed"] and result["reference"] == "h.example/ml/ddp-cluster/node:ab12", result


SSH = r"""#!/bin/sh
# ssh double: the source's session reads the registry's password (its first line) into $DDP_FAKE_LOG.password,
# says what registry-source.sh says and waits for its stdin to close; each receiver keeps its stdin in
# $DDP_FAKE_LOG.TARGET and pulls, but for srv-down, which cannot reach the source.
prev=
for arg; do target=$prev; prev=$arg; done
printf '%s\n' "$target" "$prev" >> "$DDP_FAKE_LOG"
case "$prev" in
  *ddp-registry*)
    case "$prev" in *ddp-cluster/broken*) echo "error: docker-registry is not installed here"; exit 3 ;; esac
    IFS= read -r password; printf '%s' "$password" > "$DDP_FAKE_LOG.password"
    echo "pushed: 2"
    case "$prev" in *ddp-cluster/nodigest*) ;; *)
      echo "digest: sha256:6087a7c117ca9ea0ac4b4e3b45534ac95779d8b0ca533dfdff6a1cc1e293bcc4"
      echo "image_id: sha256:2ada85227f55b01da1014b2f82fb37d388f0511e20173b6555aa40f2b19e371e" ;;
    esac
    echo "hostkey: ssh-ed25519 AAAAsource"; echo ready
    cat >/dev/null; echo "served: 1234" ;;
  *ddp-pull*)
    cat > "$DDP_FAKE_LOG.$target"
    grep -q "PRIVATE KEY" "$DDP_FAKE_LOG.$target" || exit 9
    [ "$target" = srv-down ] && { echo "tunnel: ssh: connect to host 10.0.0.5: No route" >&2; exit 4; }
    echo "0123456789ab: Pull complete"; echo "fedcba987654: Already exists"
    echo "pulled: $(printf '%s' "$prev" | sed -n 's/.* ddp-pull \([^ ]*\) .*/\1/p')" ;;
esac
"""


def test_a_server_build_is_pulled_by_digest_from_the_build_server_with_its_host_key_pinned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ssh = tmp_path / "ssh"
    ssh.write_text(SSH)
    ssh.chmod(0o755)
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("DDP_FAKE_SSH_LOG", str(log))
    monkeypatch.setenv("DDP_FAKE_LOG", str(log))
    monkeypatch.setattr(dist, "RETRY_DELAYS", (0.0, 0.0, 0.0))
    servers = [{"name": name, "ssh": [str(ssh), name]} for name in ("srv1", "srv-down")]
    given = params(servers=servers, source={"name": "src", "ssh": [str(ssh), "-p", "2222", "admin@src"]},
                   source_address="10.0.0.9", source_script="registry", receiver_script="pull")  # fmt: skip
    failed, report = dist.run(given, check_mode=False)
    assert not failed and report["changed"], report
    assert (report["reference"], report["pushed_layers"], report["bytes_served"]) == (
        "127.0.0.1:15000/ddp-cluster/node:ab12", 2, 1234
    )  # fmt: skip
    assert (report["digest"], report["image_id"]) == (DIGEST, BUILT_ID)
    assert report["servers"]["srv1"]["ok"] and report["servers"]["srv1"]["layers_pulled"] == 1
    assert report["servers"]["srv1"]["pulled"] == PULLED
    assert report["failed_servers"] == ["srv-down"]
    # A tunnel that does not come up may on a later try: srv-down was tried four times, then named.
    assert (report["servers"]["srv1"]["attempts"], report["servers"]["srv-down"]["attempts"]) == (1, 4)
    down = report["servers"]["srv-down"]["error"]
    assert "could not reach the image registry on the build server src" in down and "(tried 4 times)" in down
    receiver = next(line for line in log.read_text().splitlines() if line.startswith("sh -c pull ddp-pull"))
    assert shlex.split(receiver)[3:11] == [
        "ddp-pull", PULLED, "ddp-cluster/node:ab12", BUILT_ID, "15000", "10.0.0.9", "2222", "admin",
    ]  # fmt: skip
    assert "'ssh-ed25519 AAAAsource'" in receiver
    # The registry's password reached the build server on its session's stdin and every server as the login
    # on its stdin, before the key; never in an argv, nor in the report.
    password = Path(f"{log}.password").read_text()
    assert re.fullmatch(r"[0-9a-f]{32}", password)
    auth, key = Path(f"{log}.srv1").read_text().split("\n", 1)
    assert base64.b64decode(auth).decode() == f"ddp-cluster:{password}" and "PRIVATE KEY" in key
    assert password not in log.read_text() and auth not in log.read_text()
    assert password not in json.dumps(report) and auth not in json.dumps(report)
    broken = dict(given, image="ddp-cluster/broken:1")
    assert dist.run(broken, check_mode=False) == (True, {
        "msg": "the build server src: docker-registry is not installed here",
        "reference": "127.0.0.1:15000/ddp-cluster/broken:1", "servers": {}, "failed_servers": [],
    })  # fmt: skip
    failed, said = dist.run(dict(given, image="ddp-cluster/nodigest:1"), check_mode=False)
    assert failed and said["msg"].startswith(
        "the build server src did not say the pushed image's digest and ID"
    )


def _task_list(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every task of a task file, those inside blocks (and their rescue and always) included."""
    found = []
    for task in tasks:
        inner = [*task.get("block", []), *task.get("rescue", []), *task.get("always", [])]
        found += _task_list(inner) if inner else [task]
    return found


# A mention that carries the values (not only asks whether there are any), or a credential.
CARRIES_SECRETS = re.compile(
    r"\btraining_image_pip_args\b(?!\s*\|\s*length)|password|passwd|token|credential", re.IGNORECASE
)


def test_every_task_whose_arguments_carry_pip_arguments_or_credentials_is_no_log() -> None:
    carrying = []
    for path in sorted((ROLE / "tasks").glob("*.yml")):
        for task in _task_list(yaml.safe_load(path.read_text()) or []):
            arguments = {key: value for key, value in task.items() if key not in ("name", "when", "no_log")}
            if CARRIES_SECRETS.search(json.dumps(arguments)):
                carrying.append(task["name"])
                assert task.get("no_log") is True, (
                    f"{path.name}: {task['name']!r} carries secrets without no_log"
                )
    # What the role has now, so that the rule is seen to bite: the wheelhouse's key and the pip arguments'
    # file; the download itself gets only that file's path.
    assert sorted(carrying) == [
        "Hand the pip arguments to the download in a private file",
        "Name the wheelhouse after its inputs",
    ], carrying


def test_the_image_build_gets_no_pip_argument_and_the_image_keeps_no_build_secret() -> None:
    """`docker history` shows every build argument a RUN step sees: the build is given only the base, the
    wheelhouse's path and the OS packages, and the Dockerfile declares no other argument nor a label."""
    tasks = _task_list(yaml.safe_load((ROLE / "tasks" / "build.yml").read_text()))
    build = next(
        task for task in tasks if task.get("community.docker.docker_image", {}).get("source") == "build"
    )
    assert set(build["community.docker.docker_image"]["build"]["args"]) == {
        "BASE_IMAGE",
        "WHEELHOUSE",
        "OS_PACKAGES",
    }
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert set(re.findall(r"^ARG (\w+)", dockerfile, re.MULTILINE)) == {
        "BASE_IMAGE",
        "WHEELHOUSE",
        "OS_PACKAGES",
    }
    assert not re.search(r"^LABEL\b", dockerfile, re.MULTILINE)
    # The wheelhouse stage's files (the requirements, the wheels) stay in that stage: the node image copies
    # the venv alone from it; from the code stage, the package's layer alone (its source, bytecode, manifest).
    assert re.findall(r"^COPY --from=(\w+) (\S+)", dockerfile, re.MULTILINE) == [
        ("deps", "/opt/venv"),
        ("code", "/layer/"),
    ]


def test_what_passes_is_tried_again_and_a_wrong_image_never() -> None:
    kex = "kex_exchange_identification: Connection closed by remote host\n"
    assert dist.passing(255, kex) and dist.passing(255, "ssh: connect to host a port 22: Connection refused")
    assert dist.passing(
        dist.TUNNEL_DOWN, "tunnel: kex_exchange_identification: read: Connection reset by peer"
    )
    assert dist.passing(1, 'Get "http://127.0.0.1:15000/v2/": EOF')
    assert dist.passing(
        1, "error pulling image configuration: download failed after attempts=6: unexpected EOF"
    )
    # The same next time: an image that is not the one built, a pull past its bound, a refused login or host
    # key, a taken port, a manifest the registry does not have.
    assert not dist.passing(dist.WRONG_IMAGE, "error: the image pulled by digest ... Connection reset")
    assert not dist.passing(124, "Connection reset by peer")
    assert not dist.passing(255, "root@10.0.0.5: Permission denied (publickey).")
    assert not dist.passing(255, "Host key verification failed.")
    assert not dist.passing(255, "Error: remote port forwarding failed for listen port 15000")
    assert not dist.passing(1, "Error response from daemon: manifest unknown")
    assert not dist.passing(0, "")


def test_retries_wait_two_four_and_eight_seconds_with_a_jitter_and_count_the_attempts() -> None:
    assert [dist.retry_delay(attempt, lambda low, high: high) for attempt in (1, 2, 3)] == [3.0, 6.0, 12.0]
    assert [dist.retry_delay(attempt, lambda low, high: low) for attempt in (1, 2, 3)] == [2.0, 4.0, 8.0]
    waited: list[float] = []
    outcomes = iter([(False, True), (False, True), (True, False)])

    def attempt() -> tuple[dict[str, Any], bool]:
        ok, transient = next(outcomes)
        return {"ok": ok, "error": "" if ok else "dropped"}, transient

    result = dist.with_retries(attempt, sleep=waited.append)
    assert result["ok"] and result["attempts"] == 3 and len(waited) == 2
    assert 2.0 <= waited[0] <= 3.0 and 4.0 <= waited[1] <= 6.0
    # Never more than three retries; a failure that does not pass is not tried again.
    waited.clear()
    result = dist.with_retries(lambda: ({"ok": False, "error": "dropped"}, True), sleep=waited.append)
    assert result["attempts"] == 4 and len(waited) == 3 and result["error"] == "dropped (tried 4 times)"
    result = dist.with_retries(lambda: ({"ok": False, "error": "wrong image"}, False), sleep=waited.append)
    assert result["attempts"] == 1 and result["error"] == "wrong image" and len(waited) == 3


# The receivers of a server build, each as slow as a real handshake: every one marks itself in flight from its
# ssh's start until its tunnel is up (a file per process in $DDP_FAKE_LOG.inflight) and writes how many are in
# flight then; srv-flaky is dropped by sshd on its first try, srv-wrong gets another image.
GATED_SSH = r"""#!/bin/sh
prev=
for arg; do target=$prev; prev=$arg; done
case "$prev" in
  *ddp-registry*)
    IFS= read -r password
    echo "pushed: 2"
    echo "digest: sha256:6087a7c117ca9ea0ac4b4e3b45534ac95779d8b0ca533dfdff6a1cc1e293bcc4"
    echo "image_id: sha256:2ada85227f55b01da1014b2f82fb37d388f0511e20173b6555aa40f2b19e371e"
    echo "hostkey: ssh-ed25519 AAAAsource"; echo ready
    cat >/dev/null; echo "served: 1" ;;
  *ddp-pull*)
    cat >/dev/null
    echo "$target" >> "$DDP_FAKE_LOG.tries"
    inflight=$DDP_FAKE_LOG.inflight
    mkdir -p "$inflight"; : > "$inflight/$$"
    ls "$inflight" | wc -l >> "$DDP_FAKE_LOG.counts"
    sleep "${DDP_FAKE_HANDSHAKE:-0.2}"
    rm -f "$inflight/$$"
    if [ "$target" = srv-flaky ] && [ "$(grep -cx srv-flaky "$DDP_FAKE_LOG.tries")" = 1 ]; then
      echo "kex_exchange_identification: Connection closed by remote host" >&2; exit 255
    fi
    echo "tunnel: up"
    [ "$target" = srv-wrong ] && { echo "error: the image pulled by digest has another ID"; exit 5; }
    sleep 0.2
    echo "0123456789ab: Pull complete"
    echo "pulled: $(printf '%s' "$prev" | sed -n 's/.* ddp-pull \([^ ]*\) .*/\1/p')" ;;
esac
"""


def run_gated_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: list[str]
) -> tuple[dict[str, Any], list[int], list[str]]:
    """A server build to ``names``, 32 pulls at a time: the report, the numbers in flight each receiver saw,
    and the receivers in the order they were tried."""
    ssh = tmp_path / "ssh"
    ssh.write_text(GATED_SSH)
    ssh.chmod(0o755)
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("DDP_FAKE_LOG", str(log))
    servers = [{"name": name, "ssh": [str(ssh), name]} for name in names]
    given = params(servers=servers, source={"name": "src", "ssh": [str(ssh), "src"]}, parallel=32,
                   source_address="10.0.0.9", source_script="registry", receiver_script="pull")  # fmt: skip
    failed, report = dist.run(given, check_mode=False)
    assert not failed, report
    counts = [int(line) for line in Path(f"{log}.counts").read_text().split()]
    return report, counts, Path(f"{log}.tries").read_text().split()


def test_no_more_than_eight_pulls_are_in_their_handshakes_with_the_build_servers_sshd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dist, "RETRY_DELAYS", (0.0, 0.0, 0.0))
    names = [f"srv{index}" for index in range(30)] + ["srv-flaky", "srv-wrong"]
    report, counts, tries = run_gated_distribution(tmp_path, monkeypatch, names)
    assert len(counts) == 33 and max(counts) <= dist.HANDSHAKES_PER_SSHD, counts
    assert report["failed_servers"] == ["srv-wrong"]
    # srv-flaky's first tunnel was dropped in its handshake: tried again, pulled; the wrong image never.
    assert tries.count("srv-flaky") == 2 and tries.count("srv-wrong") == 1
    flaky, wrong = report["servers"]["srv-flaky"], report["servers"]["srv-wrong"]
    assert (flaky["ok"], flaky["attempts"], wrong["attempts"]) == (True, 2, 1)
    assert all(report["servers"][name]["attempts"] == 1 for name in names[:30])
    # The same pulls without the gate (one as wide as the pulls): the handshakes pile up on the one sshd
    # (slower ones here, so that a busy machine starts more than 8 of them within one).
    monkeypatch.setattr(dist, "HANDSHAKES_PER_SSHD", 64)
    monkeypatch.setenv("DDP_FAKE_HANDSHAKE", "2")
    (tmp_path / "ungated").mkdir()
    _, ungated, _ = run_gated_distribution(tmp_path / "ungated", monkeypatch, names[:30])
    assert max(ungated) > 8, ungated
