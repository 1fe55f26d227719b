"""One site.yml at a time per cluster: an exclusive lock on the controller, keyed by the inventory.

Two site.yml runs against the same servers would each compare and replace the node containers, write the same
settings files and the mesh's keys: whichever ends last wins, half of each run's work is lost, and a run may
remove a container the other has just started. So site.yml (and its stages run alone, ``playbooks/*.yml``)
takes ``~/.ddp-cluster/locks/<hash of the inventory sources' absolute paths>.lock`` with ``flock``
(exclusive, not waiting) before its first task and holds it until its process exits; the file says who holds
it (pid, start time, command, inventory). A second run fails at once with that, before anything changes. The
kernel releases a flock when its holder exits, however it exits: a crashed run leaves no stale lock, only a
file that says who held it last. train.yml, jobs.yml and check.yml take no lock (a job's nodes are claimed on
the nodes).

Runs on the controller, called by plugins/callback/ddp_cluster_lock.py (a shim). Standard library only.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ddp_cluster.errors import DdpClusterError

# The playbooks that change the cluster's servers: site.yml, and its stages when run alone.
LOCKING_PLAYBOOKS = ("site.yml",)
STAGES_DIR = "playbooks"
# Where a second run says to look, and how long to tell a user to sleep between looks.
POLL_HINT_S = 10


class ClusterLocked(DdpClusterError):
    """Another run holds the cluster's lock; the message names it and how to go on."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a cluster's lock, as its file says."""

    pid: int
    started: float
    command: str
    inventory: tuple[str, ...]
    playbook: str

    def to_json(self) -> str:
        return json.dumps(
            {
                "pid": self.pid,
                "started": self.started,
                "command": self.command,
                "inventory": list(self.inventory),
                "playbook": self.playbook,
            },
            sort_keys=True,
        )

    @classmethod
    def from_text(cls, text: str) -> Holder | None:
        """The holder a lock file names; None when it names none (empty: being written, or not ours)."""
        try:
            data = json.loads(text)
            return cls(
                pid=int(data["pid"]),
                started=float(data["started"]),
                command=str(data.get("command", "")),
                inventory=tuple(str(source) for source in data.get("inventory") or ()),
                playbook=str(data.get("playbook", "")),
            )
        except (ValueError, TypeError, KeyError):
            return None


def takes_lock(playbook: str) -> bool:
    """Whether running ``playbook`` (its path) takes the cluster's lock: site.yml and the stages under
    playbooks/; not train.yml, jobs.yml, check.yml."""
    path = Path(playbook)
    return path.name in LOCKING_PLAYBOOKS or path.parent.name == STAGES_DIR


def locks_dir() -> Path:
    """The controller's folder of cluster locks, beside its clusters' key folders."""
    return Path.home() / ".ddp-cluster" / "locks"


def lock_path(sources: Sequence[str], folder: Path | None = None) -> Path:
    """The lock file of the cluster that the inventory ``sources`` name (files, folders or a host list, as
    ``-i`` takes them): the same sources, in any order and however spelled relative to here, the same file."""
    keys = sorted(source if "," in source else os.path.abspath(source) for source in sources)
    digest = hashlib.sha256("\n".join(keys).encode("utf-8")).hexdigest()[:24]
    return (folder or locks_dir()) / f"{digest}.lock"


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def refusal(holder: Holder | None, path: Path, sources: Sequence[str], playbook: str) -> str:
    """Why this run of ``playbook`` does not start while ``holder`` holds the lock at ``path``, and how to go
    on."""
    inventory = ", ".join(sources) or "(none)"
    head = f"{Path(playbook).name}: another run of the cluster's playbooks holds its lock ({path})"
    if holder is None:
        return (
            f"{head}, inventory {inventory}; it has not written who it is yet. Wait for it to end, then run "
            f"{Path(playbook).name} again; nothing was changed."
        )
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(holder.started))
    named = (
        f"{head}: pid {holder.pid}, started {when}, `{holder.command}`, inventory "
        f"{', '.join(holder.inventory) or inventory}."
    )
    wait = (
        f" Wait for it to end (`while kill -0 {holder.pid} 2>/dev/null; do sleep {POLL_HINT_S}; done`), "
        f"then run {Path(playbook).name} again: the lock is free once pid {holder.pid} is gone (the kernel "
        "releases it when the process exits, even by a crash). Nothing was changed."
    )
    if alive(holder.pid):
        return named + wait
    return (
        named + f" Process {holder.pid} is gone, but a process it started still holds the lock (the kernel "
        f"releases it when the last one exits): `fuser -v {path}` names it. Wait for that one to end, then "
        f"run {Path(playbook).name} again; nothing was changed."
    )


class ClusterLock:
    """The cluster's lock, held by this process until it exits (or :meth:`release`)."""

    def __init__(self, path: Path, descriptor: int) -> None:
        self.path = path
        self._descriptor = descriptor

    def release(self) -> None:
        if self._descriptor >= 0:
            os.close(self._descriptor)  # closing the last descriptor releases the flock
            self._descriptor = -1
            _HELD.pop(self.path, None)


# The locks this process holds, by path: a second playbook of the same command line (site.yml train.yml)
# finds its own lock instead of failing on it (a second open of the file would be a second holder).
_HELD: dict[Path, ClusterLock] = {}


def acquire(
    sources: Sequence[str],
    playbook: str,
    command: str,
    folder: Path | None = None,
    pid: int | None = None,
) -> ClusterLock:
    """Take the lock of the cluster ``sources`` name, for this process, without waiting; write who holds it.
    :class:`ClusterLocked` (naming the holder) when another process holds it."""
    path = lock_path(sources, folder)
    if path in _HELD:
        return _HELD[path]
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Not truncated on open: a run that does not get the lock must not erase who holds it. Not inherited by
    # the programs this process starts (os.open's descriptors are not): only this run and its forks hold it.
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        with os.fdopen(descriptor, encoding="utf-8", errors="replace") as handle:
            holder = Holder.from_text(handle.read())
        raise ClusterLocked(refusal(holder, path, sources, playbook)) from None
    except BaseException:
        os.close(descriptor)
        raise
    holder = Holder(
        pid=pid if pid is not None else os.getpid(),
        started=time.time(),
        command=command,
        inventory=tuple(sources),
        playbook=playbook,
    )
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, (holder.to_json() + "\n").encode("utf-8"), 0)
    lock = ClusterLock(path, descriptor)
    _HELD[path] = lock
    return lock


def holder_of(sources: Sequence[str], folder: Path | None = None) -> Holder | None:
    """Who the cluster's lock file names (the holder now, or the last one: the file stays after a run)."""
    try:
        return Holder.from_text(lock_path(sources, folder).read_text(encoding="utf-8"))
    except OSError:
        return None
