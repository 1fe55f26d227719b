"""``jobs.yml -e sync=ID``: a running job's results brought into runs/<id>/ as they are now, what changed.

The controller reaches one node (the entry node) and runs :mod:`ddp_cluster.supervisor.sync` in its
container, with what it holds of the job on the command's standard input: the manifest
``runs/<id>/.sync.json`` (node -> path in the node's job directory -> the node's size, mtime and tail digest
of the file when it came, and its size here). The nodes send the files that differ: a file that only grew
from where it was (logs, metrics.jsonl, event files, telemetry) from there on, a changed one whole, nothing
for the others. :func:`merge` lays each piece where the final collect lays it
(:mod:`ddp_cluster.job.results`):

    runs/<id>/output/...           the first node's output/ (metrics.jsonl, tensorboard/, ...)
    runs/<id>/telemetry/NODE.jsonl the first node's telemetry of each node
    runs/<id>/nodes/<node>/...     every node's job directory (logs/, status.json, its output/)
    runs/<id>/logs/rank.R.log      each rank's log so far, from the node's copy (agent.N.log with torchrun)
    runs/<id>/output/loss.png      drawn here from metrics.jsonl (not when the job draws its own)

Never ``plan.json``, ``status.json`` or ``logs/`` of the run by a node's piece: a node sends what a job's code
could write, so each member is checked as the collect checks it (:func:`ddp_cluster.job.results.unsafe`),
written without following a link (a full file written beside and renamed over, a piece appended to a regular
file of the size this controller left it), and the links laid out are resolved after
(:func:`ddp_cluster.job.results.escaping_links`). A file changed here since the last sync (removed, edited)
is asked for whole again. The job's final collect (train.yml -e attach=ID, jobs.yml -e stop=ID) lays out
the whole of each node's directory over what the syncs brought.

The files the syncs hold here are bounded by the job's ``results_max_gb`` (its plan.json's,
:func:`ddp_cluster.job.results.run_limit`): the request says the nodes what is left (``left``), and a member
over what is left is refused here whatever a node sends, named in a warning; a sparse file stays on its node,
named by it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import io
import json
import os
import shlex
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.files import write_atomic
from ddp_cluster.job import node_jobs, results
from ddp_cluster.job import status as job_status
from ddp_cluster.job.transport import Transport

MANIFEST = ".sync.json"
LOCK = ".sync.lock"
NODE_MODULE = "ddp_cluster.supervisor.sync"
# The report's name for the loss curve (ddp_cluster.job.report.PLOT_FILE) and the runtime's for the metrics.
LOSS_PLOT = "loss.png"
METRICS = "metrics.jsonl"
# Of the paths a check or a warning names, the first few.
SHOWN = 5
# What one node's part may write here at most: the nodes' budget for one sync (the node side's BUDGET,
# ddp_cluster.supervisor.sync, which this module may not import); a member is copied CHUNK bytes at a time.
MEMBER_BYTES = 128 << 20
CHUNK = 1 << 20


class SyncError(DdpClusterError):
    """The sync could not be made (the job is not found, the entry node does not answer, another sync of
    the run is under way); the message says why and what to do."""


@dataclass(frozen=True)
class Kept:
    """One file of a node as this controller holds it: the node's size, mtime (ns, -1: only a part came) and
    tail digest when it came (the node compares them), and its size here (``local``; -1 for a link)."""

    size: int
    mtime: int
    tail: str
    local: int

    def to_list(self) -> list[Any]:
        return [self.size, self.mtime, self.tail, self.local]


@dataclass
class Manifest:
    """``runs/<id>/.sync.json``: the job's first node as the last sync found it, node -> path ->
    :class:`Kept`, and the SHA-256 of the loss.png a sync drew ('' when none)."""

    first: str = ""
    nodes: dict[str, dict[str, Kept]] = field(default_factory=dict)
    plot: str = ""

    @classmethod
    def load(cls, run_dir: Path) -> Manifest:
        """The run's manifest; an empty one when there is none or it cannot be read (everything then comes
        whole)."""
        try:
            raw = json.loads((run_dir / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cls()
        if not isinstance(raw, Mapping) or not isinstance(raw.get("nodes"), Mapping):
            return cls()
        found = cls(first=str(raw.get("first") or ""), plot=str(raw.get("plot") or ""))
        for node, files in raw["nodes"].items():
            for path, value in files.items() if isinstance(files, Mapping) else ():
                numbers = value[:2] + value[3:] if isinstance(value, list) and len(value) == 4 else None
                if numbers and isinstance(value[2], str) and all(_whole(item) for item in numbers):
                    found.nodes.setdefault(str(node), {})[str(path)] = Kept(*value)
        return found

    def save(self, run_dir: Path) -> None:
        nodes = {
            node: {path: kept.to_list() for path, kept in sorted(files.items())}
            for node, files in sorted(self.nodes.items())
        }
        data = {"first": self.first, "nodes": nodes, "plot": self.plot}
        write_atomic(run_dir / MANIFEST, json.dumps(data).encode())


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def destination(run_dir: Path, first: str, node: str, path: str, link: bool = False) -> Path:
    """Where a node's file ``path`` (in its job directory) is laid out, as
    :func:`ddp_cluster.job.results.lay_out` does: the first node's output under ``output/`` and its telemetry
    files (regular NODE.jsonl) under ``telemetry/``, everything else under ``nodes/<node>/``."""
    parts = PurePosixPath(path).parts
    if node == first and parts and parts[0] == results.OUTPUT:
        return run_dir.joinpath(results.OUTPUT, *parts[1:])
    telemetry = len(parts) == 2 and parts[0] == results.TELEMETRY and results.TELEMETRY_FILE.match(parts[1])
    if node == first and telemetry and not link:
        return run_dir / results.TELEMETRY / parts[1]
    return run_dir.joinpath(results.NODES, node, *parts)


def _still_here(target: Path, kept: Kept) -> bool:
    """Whether this controller's copy is as the last sync left it (else the file is asked for whole)."""
    try:
        found = os.lstat(target)
    except OSError:
        return False
    if kept.local < 0:
        return stat.S_ISLNK(found.st_mode) and kept.tail == f"link:{os.readlink(target)}"
    return stat.S_ISREG(found.st_mode) and found.st_size == kept.local


