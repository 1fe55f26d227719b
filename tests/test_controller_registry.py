"""The controller's registry (ddp_cluster.image.distribute, run by the role's module ddp_image_distribute)
started and stopped for real: Docker's Distribution registry, no engine needed, skipped without it. With the
local end-to-end tests (make e2e), which install it first (make registry); the rest of the module's pieces:
tests/unit/test_image_distribute.py."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ddp_cluster.image import distribute as dist

pytestmark = pytest.mark.skipif(
    shutil.which("docker-registry") is None, reason="docker-registry is not installed (make docker)"
)

DIGEST = "sha256:6087a7c117ca9ea0ac4b4e3b45534ac95779d8b0ca533dfdff6a1cc1e293bcc4"
BUILT_ID = "sha256:2ada85227f55b01da1014b2f82fb37d388f0511e20173b6555aa40f2b19e371e"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def status(port: int, auth: str = "") -> int:
    """The registry's answer to /v2/, logged in with ``auth`` (base64 USER:PASSWORD) or not."""
    headers = {"Authorization": f"Basic {auth}"} if auth else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_the_controllers_registry_answers_on_loopback_only_while_the_stage_runs_and_only_to_its_password(
    tmp_path: Path,
) -> None:
    port = _free_port()
    password = dist.registry_password()
    with dist.controller_registry(
        "docker-registry", str(tmp_path / "storage"), port, str(tmp_path), password
    ):
        assert status(port, dist.registry_auth(password)) == 200
        # Anything else on the loopback (a node container on the host network) is refused: no pull, no push.
        assert status(port) == 401
        assert status(port, dist.registry_auth("guessed")) == 401
        assert status(port, base64.b64encode(f"admin:{password}".encode()).decode()) == 401
        listening = Path("/proc/net/tcp").read_text()
        assert f"0100007F:{port:04X}" in listening  # 127.0.0.1 only
        assert f"00000000:{port:04X}" not in listening
    assert dist.port_free(port)
    # Stopped also when the block fails.
    with (
        pytest.raises(RuntimeError),
        dist.controller_registry("docker-registry", str(tmp_path / "storage"), port, str(tmp_path), password),
    ):
        raise RuntimeError("a push failed")
    assert dist.port_free(port)


# docker double: the image's ID; a push logged in by its own configuration (the login is tried against the
# running registry) that says a digest; tag and rmi do nothing.
DOCKER = f"""#!{sys.executable}
import json, os, sys, urllib.error, urllib.request
args = sys.argv[1:]
with open(os.environ["DDP_FAKE_LOG"], "a") as log:
    print(json.dumps({{"argv": args, "DOCKER_CONFIG": os.environ.get("DOCKER_CONFIG", "")}}), file=log)
if args[:2] == ["image", "inspect"]:
    print("{BUILT_ID}")
elif args[0] == "push":
    registry = args[1].split("/")[0]
    with open(os.path.join(os.environ["DOCKER_CONFIG"], "config.json")) as handle:
        auth = json.load(handle)["auths"][registry]["auth"]
    request = urllib.request.Request(f"http://{{registry}}/v2/", headers={{"Authorization": "Basic " + auth}})
    urllib.request.urlopen(request, timeout=5)
    print("02c5ea5f2dfa: Pushed")
    print("ab12: digest: {DIGEST} size: 1573")
"""

# ssh double: a server whose pull reads the login on its stdin and tries the registry with and without it.
SSH = f"""#!{sys.executable}
import json, os, re, sys, urllib.error, urllib.request
command = sys.argv[-1]
auth = sys.stdin.readline().strip()
port = re.search(r"127\\.0\\.0\\.1:(\\d+)/", command).group(1)
answers = {{}}
for name, headers in (("with", {{"Authorization": "Basic " + auth}}), ("without", {{}})):
    try:
        answers[name] = urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{{port}}/v2/", headers=headers), timeout=5
        ).status
    except urllib.error.HTTPError as error:
        answers[name] = error.code
with open(os.environ["DDP_FAKE_LOG"], "a") as log:
    print(json.dumps({{"ssh": sys.argv[1:], "answers": answers}}), file=log)
print("0123456789ab: Pull complete")
print("pulled: " + command.split(" ddp-pull ")[1].split()[0])
"""


def test_the_servers_pull_by_digest_logged_in_with_the_password_of_this_run_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("docker", DOCKER), ("ssh", SSH)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("DDP_FAKE_LOG", str(log))
    port = _free_port()
    params = {"image": "ddp-cluster/node:ab12", "servers": [{"name": "s1", "ssh": ["ssh", "s1"]}],
              "registry": "", "port": port, "registry_command": "docker-registry",
              "storage": str(tmp_path / "storage"), "parallel": 4, "timeout": 60, "source": None,
              "source_address": "", "source_script": "", "receiver_script": "PULL"}  # fmt: skip
    failed, report = dist.run(params, check_mode=False)
    assert not failed and report["failed_servers"] == [], report
    assert (report["digest"], report["image_id"]) == (DIGEST, BUILT_ID)
    assert report["servers"]["s1"]["pulled"] == f"127.0.0.1:{port}/ddp-cluster/node@{DIGEST}"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    push = next(call for call in calls if call.get("argv", [""])[0] == "push")
    assert push["DOCKER_CONFIG"] and not Path(push["DOCKER_CONFIG"]).exists()  # its own, removed after
    pull = next(call for call in calls if "ssh" in call)
    # The server's login works, nothing without it; the pull names the digest and the built image's ID.
    assert pull["answers"] == {"with": 200, "without": 401}
    command = pull["ssh"][-1]
    assert f"127.0.0.1:{port}/ddp-cluster/node@{DIGEST} ddp-cluster/node:ab12 {BUILT_ID}" in command
    assert pull["ssh"][pull["ssh"].index("-R") + 1] == f"127.0.0.1:{port}:127.0.0.1:{port}"
    assert dist.port_free(port)
