"""ddp_cluster.inventory.lock: one site.yml at a time per cluster. Which playbooks take the lock, one lock
file per inventory, a second holder refused naming the first (another process: flock is per open file), the
lock free again when its holder exits, even killed. The callback that takes it in a playbook run is tested in
tests/unit/test_cluster_lock_callback.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_cluster.inventory import lock
from ddp_cluster.inventory.lock import ClusterLocked, Holder

SOURCES = ["/repo/inventories/local"]

# Another process that takes the lock and holds it until killed: what a running site.yml is to a second one.
HOLD = """
import sys, time
from pathlib import Path
from ddp_cluster.inventory import lock
lock.acquire(sys.argv[2:], "site.yml", "ansible-playbook site.yml -e x=1", folder=Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture(autouse=True)
def nothing_held() -> Iterator[None]:
    yield
    for held in list(lock._HELD.values()):
        held.release()


def hold(folder: Path, sources: list[str]) -> subprocess.Popen[str]:
    """A process holding the lock of ``sources`` (its pid is the holder's)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder), *sources], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize(
    ("playbook", "takes"),
    [
        ("site.yml", True),
        ("/repo/site.yml", True),
        ("/repo/playbooks/containers.yml", True),
        ("playbooks/teardown.yml", True),
        ("/repo/train.yml", False),
        ("jobs.yml", False),
        ("check.yml", False),
        ("/repo/molecule/node_container/converge.yml", False),
    ],
)
def test_site_and_its_stages_take_the_lock_the_job_playbooks_do_not(playbook: str, takes: bool) -> None:
    assert lock.takes_lock(playbook) is takes


def test_one_lock_file_per_inventory_however_it_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    a, b = str(tmp_path / "inventories" / "a"), str(tmp_path / "inventories" / "b")
    assert lock.lock_path([a, b], tmp_path) == lock.lock_path([b, "inventories/a"], tmp_path)
    assert lock.lock_path([a], tmp_path) != lock.lock_path([b], tmp_path)
    assert lock.lock_path(["node0,node1,"], tmp_path) != lock.lock_path(["node0,"], tmp_path)
    assert lock.lock_path([a], tmp_path).parent == tmp_path
    monkeypatch.setenv("HOME", str(tmp_path))
    assert lock.lock_path([a]).parent == tmp_path / ".ddp-cluster" / "locks"


def test_the_holder_is_written_and_the_same_process_finds_its_own_lock(tmp_path: Path) -> None:
    held = lock.acquire(SOURCES, "/repo/site.yml", "ansible-playbook site.yml", folder=tmp_path)
    holder = lock.holder_of(SOURCES, tmp_path)
    assert holder is not None
    assert (holder.pid, holder.command, holder.inventory, holder.playbook) == (
        os.getpid(),
        "ansible-playbook site.yml",
        tuple(SOURCES),
        "/repo/site.yml",
    )
    assert time.time() - holder.started < 60
    # `ansible-playbook site.yml train.yml`: the second playbook of the same run holds it already.
    assert lock.acquire(SOURCES, "/repo/playbooks/mesh.yml", "x", folder=tmp_path) is held
    held.release()
    again = lock.acquire(SOURCES, "/repo/site.yml", "again", folder=tmp_path)
    assert again is not held and lock.holder_of(SOURCES, tmp_path).command == "again"


def test_a_second_run_is_refused_naming_the_first_then_runs_once_it_ended(tmp_path: Path) -> None:
    first = hold(tmp_path, SOURCES)
    try:
        with pytest.raises(ClusterLocked) as refused:
            lock.acquire(SOURCES, "/repo/site.yml", "ansible-playbook site.yml", folder=tmp_path)
        message = str(refused.value)
        path = lock.lock_path(SOURCES, tmp_path)
        assert message.startswith(
            f"site.yml: another run of the cluster's playbooks holds its lock ({path}): "
        )
        assert f"pid {first.pid}, started " in message
        assert "`ansible-playbook site.yml -e x=1`, inventory /repo/inventories/local." in message
        assert f"while kill -0 {first.pid} 2>/dev/null; do sleep 10; done" in message
        assert "Nothing was changed." in message
        # The refused run did not erase who holds it.
        assert lock.holder_of(SOURCES, tmp_path).pid == first.pid
        # Another inventory is another cluster.
        lock.acquire(["/repo/inventories/other"], "site.yml", "x", folder=tmp_path).release()
    finally:
        first.kill()  # a crash: no clean-up of its own
        first.wait()
    lock.acquire(SOURCES, "/repo/site.yml", "ansible-playbook site.yml", folder=tmp_path)
    assert lock.holder_of(SOURCES, tmp_path).pid == os.getpid()


def test_a_holder_that_is_gone_while_the_lock_is_held_points_at_its_children(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = int(done.stdout)
    holder = Holder(gone, time.time(), "ansible-playbook site.yml", ("/inv",), "site.yml")
    message = lock.refusal(holder, tmp_path / "x.lock", ["/inv"], "playbooks/containers.yml")
    assert message.startswith("containers.yml: another run of the cluster's playbooks holds its lock")
    assert f"Process {gone} is gone, but a process it started still holds the lock" in message
    assert f"`fuser -v {tmp_path / 'x.lock'}` names it" in message
    assert "it has not written who it is yet" in lock.refusal(None, tmp_path / "x.lock", ["/inv"], "site.yml")


def test_a_lock_file_that_names_no_holder_reads_as_none() -> None:
    assert Holder.from_text("") is None and Holder.from_text("{}") is None and Holder.from_text("[1]") is None
    holder = Holder(7, 1.5, "c", ("i",), "p")
    assert Holder.from_text(holder.to_json()) == holder


def test_alive_tells_a_live_process_from_a_gone_one() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert lock.alive(proc.pid)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not lock.alive(proc.pid)
