"""A running job's logs, read where they are: ``jobs.yml -e logs=ID`` on the node side.

    python -m ddp_cluster.supervisor.logs JOB_ID --jobs-dir /workspace/jobs --tail N [--rank R] [--node NODE]
        [--follow-from OFFSETS_JSON [--wait S]] [--first NODE] [--nodes N1,N2,...]

Run on the entry node (in its container), it finds the node that runs the job's supervisor
(:func:`ddp_cluster.supervisor.locate.locate`; ``--first`` when an earlier answer named it) and, when that is
another node, runs itself there over the mesh's ssh. There, the job's job.json (the nodes it runs on now,
after any restart) says which rank's log is where (:func:`sources`):

- mpirun: each rank's output, stdout and stderr merged, in ``JOB/logs/1/rank.R/stdout`` on the rank's own node
  (``--output-filename``: each node's Open MPI daemon writes its processes' files);
- torchrun (and torch_npu_run): each worker's ``JOB/logs/torchrun/<run>/attempt_A/<local rank>/stdout.log``
  and ``stderr.log`` on its node, rank = node index x processes per node + local rank, from the newest run
  and its latest attempt (a restart by the supervisor moves the attempt's logs to ``JOB/attempts/N/`` and the
  next one writes a new run).

It reads its own node's files and each other node's with one ssh command per node, all at once (the single
node form, ``--read``; each node masks the job's secrets, ``JOB/secrets.json``: every value of 4 characters
or more, and its JSON-escaped form, as ``***``, in the bytes read, before cutting them into lines), prefixes
every line ``[NODE rank R]`` and prints the lines, then one JSON line: the offsets reached (per log: its inode
and the byte after its last whole line), the job's state, whether it ended (its status says so, or its
supervisor is gone: "running, no supervisor on NODE"), the supervisor's node and notes (a log not there yet,
a node that did not answer).

Without ``--follow-from`` it prints each log's last ``--tail`` lines. With it, what came after those offsets
(a log whose inode changed, a restart's, from its start); ``--wait S`` waits up to S seconds for a first new
line on any node (each node looks at its files every :data:`POLL` seconds; the node that asked closes the
others' input once one has lines, and they answer at once). Once the job's status says it ended, the last
partial lines are printed too and the summary says ``"done": true``.

Standard library only: it runs in the node image's Python.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import select
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.job import logs as job_logs
from ddp_cluster.job import node_jobs, results, secrets
from ddp_cluster.job import spec as jobspec
from ddp_cluster.job import status as job_status
from ddp_cluster.supervisor.locate import JobNotFound, locate
from ddp_cluster.supervisor.remote import COMMAND_TIMEOUT, Mesh
from ddp_cluster.supervisor.standby import supervisor_alive
from ddp_cluster.supervisor.sync import held_back

# Seconds between two looks at the logs while an ask waits for a new line.
POLL = 0.2
# Bytes of one log read in one answer at most (the rest comes with the next), and read back for a tail.
READ_MAX = 256 * 1024
TAIL_MAX = 1024 * 1024
# A follow asks again and again, each time over ssh to every other node: the asks' sessions share one
# connection per node, kept SHARE_SECONDS after the last (no key exchange per ask: a new line shows sooner).
SHARE_SECONDS = 30
SHARED = (
    *("-o", "ControlMaster=auto", "-o", "ControlPath=/tmp/ddp-logs-%C"),
    *("-o", f"ControlPersist={SHARE_SECONDS}"),
)
TORCHRUN = "torchrun"
ATTEMPT = re.compile(r"^attempt_(\d+)$")
MPIRUN_RANK = re.compile(r"^rank\.(\d+)$")
MASK = secrets.MASK.encode()


@dataclass(frozen=True)
class Source:
    """One log of one rank: on ``node``, mpirun's process ``process`` (the rank), or torchrun's worker of
    local rank ``process`` and its ``stream`` (stdout or stderr)."""

    rank: int
    node: str
    launcher: str  # "mpirun" or "torchrun"
    process: int
    stream: str = "stdout"

    @property
    def key(self) -> str:
        return str(self.rank) if self.stream == "stdout" else f"{self.rank}.{self.stream}"

    @property
    def prefix(self) -> str:
        return f"[{self.node} rank {self.rank}]"

    def to_list(self) -> list[Any]:
        return [self.rank, self.node, self.launcher, self.process, self.stream]

    @classmethod
    def from_list(cls, item: Sequence[Any]) -> Source:
        return cls(int(item[0]), str(item[1]), str(item[2]), int(item[3]), str(item[4]))


def sources(spec: jobspec.JobSpec) -> list[Source]:
    """Every rank's logs, rank by rank (see the module's text)."""
    if not spec.agents:
        return [
            Source(rank, spec.node_of_process(rank) or "?", "mpirun", rank) for rank in range(spec.world_size)
        ]
    found = []
    for index, node in enumerate(spec.nodes):
        for local in range(spec.nproc_per_node):
            rank = index * spec.nproc_per_node + local
            found += [Source(rank, node, TORCHRUN, local), Source(rank, node, TORCHRUN, local, "stderr")]
    return found


def select_sources(spec: jobspec.JobSpec, rank: int | None = None, node: str = "") -> list[Source]:
    """The logs asked for (one rank's, one node's, or all); LogsError when the rank or node is not the
    job's."""
    job_logs.check_selection(spec.id, rank, node, spec.world_size, spec.nodes)
    return [
        source
        for source in sources(spec)
        if (rank is None or source.rank == rank) and (not node or source.node == node)
    ]