def request(run_dir: Path, manifest: Manifest) -> dict[str, Any]:
    """What the controller sends: for each node, each file it holds as the last sync left it (path ->
    [size, mtime, tail])."""
    held: dict[str, dict[str, list[Any]]] = {}
    for node, files in manifest.nodes.items():
        for path, kept in files.items():
            if _still_here(destination(run_dir, manifest.first, node, path, kept.local < 0), kept):
                held.setdefault(node, {})[path] = [kept.size, kept.mtime, kept.tail]
    return {"nodes": held}


@dataclass
class Synced:
    """What a sync did: the files written (``paths``: node -> its paths), their bytes here, the archives'
    bytes (``packed``: what the nodes sent, before the transport's base64), the answer's bytes (all that
    came back), what is left for a next sync (``pending``), the rank logs and loss curve made here, and the
    warnings. ``over``: the job had ended (its state), nothing was brought."""

    job: str
    run_dir: Path
    check: bool = False
    over: str = ""
    paths: dict[str, list[str]] = field(default_factory=dict)
    bytes: int = 0
    packed: int = 0
    answer: int = 0
    pending: int = 0
    logs: list[str] = field(default_factory=list)
    plot: bool = False
    warnings: list[str] = field(default_factory=list)
    # The bytes the job's syncs may hold here (its results_max_gb: sync() reads the job's own), and what is
    # left of them as this sync lays its files out.
    limit: int = results.RESULTS_MAX_GB * results.GIB
    room: int = results.RESULTS_MAX_GB * results.GIB

    @property
    def files(self) -> int:
        return sum(len(paths) for paths in self.paths.values())

    def lines(self) -> list[str]:
        """What jobs.yml prints."""
        collected = job_status.read(self.run_dir / job_status.FILE)
        if self.over and collected is not None and collected.done:
            return [f"job {self.job} is over ({self.over}) and collected: its results are in {self.run_dir}"]
        if self.over:
            return [
                f"job {self.job} is over ({self.over}): nothing was synced; its final collect brings all of"
                f" it into {self.run_dir}: ansible-playbook train.yml -e attach={self.job}"
            ]
        nodes = ", ".join(f"{node} {len(paths)}" for node, paths in sorted(self.paths.items()) if paths)
        if self.check:
            if not self.files:
                return [f"check mode: job {self.job}: nothing would move, {self.run_dir} is up to date"]
            named = [path for paths in self.paths.values() for path in paths]
            more = f" and {len(named) - SHOWN} more" if len(named) > SHOWN else ""
            return [
                f"check mode: job {self.job}: would bring {self.files} file(s), {self.bytes} bytes (before"
                f" compression), into {self.run_dir} ({nodes}): {', '.join(named[:SHOWN])}{more}"
            ]
        if not self.files:
            lines = [
                f"job {self.job}: nothing changed since the last sync ({self.answer} bytes asked and"
                f" answered): {self.run_dir} is up to date"
            ]
        else:
            made = [*self.logs, *([LOSS_PLOT] if self.plot else [])]
            lines = [
                f"job {self.job}: brought {self.files} file(s), {self.bytes} bytes ({self.packed} bytes"
                f" packed, {self.answer} bytes answered) into {self.run_dir} ({nodes})"
                + (f"; made {', '.join(made)}" if made else "")
            ]
        if self.pending > self.room:
            lines.append(
                f"job {self.job}: {self.pending} bytes more, over the {max(self.room, 0)} bytes left here of"
                f" the {self.limit} its results_max_gb allows the syncs: a sync brings what fits, its final"
                " collect what fits of the whole"
            )
        elif self.pending:
            lines.append(f"job {self.job}: {self.pending} bytes more to bring: run the sync again")
        return lines


