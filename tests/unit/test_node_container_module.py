"""The node_container role's one-run-per-node module (roles/node_container/library/ddp_node_container.py): the
`docker create` arguments it builds from the role's specification, and its refusal without a docker CLI. The
container itself runs in molecule's node_container scenario and the e2e tests (tests/test_site_scale.py counts
the runs)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "roles" / "node_container" / "library" / "ddp_node_container.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ddp_node_container", MODULE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPEC: dict[str, Any] = {
    "name": "node0",
    "hostname": "node0",
    "image": "ddp-cluster/node:abc",
    "restart_policy": "unless-stopped",
    "init": True,
    "ipc_mode": "host",
    "shm_size": "",
    "ulimits": ["memlock:-1:-1", "stack:67108864:67108864"],
    "runtime": "",
    "env": {"DDP_SSH_PORT": "12345", "ASCEND_VISIBLE_DEVICES": "0,1"},
    "network": "host",
    "aliases": [],
    "etc_hosts": {"node1": "10.0.0.2", "node0": "10.0.0.1"},
    "volumes": ["/var/lib/ddp-cluster/node0/workspace:/workspace"],
    "devices": ["/dev/infiniband:/dev/infiniband:rwm"],
    "device_requests": [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}],
    "labels": {"ddp-cluster.node": "node0"},
}


def pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[index + 1] for index, word in enumerate(argv) if word == flag]


def test_create_arguments_carry_the_whole_specification() -> None:
    argv = load().run_argv(SPEC, '{"the":"label"}')
    assert argv[:5] == ["create", "--name", "node0", "--hostname", "node0"]
    assert argv[-1] == "ddp-cluster/node:abc"
    assert "--init" in argv and "--shm-size" not in argv and "--runtime" not in argv
    assert pairs(argv, "--ulimit") == ["memlock=-1:-1", "stack=67108864:67108864"]
    assert pairs(argv, "--env") == ["ASCEND_VISIBLE_DEVICES=0,1", "DDP_SSH_PORT=12345"]
    assert pairs(argv, "--add-host") == ["node0:10.0.0.1", "node1:10.0.0.2"]
    assert pairs(argv, "--network") == ["host"] and pairs(argv, "--ipc") == ["host"]
    assert pairs(argv, "--device") == ["/dev/infiniband:/dev/infiniband:rwm"]
    assert pairs(argv, "--gpus") == ["count=all,driver=nvidia,capabilities=gpu"]
    assert pairs(argv, "--label") == ["ddp-cluster.node=node0", 'ddp-cluster.spec={"the":"label"}']


@pytest.mark.parametrize(
    ("request_", "option"),
    [
        (
            {"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]},
            "count=all,driver=nvidia,capabilities=gpu",
        ),
        ({"count": 2}, "count=2"),
        (
            {"device_ids": ["0", "3"], "capabilities": [["gpu", "utility"]]},
            '"device=0,3","capabilities=gpu,utility"',
        ),
    ],
)
def test_device_requests_become_the_cli_gpus_option(request_: dict[str, Any], option: str) -> None:
    assert load().gpus_option(request_) == option


def test_two_capability_sets_are_refused() -> None:
    module = load()
    with pytest.raises(module.Failure, match="more than one set of capabilities"):
        module.gpus_option({"capabilities": [["gpu"], ["compute"]]})


def test_without_a_docker_cli_nothing_is_touched(tmp_path: Path) -> None:
    node = tmp_path / "node0"
    arguments = tmp_path / "args.json"
    arguments.write_text(
        json.dumps(
            {
                "ANSIBLE_MODULE_ARGS": {
                    "directories": [{"path": str(node / "etc"), "mode": "0755"}],
                    "settings": {"path": str(node / "etc" / "node.env"), "content": "x\n", "mode": "0644"},
                    "container": SPEC,
                    "sshd": {"port": 12345, "timeout": 5, "probe": "true"},
                }
            }
        )
    )
    done = subprocess.run(
        [sys.executable, str(MODULE), str(arguments)],
        capture_output=True,
        text=True,
        env={"PATH": str(tmp_path)},
        check=False,
    )
    result = json.loads(done.stdout)
    assert result["failed"] and "docker CLI is not on this server's PATH" in result["msg"]
    assert not node.exists()