def torchrun_log(job_dir: Path, local: int, stream: str = "stdout") -> Path | None:
    """A torchrun worker's log on this node: in its newest run's latest attempt (both streams from there:
    a stream that attempt has not written yet is not taken from an older one)."""
    best: tuple[float, int, str] | None = None
    found: Path | None = None
    for folder in (job_dir / results.LOGS / TORCHRUN).glob(f"*/attempt_*/{local}"):
        match = ATTEMPT.match(folder.parent.name)
        if not match or not folder.is_dir():
            continue
        try:
            key = (folder.parent.parent.stat().st_mtime, int(match.group(1)), str(folder))
        except OSError:
            continue
        if best is None or key > best:
            best, found = key, folder
    path = found / f"{stream}.log" if found is not None else None
    return path if path is not None and path.is_file() else None


def mpirun_log(job_dir: Path, process: int) -> Path | None:
    """mpirun's output file of process ``process`` on this node, whatever mpirun's job number and however it
    wrote the number (Open MPI pads it to the widest: rank.03 among 16 processes)."""
    for path in sorted((job_dir / results.LOGS).glob("*/rank.*/stdout")):
        match = MPIRUN_RANK.match(path.parent.name)
        if match and int(match.group(1)) == process:
            return path
    return None


def resolve(job_dir: Path, source: Source) -> Path | None:
    """Where ``source``'s log is on this node (None: not written yet, or not here)."""
    if source.launcher == TORCHRUN:
        return torchrun_log(job_dir, source.process, source.stream)
    return mpirun_log(job_dir, source.process)


def tail_start(handle: IO[bytes], stop: int, lines: int) -> int:
    """The offset of the first of the last ``lines`` lines before ``stop`` (a newline at ``stop`` - 1 ends
    the last one; looking back at most :data:`TAIL_MAX` bytes). Always a line's start: a line cut by that
    bound is left out (its start could be the end of a secret, unmasked), ``stop`` when one line is longer."""
    low = max(0, stop - TAIL_MAX)
    scan = stop - 1 if stop > 0 and _byte_at(handle, stop - 1) == b"\n" else stop
    position, found = scan, 0
    while position > low:
        size = min(64 * 1024, position - low)
        position -= size
        handle.seek(position)
        block = handle.read(size)
        index = len(block)
        while (index := block.rfind(b"\n", 0, index)) >= 0:
            found += 1
            if found == lines:
                return position + index + 1
    if low == 0 or _byte_at(handle, low - 1) == b"\n":
        return low
    return _first_line_start(handle, low, stop)


def _first_line_start(handle: IO[bytes], low: int, stop: int) -> int:
    """The offset after the first newline in [low, stop), ``stop`` when there is none."""
    position = low
    while position < stop:
        handle.seek(position)
        block = handle.read(min(64 * 1024, stop - position))
        index = block.find(b"\n")
        if index >= 0:
            return position + index + 1
        position += len(block)
    return stop


def _byte_at(handle: IO[bytes], offset: int) -> bytes:
    handle.seek(offset)
    return handle.read(1)


