"""The controller's registry (ddp_cluster.image.distribute, run by the role's module ddp_image_distribute)
started and stopped for real: Docker's Distribution registry, no engine needed, skipped without it. With the
local end-to-end tests (make e2e), which install it first (make registry); the rest of the module's pieces:
tests/unit/test_image_distribute.py."""

from __future__ import annotations

import shutil
import socket
import urllib.request
from pathlib import Path

import pytest

from ddp_cluster.image import distribute as dist


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.skipif(
    shutil.which("docker-registry") is None, reason="docker-registry is not installed (make docker)"
)
def test_the_controllers_registry_answers_on_loopback_only_while_the_stage_runs(tmp_path: Path) -> None:
    port = _free_port()
    with dist.controller_registry("docker-registry", str(tmp_path / "storage"), port, str(tmp_path)):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=5) as answer:
            assert answer.status == 200
        listening = Path("/proc/net/tcp").read_text()
        assert f"0100007F:{port:04X}" in listening  # 127.0.0.1 only
        assert f"00000000:{port:04X}" not in listening
    assert dist.port_free(port)
    # Stopped also when the block fails.
    with (
        pytest.raises(RuntimeError),
        dist.controller_registry("docker-registry", str(tmp_path / "storage"), port, str(tmp_path)),
    ):
        raise RuntimeError("a push failed")
    assert dist.port_free(port)
