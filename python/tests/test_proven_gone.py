"""A node proven gone (supervisor.remote Mesh.proven_gone): logins staggered GONE_STAGGER apart, the first
conclusive one decides; silence (a login that times out) proves nothing. Against a stand-in ssh whose logins
time out until a given moment (the dead node's neighbour entry lapsing), then say what the test scripts."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from ddp_cluster.supervisor import remote

FAKE_SSH = """#!{python}
# a login begun before $LAPSE (epoch seconds) only times out after $WAIT s; one begun after says $SAID
import os, sys, time
if time.time() < float(os.environ["LAPSE"]):
    time.sleep(float(os.environ["WAIT"]))
    sys.stderr.write("ssh: connect to host 10.0.0.9 port 22: Connection timed out\\n")
    sys.exit(255)
time.sleep(0.3)
sys.stderr.write(os.environ["SAID"] + "\\n")
sys.exit(int(os.environ["RC"]))
"""


def mesh_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lapse_in: float, said: str, rc: int
) -> remote.Mesh:
    script = tmp_path / "ssh"
    script.write_text(FAKE_SSH.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("LAPSE", f"{time.time() + lapse_in:.3f}")
    monkeypatch.setenv("WAIT", "4")
    monkeypatch.setenv("SAID", said)
    monkeypatch.setenv("RC", str(rc))
    mesh = remote.Mesh("node1")
    monkeypatch.setattr(mesh, "ssh", lambda node, *options, connect=None: [str(script), node])
    return mesh


@pytest.mark.parametrize(
    ("said", "rc", "gone"),
    [
        ("ssh: connect to host 10.0.0.9 port 22: No route to host", 255, True),
        ("ssh: Could not resolve hostname node0: Name or service not known", 255, True),
        ("", 0, False),  # it answered
        ("root@node0: Permission denied (publickey).", 255, False),  # it refused the login: it is there
    ],
)
def test_the_first_conclusive_login_decides_without_waiting_for_the_silent_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, said: str, rc: int, gone: bool
) -> None:
    # the first two logins begin while the entry is held (each silent for 4 s); the third, 2 s in, is answered
    mesh = mesh_with(tmp_path, monkeypatch, 1.5, said, rc)
    began = time.monotonic()
    assert mesh.proven_gone("node0") is gone
    took = time.monotonic() - began
    assert took < 3.5, f"{took:.1f} s: the proof waited for a silent login's bound"


def test_silence_alone_proves_nothing_within_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "GONE_WAIT", 2)
    monkeypatch.setattr(remote, "GONE_WITHIN", 5.0)
    mesh = mesh_with(tmp_path, monkeypatch, 60, "never said", 255)
    monkeypatch.setenv("WAIT", "1")
    began = time.monotonic()
    assert mesh.proven_gone("node0") is False
    assert time.monotonic() - began < 5 + 1


def test_this_node_is_never_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mesh = mesh_with(tmp_path, monkeypatch, 0, "No route to host", 255)
    assert mesh.proven_gone("node1") is False