def _last_newline(handle: IO[bytes], end: int, low: int = -1) -> int:
    """The offset after the last newline before ``end``, looking back to ``low`` (default: TAIL_MAX bytes);
    ``low`` (0 at most) when there is none."""
    low = max(0, end - TAIL_MAX) if low < 0 else low
    position = end
    while position > low:
        size = min(64 * 1024, position - low)
        position -= size
        handle.seek(position)
        index = handle.read(size).rfind(b"\n")
        if index >= 0:
            return position + index + 1
    return low


def mask_bytes(data: bytes, hidden: Sequence[bytes], skip: int = 0) -> bytes:
    """``data[skip:]`` with each secret of ``hidden`` (longest first) replaced by ``***``, a secret that
    starts in ``data[:skip]`` (bytes read before, only to see it whole) and ends after it too."""
    found: list[tuple[int, int]] = []
    for secret in hidden:
        index = data.find(secret)
        while index >= 0:
            end = index + len(secret)
            if any(start < end and index < stop for start, stop in found):
                index = data.find(secret, index + 1)
                continue
            found.append((index, end))
            index = data.find(secret, end)
    pieces, position = [], skip
    for start, end in sorted(found):
        if end <= skip:
            continue
        pieces += [data[position:start] if start > position else b"", MASK]
        position = max(position, end)
    pieces.append(data[position:])
    return b"".join(pieces)


def read_log(
    path: Path, at: Sequence[int] | None, tail: int, final: bool, hidden: Sequence[bytes] = ()
) -> tuple[list[str], list[int]]:
    """The new lines of ``path`` after ``at`` ([inode, offset]; None: its last ``tail`` lines), masked
    (``hidden``: the secrets, longest first), and where that leaves it. A log whose inode changed or that
    got shorter is read from its start; a partial last line waits for its end unless ``final`` (the job
    ended) or it is :data:`READ_MAX` long. The secrets are masked in the bytes read, before they are cut
    into lines (a secret may span lines: a PEM key); unless ``final``, an end that may be a secret's start
    is kept for the next read, which masks it whole (a line read in pieces, a secret still being written)."""
    before = max((len(secret) for secret in hidden), default=1) - 1
    # Not through a link: a log replaced by a link to another file would show that file.
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as handle:
        info = os.fstat(handle.fileno())
        end = info.st_size
        if at is None:
            stop = end if final else _last_newline(handle, end)
            start = tail_start(handle, stop, tail)
            limit = stop - start
        else:
            # An offset older than this file (a new attempt's file, or one cut short): from its start.
            same = int(at[0]) == info.st_ino and int(at[1]) <= end
            start = int(at[1]) if same else 0
            limit = min(end - start, READ_MAX)
        # The bytes before ``start`` a secret that ends after it may begin in, read to mask it whole.
        context = min(start, before)
        handle.seek(start - context)
        data = handle.read(context + limit)
    earlier, data = data[:context], data[context:]
    cut = len(data) if final or at is None else data.rfind(b"\n") + 1
    if cut == 0 and len(data) >= READ_MAX:
        cut = len(data)
    if not final and hidden:
        cut -= held_back(data[:cut], hidden)
    text = mask_bytes(earlier + data[:cut], hidden, len(earlier)) if hidden else data[:cut]
    lines = [line.rstrip("\r") for line in text.decode("utf-8", errors="replace").split("\n")] if text else []
    if text.endswith(b"\n"):
        lines.pop()
    return lines, [info.st_ino, start + cut]


def read_here(
    job_dir: Path,
    wanted: Sequence[Source],
    offsets: Mapping[str, Any] | None,
    tail: int,
    final: bool,
    hidden: Sequence[bytes] = (),
) -> dict[str, Any]:
    """This node's part of an answer: ``{"chunks": {key: {"lines": [...], "at": [inode, offset]}},
    "missing": [keys]}`` (missing: no log here yet)."""
    chunks: dict[str, Any] = {}
    missing: list[str] = []
    for source in wanted:
        path = resolve(job_dir, source)
        if path is None:
            missing.append(source.key)
            continue
        at = None if offsets is None else offsets.get(source.key, [0, 0])
        try:
            lines, reached = read_log(path, at, tail, final, hidden)
        except OSError:
            missing.append(source.key)
            continue
        chunks[source.key] = {"lines": lines, "at": reached}
    return {"chunks": chunks, "missing": missing}


def has_lines(answer: Mapping[str, Any]) -> bool:
    return any(chunk["lines"] for chunk in answer.get("chunks", {}).values())


