"""Copies of the job's checkpoints off its first node, each checked where it lands.

Rank 0 runs on the job's first node, beside the supervisor, and writes its checkpoints there only
(``JOB/output/checkpoints``: the package's entrypoint renames each into place whole and keeps the newest K; a
user's script writes plain ``torch.save`` files under the same names). So that losing that node loses no
training, the supervisor's :class:`Replicator` copies every new checkpoint to each *place*:

- the next ``checkpoint_replicas`` nodes of the job, into the same path (``JOB/output/checkpoints``), so that
  a node that takes the job over resumes from its own copy under the same ``resume_from``;
- ``checkpoint_dir``/<job id>/ when the job names one (a mount every node has: NFS, Lustre).

A checkpoint is copied once it is whole here (:mod:`ddp_cluster.runtime.checkpoint_names`: its own header; or,
any other file, its record, or its zip archive; a file of another format once its size and mtime have not
changed for ``settle`` seconds). A file without our header gets its record here (``.NAME.sha256``: size and
SHA-256) before it is sent, and each copy is checked against that record where it lands, by the node's own
Python (``python -m ddp_cluster.runtime.checkpoint_names --verify``), which writes the record beside it there.
A copy lands under a hidden temporary name, goes into place only once it verifies, and is deleted when the
transfer or the check fails (a full disk leaves no partial file behind); only once a newer copy is verified at
a place are the older ones there (and their records) pruned, the newest ``keep`` kept. A failed copy (node
down, disk full, a truncated transfer) is retried at a later poll, after a pause that doubles up to a minute,
and prunes nothing. A checkpoint here that is not whole is named once and not copied until it changes.

How it runs: :meth:`Replicator.poll`, called every poll of the supervisor's watch, lists the checkpoint folder
and nothing more unless a checkpoint is new; the copies run in background threads, one per place, so a large
checkpoint or a frozen replica node never holds up the watch loop, and one slow place holds up no other. A
place's thread copies the newest checkpoint not yet verified there: one superseded while a copy ran is
skipped, the newer one takes its place (rank 0 would prune it soon anyway). Nothing here raises into the
supervisor: what happened is returned by :meth:`poll` (one record per copy) and kept for the status
(:meth:`state`).

The commands sent to other nodes name the job's directory by its parent and a relative path: the job's
processes are found by the job's directory in their command lines (:func:`ddp_cluster.supervisor.remote.
pattern`), and a copy in flight must neither count as one of the job's processes (a restart waits for those
to end) nor be killed by the job's stop.

:func:`newest_verified` is what a node that takes the job over, or a restart, resumes from: the newest
checkpoint of this node's or of ``checkpoint_dir`` that is whole.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from ddp_cluster.job import node_jobs
from ddp_cluster.runtime import checkpoint_names
from ddp_cluster.runtime.checkpoint_names import (
    FOLDER,
    HEADER,
    Check,
    Record,
    check_file,
    check_handle,
    checkpoint_order,
    install_verified,
    kind_of,
    read_record,
    recorded_checkpoint,
    sha256_of,
    write_record,
)
from ddp_cluster.supervisor.remote import Mesh

# How many verified copies a place keeps: the newest and one older, in case the newest passes its checksum
# but does not load (its state was bad when saved). Rank 0's own K is a training flag the supervisor does
# not see; the replicas cost a replica node's disk, which its own ranks use too.
KEEP = 2
MODULE = "ddp_cluster.runtime.checkpoint_names"
# A failed copy is tried again after RETRY_FIRST seconds, doubling up to RETRY_MOST.
RETRY_FIRST = 2.0
RETRY_MOST = 60.0
# A copy to a node may take SEND_BASE seconds plus its size at SEND_RATE bytes a second (a slow network's).
SEND_BASE = 60.0
SEND_RATE = 20 * 1024 * 1024
TEMPORARY_SUFFIX = ".replica"
# The error of a copy whose checkpoint rank 0 pruned before the copy began: not a failure.
SUPERSEDED = "superseded"
# The error of a copy whose checkpoint is not known whole yet (being written, or settling): not a failure.
PENDING = "pending"
# A checkpoint of neither our format nor torch.save's zip is taken as complete once its size and mtime have
# not changed for this many seconds (a torch.save under way writes on).
SETTLE = 5.0


def signature(stat: os.stat_result) -> tuple[int, int, int]:
    """What tells one version of a file from the next: inode, size, mtime."""
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def temporary_name(name: str) -> str:
    """The hidden name a copy of checkpoint ``name`` has until it is verified (never a checkpoint's name)."""
    return f".{name}{TEMPORARY_SUFFIX}"


def is_temporary(name: str) -> bool:
    return (
        name.startswith(".")
        and name.endswith(TEMPORARY_SUFFIX)
        and checkpoint_order(name[1 : -len(TEMPORARY_SUFFIX)]) is not None
    )


def newest_first(names: Sequence[str]) -> list[str]:
    """The checkpoints among ``names``, newest first by (epoch, step) (past 9 digits of steps too)."""
    found = [(order, name) for name in names if (order := checkpoint_order(name)) is not None]
    return [name for _, name in sorted(found, reverse=True)]


def checkpoints_in(folder: Path) -> list[str]:
    """The checkpoints' names in ``folder``, newest first ([] when it does not exist or cannot be read)."""
    try:
        return newest_first(os.listdir(folder))
    except OSError:
        return []


class Transport(Protocol):
    """Shell commands on another node (the mesh's ssh; a stand-in in tests)."""

    def run(self, node: str, command: str) -> str:
        """The command's stdout; '' when the node does not answer."""

    def send(self, node: str, source: BinaryIO, command: str, timeout: float) -> str:
        """Run ``command`` with ``source`` (from its current offset) as its stdin; '' when it exited 0, else
        what went wrong."""


class MeshTransport:
    """:class:`Transport` over the supervisor's :class:`~ddp_cluster.supervisor.remote.Mesh`."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh

    def run(self, node: str, command: str) -> str:
        return self.mesh.run(node, command)

    def send(self, node: str, source: BinaryIO, command: str, timeout: float) -> str:
        # ssh reads the file itself (stdin is the file): the checkpoint is never held in memory here.
        return self.mesh.send(node, command, source, timeout)


@dataclass
class Place:
    """Where copies go: a node (``node``; the folder is the same path there) or a local folder."""

    label: str  # the node's name, or the folder's path
    folder: Path
    node: str = ""
    lost: bool = False
    verified: str = ""  # the newest checkpoint verified there by this replicator
    bytes: int = 0
    seconds: float = 0.0
    at: float = 0.0
    copying: str = ""
    pending: bool = False  # its last look found the newest checkpoint not known whole yet
    failures: int = 0
    retry_at: float = 0.0
    error: str = ""
    thread: threading.Thread | None = field(default=None, repr=False)

    def summary(self) -> dict[str, Any]:
        return {
            "place": self.label,
            "kind": "node" if self.node else "dir",
            "checkpoint": self.verified or None,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 2),
            "at": round(self.at, 2) if self.at else None,
            "copying": self.copying or None,
            "failures": self.failures,
            "error": self.error,
            "lost": self.lost,
        }


class Replicator:
    """Copies the job's new checkpoints to its replica nodes and ``checkpoint_dir`` (see the module)."""

    def __init__(
        self,
        job_dir: Path,
        replicas: Sequence[str],
        checkpoint_dir: str,
        job_id: str,
        transport: Transport,
        keep: int = KEEP,
        *,
        python: str = "python",
        node_env: str = node_jobs.NODE_ENV,
        retry_first: float = RETRY_FIRST,
        settle: float = SETTLE,
    ) -> None:
        """``job_dir``: the job's directory (the same path on every node); ``replicas``: the nodes that get
        copies (never this node: its folder is rank 0's, pruned by rank 0); ``checkpoint_dir``: the spec's
        ('' for none); ``python`` and ``node_env``: how a node runs the package's Python; ``settle``: the
        seconds a checkpoint of neither our format nor a zip must stay unchanged to count as complete."""
        self.job_dir = job_dir
        self.source = job_dir / "output" / FOLDER
        self.transport = transport
        self.keep = max(1, keep)
        self.python = python
        self.node_env = node_env
        self.retry_first = retry_first
        self.settle = settle
        # The supervisor's fence (supervisor.fence.guard): a node where a newer supervisor holds the job
        # refuses this one's copies and prunes.
        self.guard = ""
        self.lock = threading.Lock()
        self.places: list[Place] = []
        if checkpoint_dir:
            folder = Path(checkpoint_dir) / job_id
            self.places.append(Place(label=str(folder), folder=folder))
        self.retarget(replicas)
        self.records: list[dict[str, Any]] = []
        # Checkpoints here, by name, with the version of the file (signature()) each entry is about: those
        # that are not whole (never copied until they change), those found whole (and how), and those not
        # known whole yet, with when that version was first seen.
        self.bad_sources: dict[str, tuple[str, tuple[int, int, int]]] = {}
        self.checked: dict[str, tuple[tuple[int, int, int], Check]] = {}
        self.sightings: dict[str, tuple[tuple[int, int, int], float]] = {}

    # The supervisor's calls.

    def poll(self) -> list[dict[str, Any]]:
        """Start a copy of the newest checkpoint to each place that lacks it (and whose last failure's pause
        is over); the records of the copies that ended since the last call. Costs a listdir when nothing is
        new."""
        return self.start_copies(None)

    def start_copies(self, failed: set[str] | None) -> list[dict[str, Any]]:
        """:meth:`poll`; with ``failed``, the places whose copies failed (those just ended added) are not
        tried again."""
        try:
            listing = os.listdir(self.source)
        except OSError:
            listing = []
        names = newest_first(listing)
        newest = names[0] if names else ""
        drop_orphan_records(self.source, listing)
        version = self.version_of(newest) if newest in self.bad_sources else None
        with self.lock:
            done, self.records = self.records, []
            skip: set[str] = set()
            if failed is not None:
                failed.update(record["place"] for record in done if record["error"])
                skip = failed
            for known in (self.bad_sources, self.checked, self.sightings):
                for gone in [name for name in known if name not in names]:
                    del known[gone]
            bad = self.bad_sources.get(newest)
            if not newest or (bad is not None and bad[1] == version):
                for place in self.places:  # nothing to wait for
                    place.pending = False
                return done
            self.bad_sources.pop(newest, None)
            now = time.monotonic()
            for place in self.places:
                busy = place.thread is not None and place.thread.is_alive()
                waiting = now < place.retry_at or place.label in skip
                if place.lost or busy or waiting or not self.newer(newest, place.verified):
                    continue
                place.copying = newest
                place.thread = threading.Thread(
                    target=self.copy, args=(place, newest), name=f"replica {place.label}", daemon=True
                )
                place.thread.start()
        return done

    def forget(self, node: str) -> None:
        """Copy nothing more to ``node`` (found lost), until a :meth:`retarget` names it again."""
        with self.lock:
            for place in self.places:
                if place.node == node:
                    place.lost = True

    def retarget(self, replicas: Sequence[str]) -> None:
        """The replica nodes after a restart: a node kept keeps what it holds, a new one gets the newest
        checkpoint at the next poll, one no longer named gets nothing more (its copies stay there)."""
        with self.lock:
            before = {place.node: place for place in self.places if place.node}
            places = [place for place in self.places if not place.node]
            for node in dict.fromkeys(replicas):
                place = before.get(node) or Place(label=node, folder=self.source, node=node)
                place.lost = False
                places.append(place)
            self.places = places

    def state(self) -> list[dict[str, Any]]:
        """Each place's newest verified copy, the copy under way and the last failure (for the status)."""
        with self.lock:
            return [place.summary() for place in self.places]

    def finish(self, timeout: float) -> list[dict[str, Any]]:
        """At the job's end: copy the last checkpoint too, waiting up to ``timeout`` seconds for the copies
        under way (and for a checkpoint still settling); the records of the copies that ended (those still
        running go on, unrecorded). A place whose copy fails meanwhile is not tried again."""
        deadline = time.monotonic() + timeout
        done: list[dict[str, Any]] = []
        failed: set[str] = set()
        while True:
            done += self.start_copies(failed)
            with self.lock:
                threads = [place.thread for place in self.places if place.thread and place.thread.is_alive()]
                pending = [place for place in self.places if place.pending and not place.lost]
                if not threads:  # the copies that ended since start_copies took the records (a fast failure)
                    done, self.records = done + self.records, []
            if (not threads and not pending) or time.monotonic() >= deadline:
                return done
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            if not threads:
                time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))

    def version_of(self, name: str) -> tuple[int, int, int] | None:
        try:
            return signature(os.stat(self.source / name))
        except OSError:
            return None

    # The copies, in each place's thread.

    @staticmethod
    def newer(name: str, than: str) -> bool:
        order, other = checkpoint_order(name), checkpoint_order(than) if than else None
        return order is not None and (other is None or order > other)

    def copy(self, place: Place, name: str) -> None:
        started = time.monotonic()
        record: dict[str, Any] = {"checkpoint": name, "place": place.label, "bytes": 0, "verified": False}
        try:
            error, size, pruned = self.copy_to(place, name)
        except Exception as raised:  # a copy's failure is reported, never raised into the watch loop
            error, size, pruned = f"copy of {name} to {place.label} failed: {raised!r}", 0, []
        seconds = time.monotonic() - started
        record.update(bytes=size, seconds=round(seconds, 2), error=error, verified=not error, pruned=pruned)
        with self.lock:
            place.copying = ""
            place.pending = error == PENDING
            if place.pending:  # not a copy: nothing recorded, looked at again soon
                place.retry_at = time.monotonic() + min(1.0, self.settle / 4)
                return
            if error == SUPERSEDED:
                record.update(
                    error="", skipped="pruned on this node before it was copied; a newer one will be"
                )
            elif error:
                place.failures += 1
                place.error = error
                place.retry_at = time.monotonic() + min(
                    RETRY_MOST, self.retry_first * 2 ** min(place.failures - 1, 16)
                )
            else:
                place.failures, place.error, place.retry_at = 0, "", 0.0
                if self.newer(name, place.verified):
                    place.verified, place.bytes, place.seconds, place.at = name, size, seconds, time.time()
            self.records.append(record)

    def copy_to(self, place: Place, name: str) -> tuple[str, int, list[str]]:
        """Copy checkpoint ``name`` to ``place``, verified there, then prune; (error, bytes, pruned)."""
        path = self.source / name
        try:
            handle = open(path, "rb")  # noqa: SIM115 - held open across the copy, closed below
        except FileNotFoundError:
            return SUPERSEDED, 0, []
        with handle:  # read through this handle even if rank 0 prunes the file meanwhile
            version = signature(os.fstat(handle.fileno()))
            size = version[1]
            checked, why = self.source_check(handle, path, name, version)
            if checked is None:
                return why, size, []
            # Our own format carries its checksum; any other file is checked against its record.
            expected = None if checked.kind == "ours" else checked.record
            handle.seek(0)
            error = (
                self.put_node(place, name, handle, size, expected)
                if place.node
                else self.put_local(place, name, handle, expected)
            )
        if error:
            return error, size, []
        return "", size, self.prune(place, name)

    def source_check(
        self, handle: BinaryIO, path: Path, name: str, version: tuple[int, int, int]
    ) -> tuple[Check | None, str]:
        """How the checkpoint ``name`` here (open as ``handle``, at ``version``) is whole, its record written
        beside it when it is not ours; else None and :data:`PENDING` (not known yet: being written, or
        settling) or why it is not copied. One version is checked once, whatever the places."""
        with self.lock:
            cached = self.checked.get(name)
        if cached is not None and cached[0] == version:
            return cached[1], ""
        record = read_record(path)
        handle.seek(0)
        ours = kind_of(handle.read(HEADER.size)) == "ours"
        checked = check_handle(handle, path, record=record, digest=not ours)
        if checked.problem:
            if checked.kind == "ours":  # renamed into place whole by its writer: this one is damaged
                return None, self.set_bad(name, version, checked.problem)
            # A user's file may be written in place: judged once it stops changing.
            now = time.monotonic()
            with self.lock:
                seen = self.sightings.get(name)
                if seen is None or seen[0] != version:
                    self.sightings[name] = (version, now)
                    return None, PENDING
            if now - seen[1] < self.settle:
                return None, PENDING
            if checked.kind == "zip":  # a zip that stays cut short: its writer died
                return None, self.set_bad(name, version, checked.problem)
            read, sha256 = sha256_of(handle)  # another format, unchanged for settle seconds: complete
            if read != version[1]:
                return None, PENDING
            checked = Check(checked.kind, "settled", "", read, sha256)
        if checked.record is not None and checked.record != record:
            with contextlib.suppress(OSError):  # a record is written for the file as it is still
                if signature(os.stat(path)) == version:
                    write_record(path, checked.record)
        with self.lock:
            self.checked[name] = (version, checked)
            self.sightings.pop(name, None)
        return checked, ""

    def set_bad(self, name: str, version: tuple[int, int, int], why: str) -> str:
        with self.lock:
            self.bad_sources[name] = (why, version)
        return f"not copied: {why}"

    def put_local(self, place: Place, name: str, handle: BinaryIO, expected: Record | None) -> str:
        final = place.folder / name
        if not check_file(final, expected).problem:
            return checkpoint_names.keep_record(final, expected)  # already there, whole
        temporary = place.folder / temporary_name(name)
        try:
            place.folder.mkdir(parents=True, exist_ok=True)
            with open(temporary, "wb") as out:
                shutil.copyfileobj(handle, out, checkpoint_names.CHUNK)
        except OSError as error:
            temporary.unlink(missing_ok=True)
            return f"cannot copy {name} to {place.folder}: {error}"
        return install_verified(temporary, final, expected)

    def node_command(self, tail: str) -> str:
        """A shell command run in the parent of the job's directory (see the module on why)."""
        env = f". {self.node_env} && " if self.node_env else ""
        parent = shlex.quote(str(self.job_dir.parent))
        return f"{env}{self.guard}mkdir -p {parent} && cd {parent} && {tail}"

    def relative(self, name: str = "") -> str:
        folder = f"{self.job_dir.name}/output/{FOLDER}"
        return shlex.quote(f"{folder}/{name}" if name else folder)

    def put_node(self, place: Place, name: str, handle: BinaryIO, size: int, expected: Record | None) -> str:
        verify = f"{self.python} -m {MODULE} --verify"
        against = f" --size {expected.size} --sha256 {expected.sha256}" if expected else ""
        there = self.transport.run(
            place.node, self.node_command(f"{verify} {self.relative(name)}{against} && echo verified")
        )
        if "verified" in there.split():
            return ""  # already there, whole (its record written there if it lacked one)
        temporary = self.relative(temporary_name(name))
        # A transfer cut short is deleted by the check; one whose write fails (a full disk) right here.
        command = self.node_command(
            f"mkdir -p {self.relative()} && {{ cat > {temporary} || {{ rm -f {temporary}; exit 1; }}; }}"
            f" && {verify} {temporary}{against} --rename-to {self.relative(name)}"
        )
        error = self.transport.send(place.node, handle, command, SEND_BASE + size / SEND_RATE)
        return f"copy to node {place.node} failed: {error}" if error else ""

    def prune(self, place: Place, newest: str) -> list[str]:
        """Delete the copies at ``place`` older than the newest ``keep`` up to ``newest`` (just verified
        there), their records and those of checkpoints gone, and temporary copies of other checkpoints left by
        an interrupted copy. Newer ones are left alone. The names deleted ([] when the place could not be
        listed)."""
        if place.node:
            listing = self.transport.run(
                place.node, self.node_command(f"ls -1a {self.relative()} && echo :listed")
            )
            if ":listed" not in listing.split():
                return []
            names = listing.split()
        else:
            try:
                names = os.listdir(place.folder)
            except OSError:
                return []
        older = [n for n in newest_first(names) if not self.newer(n, newest) and n != newest]
        stale = [n for n in names if is_temporary(n) and n != temporary_name(newest)]
        pruned = older[self.keep - 1 :]
        records = [n for n in names if (of := recorded_checkpoint(n)) and (of in pruned or of not in names)]
        doomed = pruned + stale + records
        if not doomed:
            return []
        if place.node:
            targets = " ".join(self.relative(n) for n in doomed)
            self.transport.run(place.node, self.node_command(f"rm -f -- {targets}"))
        else:
            for name in doomed:
                (place.folder / name).unlink(missing_ok=True)
        return doomed