def node_command(jobs_dir: str, job_id: str, nodes: Sequence[str], check: bool) -> str:
    """The entry node's shell command (in its container): :mod:`ddp_cluster.supervisor.sync`."""
    line = (
        f". {node_jobs.NODE_ENV} && python -m {NODE_MODULE} --jobs-dir {shlex.quote(jobs_dir)}"
        f" --job {shlex.quote(job_id)}"
    )
    if nodes:
        line += f" --nodes {shlex.quote(','.join(nodes))}"
    return line + (" --check" if check else "")


def _normalised(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return str(PurePosixPath(name)) if name else "."


@contextlib.contextmanager
def locked(run_dir: Path) -> Iterator[None]:
    """One sync of a run at a time (a second one is refused, naming the first)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK, "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SyncError(
                f"another sync of {run_dir.name} is under way on this controller (it holds {run_dir / LOCK}):"
                " wait for it to end"
            ) from None
        yield


class _Refused(Exception):
    """A member that may not be laid out; the message says why."""


def _directory(root: Path, target: Path) -> None:
    """Make ``target``'s parents from ``root`` down, each a real directory (never through a link)."""
    current = root
    for part in target.parent.relative_to(root).parts:
        current = current / part
        try:
            found = os.lstat(current)
        except FileNotFoundError:
            os.mkdir(current, 0o755)
            continue
        if not stat.S_ISDIR(found.st_mode):
            what = "a link" if stat.S_ISLNK(found.st_mode) else "a file"
            raise _Refused(f"a path through {what} here ({current})")


def _replace(target: Path, write: Any) -> None:
    """Write a new entry beside ``target`` (``write(path)``) and rename it over whatever is there (a file or
    a link, never a directory): nothing is written through a link."""
    try:
        if stat.S_ISDIR(os.lstat(target).st_mode):
            raise _Refused(f"a directory here ({target})")
    except FileNotFoundError:
        pass
    spare = target.with_name(f".{target.name}.sync-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(spare)
    try:
        write(spare)
        os.replace(spare, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spare)
        raise


def _append(target: Path, piece: Path, local: int) -> int:
    """Append the file ``piece`` to ``target``, a regular file (not a link) of ``local`` bytes; its size
    after."""
    try:
        descriptor = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise _Refused(f"cannot append to {target}: {error.strerror}") from None
    try:
        found = os.fstat(descriptor)
        if not stat.S_ISREG(found.st_mode) or found.st_size != local:
            raise _Refused(f"{target} changed here since the last sync")
        with open(piece, "rb") as source:
            while chunk := source.read(CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(descriptor, view) :]
        return os.fstat(descriptor).st_size
    finally:
        os.close(descriptor)


def _stream(source: IO[bytes] | None, path: Path, size: int) -> None:
    """Write ``source`` (a member of the node's archive) to ``path``, a chunk at a time: never more than
    ``size`` bytes, the member's declared size (a gzip member that declares gigabytes fits in a few MB)."""
    written = 0
    with open(path, "xb") as target:
        while source is not None and written < size and (chunk := source.read(min(CHUNK, size - written))):
            target.write(chunk)
            written += len(chunk)


def _count(value: Any) -> int | None:
    """A byte count a node sent: a non-negative integer, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _mappings(value: Any) -> list[Mapping[str, Any]]:
    """The mappings of a list a node sent (anything else: none)."""
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


@dataclass
class _Merging:
    """One node's part being laid out (see :func:`merge`)."""

    run_dir: Path
    first: str
    node: str
    manifest: Manifest
    synced: Synced
    links: bool = False
    left_out: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    left: int = 0  # bytes this part may still write here (MEMBER_BYTES at first)

    def member(self, tar: tarfile.TarFile, member: tarfile.TarInfo, entry: Mapping[str, Any]) -> None:
        name = _normalised(member.name)
        why = results.unsafe(member, name)
        if why or member.isdir():
            raise _Refused(why or "a directory (made as its files need it)")
        target = destination(self.run_dir, self.first, self.node, name, member.issym())
        if target in (self.run_dir / results.OUTPUT, self.run_dir / results.NODES / self.node):
            raise _Refused("the place of the whole output")
        if not member.issym():
            # Before anything is read or made: the size the archive declares must be the node's own count
            # and fit in what one sync brings (the node sends at most its budget).
            listed = _count(entry.get("bytes"))
            if listed is None or member.size != listed:
                raise _Refused(
                    f"{member.size} bytes in the archive, {str(entry.get('bytes'))[:40]} in the node's list"
                )
            if member.size > self.synced.room:
                raise _Refused(
                    f"{member.size} bytes: over the {max(self.synced.room, 0)} bytes the job's results_max_gb"
                    " has left here"
                )
            if member.size > self.left:
                raise _Refused(f"over the {MEMBER_BYTES} bytes one sync brings")
        _directory(self.run_dir, target)
        files = self.manifest.nodes.setdefault(self.node, {})
        if member.issym():
            _replace(target, lambda spare: os.symlink(member.linkname, spare))
            files[name] = Kept(0, 0, f"link:{member.linkname}", -1)
            self.links = True
            self.written.append(name)
            return
        start, size, mtime, tail = (entry.get(key) for key in ("start", "size", "mtime", "tail"))
        if not all(isinstance(value, int) for value in (start, size, mtime)) or not isinstance(tail, str):
            raise _Refused("no size, mtime or digest in the node's list")
        self.left -= member.size
        self.synced.room -= member.size
        if start:
            kept = files.get(name)
            if kept is None or kept.size != start:
                files.pop(name, None)
                raise _Refused(
                    "a piece from where this controller does not hold the file (asked whole next time)"
                )
            piece = target.with_name(f".{target.name}.piece-{os.getpid()}")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(piece)
            try:
                _stream(tar.extractfile(member), piece, member.size)
                local = _append(target, piece, kept.local)
            except _Refused:
                files.pop(name, None)
                raise
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(piece)
            added = local - kept.local
        else:
            _replace(target, lambda spare: _stream(tar.extractfile(member), Path(spare), member.size))
            local = added = os.lstat(target).st_size
        files[name] = Kept(int(size), int(mtime), tail, local)  # type: ignore[arg-type]
        self.synced.bytes += added
        self.written.append(name)


def _decode(part: Mapping[str, Any]) -> bytes:
    try:
        return base64.b64decode(str(part.get("archive") or ""), validate=True)
    except (binascii.Error, ValueError):
        raise _Refused("its archive is not base64") from None


def merge_part(
    run_dir: Path, first: str, node: str, part: Mapping[str, Any], manifest: Manifest, synced: Synced
) -> list[str]:
    """Lay one node's answer out under ``run_dir`` (see the module's text); the paths written."""
    index = {
        _normalised(str(entry.get("path"))): entry
        for entry in _mappings(part.get("files"))
        if isinstance(entry.get("path"), str)
    }
    merging = _Merging(run_dir, first, node, manifest, synced, left=MEMBER_BYTES)
    try:
        archive = _decode(part)
    except _Refused as error:
        synced.warnings.append(f"sync: {node}: {error}")
        return []
    synced.packed += len(archive)
    if not archive:
        return []
    read = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            while (member := tar.next()) is not None:
                tar.members.clear()  # type: ignore[attr-defined]
                read += 1
                if read > results.MAX_MEMBERS:
                    merging.left_out.append(f"the members after {results.MAX_MEMBERS}")
                    break
                name = _normalised(member.name)
                entry = index.get(name)
                try:
                    if entry is None:
                        raise _Refused("not in the node's list")
                    merging.member(tar, member, entry)
                except _Refused as error:
                    merging.left_out.append(f"{name} ({error})")
                except OSError as error:
                    merging.left_out.append(f"{name} ({error.strerror or error})")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        synced.warnings.append(
            f"sync: {node}'s archive is truncated or corrupt ({error}): what could be read is laid out"
        )
    if merging.links:
        roots = {run_dir / results.NODES / node: ""}
        if node == first:
            roots[run_dir / results.OUTPUT] = f"{results.OUTPUT}/"
        for root, prefix in roots.items():
            if root.is_dir() and not root.is_symlink():
                for name, why in results.escaping_links(root):
                    merging.left_out.append(f"{prefix}{name} ({why})")
                    manifest.nodes.get(node, {}).pop(f"{prefix}{name}", None)
                    with contextlib.suppress(ValueError):
                        merging.written.remove(f"{prefix}{name}")
    if merging.left_out:
        shown = ", ".join(merging.left_out[:SHOWN])
        more = f" and {len(merging.left_out) - SHOWN} more" if len(merging.left_out) > SHOWN else ""
        synced.warnings.append(f"sync: left out {len(merging.left_out)} member(s) from {node}: {shown}{more}")
    return merging.written


def _rank_logs(run_dir: Path, answer: Mapping[str, Any], synced: Synced) -> None:
    """Each rank's log so far as runs/<id>/logs/rank.R.log, from the node copies that changed (the final
    layout's names: :func:`ddp_cluster.job.results.lay_out`)."""
    logs = run_dir / results.LOGS
    torchrun = answer.get("launcher") not in (None, "mpirun")
    nproc = answer.get("nproc_per_node")
    nodes = answer.get("nodes")
    order = [str(node) for node in nodes] if isinstance(nodes, list) else []
    for node, paths in synced.paths.items():
        target = run_dir / results.NODES / node
        workers = False
        for path in paths:
            if match := results.MPIRUN_LOG.match(path):
                copy = target / path
                if copy.is_file() and not copy.is_symlink():
                    logs.mkdir(parents=True, exist_ok=True)
                    process = int(match.group(1))
                    name = results.agent_log_name(process) if torchrun else results.rank_log_name(process)
                    shutil.copyfile(copy, logs / name)
                    synced.logs.append(f"{results.LOGS}/{name}")
            workers = workers or path.startswith(f"{results.LOGS}/torchrun/")
        if torchrun and workers and isinstance(nproc, int) and node in order:
            logs.mkdir(parents=True, exist_ok=True)
            results.worker_logs(target, order.index(node), nproc, logs)
            synced.logs.append(f"{results.LOGS}/ (torchrun workers of {node})")


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def _plot(run_dir: Path, first: str, manifest: Manifest, synced: Synced) -> None:
    """loss.png drawn again from the synced metrics.jsonl when it changed, unless the job has its own (it
    came from the node) or one that this sync did not draw is there (the report's, after a collect)."""
    output = run_dir / results.OUTPUT
    metrics, loss = output / METRICS, output / LOSS_PLOT
    if f"{results.OUTPUT}/{METRICS}" not in synced.paths.get(first, []):
        return
    if f"{results.OUTPUT}/{LOSS_PLOT}" in manifest.nodes.get(first, {}):
        return  # the job's own
    if (loss.exists() or loss.is_symlink()) and (loss.is_symlink() or _digest(loss) != manifest.plot):
        return
    try:
        from ddp_cluster.job import plot  # matplotlib, only when there is a curve to draw

        records = plot.read_metrics(metrics)
        if not records:
            return
        with tempfile.TemporaryDirectory(dir=output) as folder:
            drawn = Path(folder, LOSS_PLOT)
            plot.plot_metrics(records, drawn, title=f"{run_dir.name}: loss (so far)")
            os.replace(drawn, loss)
    except Exception as error:  # the curve is a convenience: a sync never fails for it
        said = str(error).strip().splitlines()
        synced.warnings.append(f"sync: no loss curve: {said[-1] if said else repr(error)}")
        return
    manifest.plot = _digest(loss)
    synced.plot = True


def drawn_by_sync(run_dir: Path) -> bool:
    """Whether runs/<id>/output/loss.png is the one a sync drew (the report draws the final curve over it)."""
    loss = run_dir / results.OUTPUT / LOSS_PLOT
    recorded = Manifest.load(run_dir).plot
    return bool(recorded) and loss.is_file() and not loss.is_symlink() and _digest(loss) == recorded


def merge(run_dir: Path, answer: Mapping[str, Any], manifest: Manifest, synced: Synced) -> None:
    """Lay the entry node's ``answer`` out under ``run_dir``, update ``manifest`` and ``synced`` (see the
    module's text). Never raises on what a node sent: what may not be laid out is named in a warning."""
    first = str(answer.get("first") or "")
    parts = answer.get("parts") or {}
    for node, part in sorted(parts.items()) if isinstance(parts, Mapping) else []:
        node = str(node)
        if not node_jobs.JOB_ID.fullmatch(node) or not isinstance(part, Mapping):
            synced.warnings.append(f"sync: an answer for {node!r}, which is no node name, was left out")
            continue
        if part.get("error"):
            synced.warnings.append(f"sync: {node} sent nothing: {str(part['error'])[:300]}")
            continue
        pending = _count(part.get("pending", 0))
        if pending is None:
            synced.warnings.append(
                f"sync: {node} sent {str(part.get('pending'))[:40]!r} as its bytes pending, not a count:"
                " not counted"
            )
        synced.pending += pending or 0
        if part.get("left_out_count"):
            left_out = part.get("left_out")
            synced.warnings.append(
                f"sync: {node} left out {str(part['left_out_count'])[:40]} entries (as the collect does):"
                f" {', '.join(str(item)[:300] for item in (left_out if isinstance(left_out, list) else []))}"
            )
        if synced.check:
            listed = _mappings(part.get("files"))
            synced.paths[node] = [str(entry.get("path")) for entry in listed]
            counts = [_count(entry.get("bytes", 0)) for entry in listed]
            if None in counts:
                synced.warnings.append(
                    f"sync: {node} listed {counts.count(None)} file(s) with no byte count: not counted"
                )
            synced.bytes += sum(count or 0 for count in counts)
            continue
        synced.paths[node] = merge_part(run_dir, first, node, part, manifest, synced)
    if synced.check:
        return
    _rank_logs(run_dir, answer, synced)
    _plot(run_dir, first, manifest, synced)
    manifest.first = first


def sync(
    transport: Transport,
    container: str,
    jobs_dir: str,
    job_id: str,
    run_dir: Path,
    nodes: Sequence[str] = (),
    check: bool = False,
) -> Synced:
    """Bring ``run_dir`` (runs/<id>) up to date with job ``job_id`` through ``transport`` (the entry node's
    server) and its container ``container`` (see the module's text); ``nodes``: the cluster's (the
    inventory's), where the entry node looks for the job."""
    if not node_jobs.JOB_ID.fullmatch(job_id):
        raise SyncError(
            f"sync={job_id!r} is not a job id: `ansible-playbook jobs.yml` lists the cluster's jobs"
        )
    limit = results.run_limit(run_dir)
    synced = Synced(job_id, run_dir, check=check, limit=limit, room=limit)
    with locked(run_dir):
        manifest = Manifest.load(run_dir)
        asked_for = request(run_dir, manifest)
        kept = [kept.local for files in manifest.nodes.values() for kept in files.values()]
        synced.room = synced.limit - sum(local for local in kept if local > 0)
        asked = json.dumps({**asked_for, "left": max(synced.room, 0)}).encode()
        with tempfile.NamedTemporaryFile(prefix="ddp-sync-", suffix=".json") as handle:
            handle.write(asked)
            handle.flush()
            remote = transport.put(handle.name)
            try:
                command = node_command(jobs_dir, job_id, nodes, check)
                done = transport.run(
                    f"docker exec -i {shlex.quote(container)} /bin/bash -c {shlex.quote(command)}"
                    f" < {shlex.quote(remote)}"
                )
            finally:
                transport.close()
        synced.answer = len(asked) + len(done.stdout)
        answer = node_jobs.parse(done.stdout)
        if answer is None:
            raise SyncError(f"{container} gave no answer to the sync of job {job_id}: {done.said(300)}")
        if answer.get("error"):
            raise SyncError(f"sync of job {job_id}: {answer['error']}")
        if answer.get("over"):
            synced.over = str(answer.get("state") or "ended")
            return synced
        if manifest.first and str(answer.get("first") or "") != manifest.first:
            # The job's supervisor moved (its first node was lost): what the new one holds comes again, laid
            # out where its place now is.
            manifest.nodes.pop(str(answer.get("first")), None)
        merge(run_dir, answer, manifest, synced)
        if not check:
            manifest.save(run_dir)
    return synced