def wait_here(
    job_dir: Path,
    wanted: Sequence[Source],
    offsets: Mapping[str, Any] | None,
    tail: int,
    final: bool,
    wait: float,
    stop: Callable[[float], bool],
    hidden: Sequence[bytes] = (),
) -> dict[str, Any]:
    """:func:`read_here`, again every :data:`POLL` seconds until a line comes, ``wait`` seconds passed, or
    ``stop(seconds)`` (which waits up to that long) says to answer now."""
    deadline = time.monotonic() + wait
    while True:
        answer = read_here(job_dir, wanted, offsets, tail, final, hidden)
        left = deadline - time.monotonic()
        if has_lines(answer) or left <= 0 or stop(min(POLL, left)):
            return answer


def _stdin_closed(seconds: float) -> bool:
    """Whether the asker closed this command's input (answer now), waiting up to ``seconds`` for it."""
    try:
        ready, _, _ = select.select([sys.stdin], [], [], seconds)
    except (OSError, ValueError):
        time.sleep(seconds)
        return False
    return bool(ready) and os.read(sys.stdin.fileno(), 4096) == b""


def read_command(job_id: str, jobs_dir: str, request: Mapping[str, Any]) -> str:
    """The single-node form, as the supervisor's node runs it on another node over the mesh."""
    body = json.dumps(request, separators=(",", ":"))
    return (
        f". {node_jobs.NODE_ENV} && python -m {job_logs.MODULE} {shlex.quote(job_id)}"
        f" --jobs-dir {shlex.quote(jobs_dir)} --read {shlex.quote(body)}"
    )