def drop_orphan_records(folder: Path, listing: Sequence[str]) -> None:
    """Delete the records in ``folder`` whose checkpoint is gone (rank 0 prunes its own checkpoints)."""
    present = set(listing)
    for name in listing:
        if (of := recorded_checkpoint(name)) and of not in present:
            with contextlib.suppress(OSError):
                (folder / name).unlink()


def newest_verified(
    job_dir: Path, checkpoint_dir: str, job_id: str, skipped: list[str] | None = None
) -> tuple[str, Path | None]:
    """The newest checkpoint that is whole, among this node's ``JOB/output/checkpoints`` and
    ``checkpoint_dir``/<job id>/: its name and its path in ``JOB/output/checkpoints`` (('', None) when none).

    One of ``checkpoint_dir`` newer than this node's (or whose copy here is damaged) is first copied here,
    checked (with its record, when it is not ours), so the job resumes from its own folder. Newer checkpoints
    here that are not whole are passed over; those of ours are renamed to a hidden ``.NAME.corrupt`` (kept
    for a look, never resumed from: the entrypoint resumes from the newest checkpoint in its folder), a user's
    are left as they are (their script may read them). What was passed over, and why, is appended to
    ``skipped``."""
    local = job_dir / "output" / FOLDER
    shared = Path(checkpoint_dir) / job_id if checkpoint_dir else None
    here = set(checkpoints_in(local))
    there = set(checkpoints_in(shared)) if shared else set()
    notes = skipped if skipped is not None else []
    for name in newest_first([*here | there]):
        ours = False
        if name in here:
            checked = check_file(local / name)
            if not checked.problem:
                return name, local / name
            ours = checked.kind == "ours"
            notes.append(checked.problem if ours else f"{checked.problem}; passed over, left as it is")
        if shared is not None and name in there:
            checked = check_file(shared / name, digest=True)
            wrong = checked.problem
            if not wrong:
                local.mkdir(parents=True, exist_ok=True)
                temporary = local / temporary_name(name)
                try:
                    shutil.copyfile(shared / name, temporary)
                except OSError as error:
                    temporary.unlink(missing_ok=True)
                    notes.append(f"cannot copy {shared / name} to {local}: {error}")
                    continue
                expected = None if checked.kind == "ours" else checked.record
                wrong = install_verified(temporary, local / name, expected)
                if not wrong:
                    return name, local / name
            notes.append(wrong)
        if ours:
            try:
                (local / name).replace(local / f".{name}.corrupt")
            except OSError as error:
                notes.append(f"cannot set {local / name} aside: {error}")
    return "", None
