"""Each bad setting stops preflight with a message that names the host and the variable; good ones pass."""

import os
import shlex

import pytest

PLAY = os.path.join(os.path.dirname(__file__), "..", "converge.yml")


def preflight(host, **settings):
    inventory = os.environ["MOLECULE_INVENTORY_FILE"]
    extra = " ".join(f"-e {shlex.quote(f'{key}={value}')}" for key, value in settings.items())
    return host.run(f"ansible-playbook -i {inventory} {PLAY} {extra}")


def test_valid_settings_pass(host):
    result = preflight(host)
    assert result.rc == 0, result.stdout[-2000:]
    assert "changed=0" in result.stdout


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("cluster_accelerator", "tpu", "engine: cluster_accelerator=tpu is unknown"),
        ("cluster_ssh_port", "0", "engine: cluster_ssh_port=0 is not a port"),
        ("cluster_master_port", "65536", "engine: cluster_master_port=65536 is not a port"),
        ("cluster_nproc_per_node", "-2", "engine: cluster_nproc_per_node=-2 is not allowed"),
        ("cluster_network_mode", "overlay", "engine: cluster_network_mode=overlay does not fit"),
    ],
)
def test_bad_setting_is_named(host, setting, value, message):
    result = preflight(host, **{setting: value})
    assert result.rc != 0
    assert message in result.stdout + result.stderr, result.stdout[-2000:]


def test_engine_that_does_not_answer_is_named(host):
    inventory = os.environ["MOLECULE_INVENTORY_FILE"]
    result = host.run(f"DOCKER_HOST=unix:///nonexistent.sock ansible-playbook -i {inventory} {PLAY}")
    assert result.rc != 0
    assert "engine: no Docker engine answers" in result.stdout + result.stderr