class Remote:
    """One other node's read, over the mesh's ssh, started at once; :meth:`hurry` closes its input (answer
    now), :meth:`result` waits for its answer."""

    def __init__(self, mesh: Mesh, node: str, command: str, bound: float, done: threading.Event) -> None:
        self.node = node
        self.answer: dict[str, Any] | None = None
        self.error = ""
        self._bound = bound
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed by result(): it outlives this call)
        self._process = subprocess.Popen(
            [*mesh.ssh(node, *SHARED), command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
        )
        self._done = done
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        output = self._process.stdout.read().decode("utf-8", errors="replace")
        self._process.wait()
        self.answer = node_jobs.parse(output)
        if self.answer is None or "chunks" not in self.answer:
            self._errors.seek(0)
            said = self._errors.read().decode("utf-8", errors="replace").strip().splitlines()
            self.error = (said[-1] if said else "") or f"ssh exited with status {self._process.returncode}"
            self.answer = None
        elif has_lines(self.answer):
            self._done.set()

    def hurry(self) -> None:
        if self._process.stdin is not None and not self._process.stdin.closed:
            with contextlib.suppress(OSError):
                self._process.stdin.close()

    def result(self) -> dict[str, Any] | None:
        self._thread.join(self._bound)
        if self._thread.is_alive():
            self._process.kill()
            self._thread.join(5)
            self.error = self.error or f"no answer within {self._bound:.0f} s"
        self._errors.close()
        return self.answer


def masking(job_dir: Path, spec: jobspec.JobSpec) -> list[str]:
    """The texts to mask in what is printed: each secret value, and its JSON-escaped form. LogsError when
    the job has secrets whose values are gone here (its results were collected: the logs printed from here
    could not be masked)."""
    values = list(secrets.read(job_dir).values())
    if spec.secret_env and not values:
        raise job_logs.LogsError(
            f"job {spec.id} has secrets (secret_env) but its secrets.json is no longer on"
            f" {socket.gethostname()} (its results were collected): its logs, masked, are in"
            f" runs/{spec.id}/logs/ on the controller that collected it"
        )
    return [form.decode() for form in secrets.forms(values)]


def _encoded(texts: Sequence[str]) -> list[bytes]:
    """The texts to mask as the logs hold them, longest first (a secret that holds another masked whole)."""
    return sorted({text.encode() for text in texts}, key=len, reverse=True)


@dataclass
class Request:
    """What the supervisor's node is asked: which logs, from where, how long to wait."""

    job_id: str
    jobs_dir: str
    tail: int
    rank: int | None = None
    node: str = ""
    offsets: Mapping[str, Any] | None = None
    wait: float = 0.0


def answer_here(request: Request, mesh: Mesh) -> tuple[list[str], dict[str, Any]]:
    """On the node that runs the job's supervisor: the prefixed, masked lines of the logs asked for, and the
    summary (see the module's text)."""
    job_dir = Path(request.jobs_dir, request.job_id)
    spec = jobspec.load(job_dir / jobspec.JOB_FILE)
    wanted = select_sources(spec, request.rank, request.node)
    hidden = _encoded(masking(job_dir, spec))
    status = job_status.read(job_dir / job_status.FILE)
    final, state = ended(job_dir, mesh.me, status)
    wait = 0.0 if final or request.offsets is None else request.wait
    by_node: dict[str, list[Source]] = {}
    for source in wanted:
        by_node.setdefault(source.node, []).append(source)
    done = threading.Event()
    remotes = []
    for node, own in by_node.items():
        if node == mesh.me:
            continue
        offsets = (
            None if request.offsets is None else {s.key: request.offsets.get(s.key, [0, 0]) for s in own}
        )
        body = {
            "sources": [s.to_list() for s in own],
            "offsets": offsets,
            "tail": request.tail,
            "final": final,
            "wait": wait,
            # its node masks what it reads (its own JOB/secrets.json), and refuses when it has none
            "masked": bool(hidden),
        }
        command = read_command(request.job_id, request.jobs_dir, body)
        remotes.append(Remote(mesh, node, command, wait + COMMAND_TIMEOUT, done))

    def stop(seconds: float) -> bool:
        return done.wait(seconds) or ended(job_dir, mesh.me)[0]

    # Without logs here it only waits (for a remote's lines, the job's end or the bound).
    mine = by_node.get(mesh.me, [])
    local = wait_here(job_dir, mine, request.offsets, request.tail, final, wait, stop, hidden)
    for remote in remotes:
        remote.hurry()
    parts = {mesh.me: local}
    notes = []
    for remote in remotes:
        got = remote.result()
        if got is None:
            notes.append(
                f"{remote.node}: its logs could not be read over the mesh's ssh ({remote.error[:200]})"
            )
        else:
            parts[remote.node] = got
            if got.get("problem"):
                notes.append(f"{remote.node}: {got['problem']}")
    lines: list[str] = []
    offsets_reached: dict[str, Any] = {}
    quiet: dict[str, bool] = {}  # a rank whose logs are there, in a tail: whether they have no line
    for source in wanted:
        part = parts.get(source.node)
        if part is None:
            continue
        chunk = part.get("chunks", {}).get(source.key)
        if chunk is None:
            if source.stream == "stdout" and source.key in part.get("missing", []):
                notes.append(f"{source.prefix} no log yet")
            continue
        offsets_reached[source.key] = chunk["at"]
        lines += [f"{source.prefix} {line}" for line in chunk["lines"]]
        quiet[source.prefix] = quiet.get(source.prefix, True) and not chunk["lines"]
    if request.offsets is None:
        # a tail that shows nothing says why (the ranks have not written a whole line yet), not silence
        notes += [f"{prefix} no line written yet" for prefix, empty in quiet.items() if empty]
    summary = {
        "offsets": offsets_reached,
        "state": state,
        "done": final,
        "first": mesh.me,
        "notes": notes,
    }
    return lines, summary


def ended(job_dir: Path, me: str, status: job_status.Status | None = None) -> tuple[bool, str]:
    """Whether the job ended, as a follow sees it, and its state: its status says so, or its status says it
    runs but its supervisor (the status's pid) is gone from this node, where that status is, and nothing
    will change it again ("running, no supervisor on NODE", as jobs.yml says it). Not a standby's takeover:
    the standby takes over only a first node it cannot reach, and writes its own status on its own node,
    which locate prefers; a follow asks this node only while it answers."""
    found = status if status is not None else job_status.read(job_dir / job_status.FILE)
    if found is None:
        return False, "unknown"
    if found.done:
        return True, found.state
    if not supervisor_alive(job_dir, found.pid):
        return True, f"{found.state}, no supervisor on {me}"
    return False, found.state


def read_main(job_id: str, jobs_dir: str, body: str) -> int:
    """``--read``: this node's part of an answer, one JSON line (see :func:`read_here`)."""
    request = json.loads(body)
    wanted = [Source.from_list(item) for item in request["sources"]]
    offsets = request.get("offsets")
    job_dir = Path(jobs_dir, job_id)
    values = list(secrets.read(job_dir).values())
    hidden = secrets.forms(values)
    if request.get("masked") and not hidden:
        # the job has secrets but this node cannot read them: nothing unmasked leaves it
        problem = f"its logs are not shown: the job's secrets.json is not readable on {socket.gethostname()}"
        print(json.dumps({"chunks": {}, "missing": [], "problem": problem}, separators=(",", ":")))
        return 0
    answer = wait_here(
        job_dir,
        wanted,
        offsets,
        int(request.get("tail") or job_logs.TAIL),
        bool(request.get("final")),
        float(request.get("wait") or 0.0),
        _stdin_closed,
        hidden,
    )
    print(json.dumps(answer, separators=(",", ":")))
    return 0


def forward(mesh: Mesh, first: str, argv: Sequence[str], bound: float) -> int:
    """Run this command on ``first`` (the supervisor's node) over the mesh, its output as this one's."""
    command = f". {node_jobs.NODE_ENV} && " + " ".join(shlex.quote(arg) for arg in argv)
    try:
        done = subprocess.run(
            [*mesh.ssh(first, *SHARED), command], capture_output=True, timeout=bound, check=False
        )
    except subprocess.TimeoutExpired:
        print(f"{first} (running job's supervisor) gave no answer within {bound:.0f} s", file=sys.stderr)
        return 3
    sys.stdout.buffer.write(done.stdout)
    sys.stderr.buffer.write(done.stderr)
    if done.returncode == 255 and not done.stdout:
        print(
            f"{first}, which runs the job's supervisor, does not answer over the mesh's ssh", file=sys.stderr
        )
    return done.returncode


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m {job_logs.MODULE}", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("job_id", help="the job's id")
    parser.add_argument("--jobs-dir", default="/workspace/jobs", help="the jobs' directory in the node")
    parser.add_argument("--tail", type=int, default=job_logs.TAIL, help="each log's last lines (default 20)")
    parser.add_argument("--rank", type=int, default=None, help="this rank's log only")
    parser.add_argument("--node", default="", help="the logs of the ranks on this node only")
    parser.add_argument("--follow-from", default=None, help="the offsets an earlier answer reached (JSON)")
    parser.add_argument(
        "--wait", type=float, default=0.0, help="seconds to wait for a new line (with offsets)"
    )
    parser.add_argument("--first", default="", help="the node that runs the job's supervisor, when known")
    parser.add_argument("--nodes", default="", help="the cluster's nodes, comma-separated (to find the job)")
    parser.add_argument("--read", default=None, help=argparse.SUPPRESS)  # one node's part (the first's ask)
    parser.add_argument("--here", action="store_true", help=argparse.SUPPRESS)  # forwarded: answer here
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(args_list)
    jobs_dir = args.jobs_dir.rstrip("/")
    me = socket.gethostname()
    mesh = Mesh(me)
    try:
        if args.read is not None:
            return read_main(args.job_id, jobs_dir, args.read)
        if args.tail < 1:
            raise job_logs.LogsError(f"--tail {args.tail} must be a positive whole number")
        offsets = json.loads(args.follow_from) if args.follow_from is not None else None
        if offsets is not None and not isinstance(offsets, dict):
            raise job_logs.LogsError(
                "--follow-from must be a JSON mapping of offsets, as an answer gave them"
            )
        first = args.first
        if not first:
            nodes = [node for node in args.nodes.split(",") if node]
            first = locate(args.job_id, jobs_dir, mesh, nodes or None).first
        if first != me and not args.here:
            again = [*_without(args_list, "--first", "--nodes"), "--first", first, "--here"]
            again = ["python", "-m", job_logs.MODULE, *again]
            return forward(mesh, first, again, args.wait + 2 * COMMAND_TIMEOUT)
        request = Request(args.job_id, jobs_dir, args.tail, args.rank, args.node, offsets, args.wait)
        lines, summary = answer_here(request, mesh)
    except (DdpClusterError, ValueError) as error:
        print(f"ddp_cluster.supervisor.logs: {error}", file=sys.stderr)
        return 3 if isinstance(error, JobNotFound) else 2
    out = sys.stdout
    for line in lines:
        out.write(line + "\n")
    out.write(json.dumps(summary, separators=(",", ":")) + "\n")
    out.flush()
    return 0


def _without(argv: Sequence[str], *options: str) -> list[str]:
    """``argv`` without the given options and their values (either form: --opt V, --opt=V)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in options:
            skip = True
            continue
        if any(arg.startswith(f"{option}=") for option in options):
            continue
        kept.append(arg)
    return kept


if __name__ == "__main__":
    sys.exit(main())
