"""Which nodes of a job stopped answering, at a cost on the first node that does not grow with the node count;
and, going the other way, a job's processes that outlive their watcher's parent.

The job's nodes form a tree (node 0 the root, node i's children ``i*fanout+1`` .. ``i*fanout+fanout``). Each
node watches only its children, each over one persistent ssh session that runs this module on the child, which
watches its own children the same way and prints to its parent ``up AGE`` every interval (AGE: seconds since
the newest sign of progress in its subtree, ``-`` when none is known) and ``down NODE`` when it finds a node
of its subtree gone. So the first node holds ``fanout`` sessions and reads ``fanout`` lines per interval,
whatever the job's size; a dead node is named by its parent, and the name travels up one line per level.

**A child is lost when it has not been heard for ``timeout`` seconds** (an ``up`` line, or a login that
succeeded), whatever ssh said meanwhile: refused, no route, keepalives unanswered, a login timed out in the
banner exchange (a frozen node whose kernel still answers TCP). Heard again before that, it is not: a network
blip shorter than ``timeout`` loses nothing. A session that is silent for ``3*every + ssh_timeout`` is ended
and the child reconnected to about every second (a new TCP connection, not one whose retransmissions have
backed off through the blip) until it answers or its time is up.

**The parent says it is alive**: it writes ``ping`` to each child's session every ``every`` seconds, and
``end`` when it stops watching. A remote watcher given ``--tag`` stops the job's processes on its own node
(``pkill -TERM -f`` on the tag's pattern, up to :data:`SWEEP_GRACE` seconds for them to end, then ``-KILL``)
and tells its own children to do the same, when its parent is gone:

- ``end`` received: the attempt ended; the ranks are usually gone already. (A child found lost is not told
  ``end``: should it come back, it waits like the next case, so that a supervisor that was frozen and whose
  job was taken over cannot stop the new attempt's ranks.)
- no ping on any session to this node for ``timeout`` seconds: a frozen or killed parent node, whose TCP
  session stays half-open.
- its session closed without ``end`` (the parent process was killed) and no other session to this node
  pinged within :func:`reconnect_window` seconds. A session broken by a blip also closes without ``end``, once
  the network is back; the parent then reconnects at once and the new session's pings (recorded in a file in
  the node's temporary folder, one per job) tell the old watcher to end quietly, without a sweep.

The tag goes on the watcher's command line in pattern form (``[/]workspace/jobs/ID/``, every regular
expression character escaped: :func:`ddp_cluster.job.node_jobs.literal_pattern`), and the job folder
without its trailing slash, so that neither the watcher nor the ssh session that runs it matches the sweep.

    python -m ddp_cluster.supervisor.liveness --nodes N0,N1,... --index I [--fanout 4] [--every 3]
    [--ssh-timeout 3] [--timeout 25] [--job-dir JOB] [--tag '[/]JOB/']

runs node I's watcher (started over ssh by its parent). Standard library only, and the package's torch-free
node_jobs (the one rule of a process pattern).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ddp_cluster.job import node_jobs

FANOUT = 4
TIMEOUT = 25.0  # the job's liveness_timeout by default
# The folder (under JOB) a rank's ddp_cluster.heartbeat() touches; runtime/heartbeat.py holds the same name (a
# rank's code and the supervisor may not import one another).
HEARTBEAT_DIR = "heartbeat"
LOGS_DIR = "logs"  # job/results.py's LOGS: the ranks' output, written on each rank's own node
METRICS = ("output", "metrics.jsonl")  # the entrypoint's steps
SWEEP_GRACE = 3.0  # seconds between TERM and KILL, as the supervisor's own sweep (remote.STOP_GRACE)
# ssh's words when the node's TCP stack answered but its sshd did not finish the login in time (MaxStartups,
# load, or a frozen node whose kernel still answers).
SSH_SLOW = re.compile(r"banner exchange|kex_exchange_identification|Connection closed by|Connection reset by")
# An established session whose keepalives went unanswered (ServerAliveInterval x ServerAliveCountMax). ssh
# says so, and what went wrong in a login, at LogLevel INFO: the sessions ask for it (the mesh's ssh_config
# keeps interactive use at ERROR).
SSH_SILENT = re.compile(r"Timeout, server .* not responding")


def probe_verdict(returncode: int | None, stderr: str) -> str:
    """An ssh attempt's outcome: 'up' (logged in), 'slow' (the node's TCP stack answered but sshd did not
    finish in time, or ssh ran past its bound after connecting), 'down' (refused, no route, a name that
    no longer resolves, no TCP answer at all: the container or the server is gone)."""
    if returncode == 0:
        return "up"
    if returncode is None or SSH_SLOW.search(stderr):
        return "slow"
    return "down"


def children(index: int, count: int, fanout: int = FANOUT) -> list[int]:
    """The children of node ``index`` in the job's tree of ``count`` nodes."""
    first = index * fanout + 1
    return list(range(first, min(first + fanout, count)))


def depth(count: int, fanout: int = FANOUT) -> int:
    """Levels below the root: how many hops a dead node's name travels at most."""
    levels, index = 0, count - 1
    while index > 0:
        index = (index - 1) // fanout
        levels += 1
    return levels


def tag_pattern(tag: str) -> str:
    """pgrep's pattern of the processes whose command lines hold ``tag`` itself: '[/]workspace/jobs/ID/',
    every regular expression character escaped (job a.1's never matches job a-1's); it matches them but not
    a command line that holds the pattern itself (the one rule: node_jobs.literal_pattern)."""
    return node_jobs.literal_pattern(tag)


def ssh_argv(node: str, remote: Sequence[str], every: float, ssh_timeout: int) -> list[str]:
    """One session to ``node`` running ``remote``: keepalives every ``every`` s, three unanswered end it. Its
    own TCP connection (``ControlPath=none``): over the mesh's shared connection (ControlMaster) the
    keepalives would be the master's, and a verdict on the node one on a connection opened minutes ago."""
    return [
        "ssh",
        "-T",
        "-o",
        "ControlPath=none",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={ssh_timeout}",
        "-o",
        f"ServerAliveInterval={max(1, round(every))}",
        "-o",
        "ServerAliveCountMax=3",
        "-o",
        "LogLevel=INFO",
        node,
        " ".join(shlex.quote(word) for word in remote),
    ]


def node_activity_age(job_dir: Path, now: float | None = None) -> float | None:
    """Seconds since the newest change to this node's signs of progress: any file under JOB/logs (the ranks'
    output), JOB/heartbeat (ddp_cluster.heartbeat()) and JOB/output/metrics.jsonl; None when none exists.
    Reads modification times only."""
    newest = max(_newest(job_dir / LOGS_DIR), _newest(job_dir / HEARTBEAT_DIR))
    with contextlib.suppress(OSError):
        newest = max(newest, job_dir.joinpath(*METRICS).stat().st_mtime)
    if newest < 0:
        return None
    return max(0.0, (time.time() if now is None else now) - newest)


def _newest(folder: Path) -> float:
    """The newest modification time of a file under ``folder``, -1 when there is none."""
    newest = -1.0
    try:
        entries = os.scandir(folder)
    except OSError:
        return newest
    with entries:
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    newest = max(newest, _newest(Path(entry.path)))
                elif entry.is_file(follow_symlinks=False):
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
            except OSError:  # removed while we looked
                continue
    return newest


Spawn = Callable[[str, list[str]], "subprocess.Popen[str]"]


def _spawn(node: str, argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    )


@dataclass
class _Child:
    """What a watch knows of one node it watches directly."""

    index: int
    node: str
    heard: float  # monotonic time it was last heard (the watch's start before its first word)
    session: subprocess.Popen[str] | None = None
    since: float = 0.0  # monotonic time the current session started
    age: float | None = None  # the subtree's progress age it last reported, and when (monotonic)
    age_at: float = 0.0
    words: str = ""  # what ssh said last, for the loss's message
    lost: bool = False


class Watch:
    """Node ``index``'s watch of its children (and through them, of its whole subtree).

    ``report`` receives each node found lost (the remote watcher prints it to its parent). ``spawn`` starts a
    session (tests give a stand-in for ssh). ``job_dir``: this node's own progress counts in
    :meth:`activity_age`, and the remote watchers get it; ``tag`` (text in every command line of the job's
    processes, JOB/): the remote watchers stop the job's processes on their node when their parent is gone."""

    def __init__(
        self,
        nodes: Sequence[str],
        index: int = 0,
        fanout: int = FANOUT,
        every: float = 3.0,
        ssh_timeout: int = 3,
        report: Callable[[str], None] | None = None,
        spawn: Spawn = _spawn,
        timeout: float = TIMEOUT,
        job_dir: Path | str | None = None,
        tag: str = "",
    ) -> None:
        self.nodes = list(nodes)
        self.index = index
        self.fanout = fanout
        self.every = every
        self.ssh_timeout = ssh_timeout
        self.report = report or (lambda node: None)
        self.spawn = spawn
        self.timeout = timeout
        self.job_dir = Path(job_dir) if job_dir is not None else None
        self.tag = tag
        self._lost: list[str] = []
        self._why: dict[str, str] = {}
        self._children: dict[int, _Child] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def remote(self, child: int) -> list[str]:
        """The watcher's command on ``child``; it holds neither the tag nor the job folder with a slash after
        it, so that the job's sweep (on that node, or on this one) does not match it."""
        argv = [
            "python",
            "-m",
            "ddp_cluster.supervisor.liveness",
            "--nodes",
            ",".join(self.nodes),
            "--index",
            str(child),
            "--fanout",
            str(self.fanout),
            "--every",
            f"{self.every:g}",
            "--ssh-timeout",
            str(self.ssh_timeout),
            "--timeout",
            f"{self.timeout:g}",
        ]
        if self.job_dir is not None:
            argv += ["--job-dir", str(self.job_dir).rstrip("/") or "/"]
        if self.tag:
            argv += ["--tag", tag_pattern(self.tag)]
        return argv

    # --- what the watch knows -----------------------------------------------------------------------------
    def start(self) -> Watch:
        thread = threading.Thread(target=self._monitor, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()
        for child in children(self.index, len(self.nodes), self.fanout):
            self._start_thread(child)
        return self

    def lost(self) -> list[str]:
        """The nodes found lost, in the order found: children, and nodes their watchers reported."""
        with self._lock:
            return list(self._lost)

    def why(self, node: str) -> str:
        """How ``node`` was found lost, in words for the job's failure ('' if it was not)."""
        with self._lock:
            return self._why.get(node, "")

    def suspects(self) -> list[str]:
        """The watched nodes unheard for more than two intervals but not yet lost: a verdict on them is due
        within ``timeout`` seconds."""
        now = time.monotonic()
        with self._lock:
            return [
                state.node
                for state in self._children.values()
                if not state.lost and now - state.heard > 2 * self.every
            ]

    def heard_within(self, seconds: float) -> bool:
        """Whether every watched node not yet lost was heard within the last ``seconds``."""
        now = time.monotonic()
        with self._lock:
            return all(now - state.heard <= seconds for state in self._children.values() if not state.lost)

    def activity_age(self) -> float | None:
        """Seconds since the freshest sign of progress in the tree below (and on) this node: this node's own
        files (``job_dir``) and each child's last reported age, aged by the time since it came; None when no
        node knows of any."""
        ages = []
        if self.job_dir is not None and (own := node_activity_age(self.job_dir)) is not None:
            ages.append(own)
        now = time.monotonic()
        with self._lock:
            reported = [(state.age, state.age_at) for state in self._children.values()]
        ages += [age + now - at for age, at in reported if age is not None]
        return min(ages) if ages else None

    # --- ending ---------------------------------------------------------------------------------------------
    def close(self, end: bool = True) -> None:
        """Stop watching without waiting: each session's input ends, after ``end`` when ``end`` (the remote
        watcher then stops the job's processes on its node; without it, it waits for a reconnection first)."""
        self._stop.set()
        with self._lock:
            sessions = [state.session for state in self._children.values() if state.session is not None]
        for session in sessions:
            self._hang_up(session, end)

    def stop(self, within: float = SWEEP_GRACE + 2.0, end: bool = True) -> None:
        """End every session at once (each remote watcher sees its input end and ends its own, stopping the
        job's processes on its node first when ``end``), within ``within`` seconds in all."""
        self.close(end)
        with self._lock:
            sessions = [state.session for state in self._children.values() if state.session is not None]
            threads = list(self._threads)
        deadline = time.monotonic() + within
        for session in sessions:
            try:
                session.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                session.kill()
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=max(0.1, deadline - time.monotonic()))

    # --- the sessions ---------------------------------------------------------------------------------------
    def _say(self, session: subprocess.Popen[str], word: str) -> None:
        with self._write_lock:
            try:
                if session.stdin and not session.stdin.closed:
                    session.stdin.write(word + "\n")
                    session.stdin.flush()
            except (OSError, ValueError):  # the session is ending: its reader sees it
                pass

    def _hang_up(self, session: subprocess.Popen[str], end: bool) -> None:
        if end:
            self._say(session, "end")
        with self._write_lock:
            _close_input(session)

    def _mark(self, node: str, why: str) -> None:
        with self._lock:
            if node in self._lost:
                return
            self._lost.append(node)
            self._why[node] = why
        self.report(node)

    def _lose(self, state: _Child, now: float) -> None:
        """``state``'s node was not heard for ``timeout`` s: lost, its session ended. Without ``end``: should
        the node come back, its watcher stops what is left of the job there after its reconnect window, unless
        a newer supervisor's watch pings it by then (this one was frozen, and the job was taken over)."""
        with self._lock:
            if state.lost:
                return
            state.lost = True
            session = state.session
            words = state.words
        said = f"; ssh said: {words}" if words else ""
        self._mark(state.node, f"{state.node} was not heard from for {round(now - state.heard, 1):g} s{said}")
        if session is not None:
            self._hang_up(session, end=False)
            session.kill()

    def _monitor(self) -> None:
        """Pings every child's session every interval, finds a child lost once its time is up, and ends a
        session that has been silent too long (a frozen node keeps it open until ssh's keepalives give up)."""
        tick = min(self.every, 0.5)
        silent_limit = 3 * self.every + self.ssh_timeout
        next_ping = 0.0
        while not self._stop.wait(tick):
            now = time.monotonic()
            with self._lock:
                states = [state for state in self._children.values() if not state.lost]
            if now >= next_ping:
                next_ping = now + self.every
                for state in states:
                    if state.session is not None and state.session.poll() is None:
                        self._say(state.session, "ping")
            for state in states:
                if now - state.heard >= self.timeout:
                    self._lose(state, now)
                elif (
                    state.session is not None
                    and state.session.poll() is None
                    and now - max(state.since, state.heard) > silent_limit
                ):
                    state.session.kill()  # its reader reconnects

    def _start_thread(self, child: int) -> None:
        with self._lock:
            if child in self._children:
                return
            self._children[child] = _Child(child, self.nodes[child], heard=time.monotonic())
        thread = threading.Thread(target=self._watch, args=(child,), daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _adopt(self, child: int) -> None:
        """The watcher does not start on ``child`` (a node on another image, no python): watch its children
        from here, so that its subtree is still watched; the node itself is still watched over ssh."""
        node = self.nodes[child]
        orphans = children(child, len(self.nodes), self.fanout)
        adopted = ", ".join(self.nodes[index] for index in orphans) or "nothing more"
        say(f"liveness: the watcher does not start on {node}; {self.nodes[self.index]} watches {adopted}")
        for orphan in orphans:
            self._start_thread(orphan)

    def _watch(self, child: int) -> None:
        state = self._children[child]
        argv = ssh_argv(state.node, self.remote(child), self.every, self.ssh_timeout)
        broken = 0
        while not self._stop.is_set() and not state.lost:
            session = self.spawn(state.node, argv)
            with self._lock:
                state.session, state.since = session, time.monotonic()
                ending = self._stop.is_set() or state.lost
            if ending:
                self._hang_up(session, end=True)
                _end(session)
                return
            self._say(session, "ping")  # at once: the child's watcher knows its parent from its first second
            said_up = self._read(state, session)
            stderr = _end(session)
            code = session.returncode
            logged_in = code is not None and code >= 0 and code != 255  # not ssh's failure, not killed here
            with self._lock:
                if logged_in:
                    state.heard = max(state.heard, time.monotonic())
                lines = [line.strip() for line in stderr.splitlines() if line.strip()]
                state.words = "; ".join(lines[-3:])[-300:] if lines else state.words
            if self._stop.is_set() or state.lost:
                return
            if logged_in and not said_up:
                broken += 1
                if broken == 2:  # twice without a word: the watcher cannot run there
                    self._adopt(child)
            elif said_up:
                broken = 0
            # Unheard: try again about every second until heard or lost (the monitor's verdict); a node
            # where the watcher does not run is only logged into every interval.
            self._stop.wait(self.every if logged_in and not said_up else min(self.every, 1.0))

    def _read(self, state: _Child, session: subprocess.Popen[str]) -> bool:
        """Follow a child's lines until its session ends; True if it said ``up`` at least once."""
        said_up = False
        assert session.stdout is not None
        for line in session.stdout:
            word, _, rest = line.strip().partition(" ")
            if word == "up":
                said_up = True
                now = time.monotonic()
                with self._lock:
                    state.heard = now
                    if rest:  # an older watcher says only "up": heard, its age unknown
                        state.age, state.age_at = _age(rest), now
            elif word == "down" and rest:
                self._mark(rest, f"{rest} was reported lost by {state.node}")
            if self._stop.is_set() or state.lost:
                break
        return said_up


def _age(text: str) -> float | None:
    try:
        return max(0.0, float(text))
    except ValueError:  # "-": no sign of progress known below that node
        return None


def _close_input(session: subprocess.Popen[str]) -> None:
    try:
        if session.stdin:
            session.stdin.close()
    except (OSError, ValueError):
        pass


def _end(session: subprocess.Popen[str]) -> str:
    """Close a session (its remote watcher sees its input end) and return what ssh said on stderr."""
    if session.poll() is None:
        _close_input(session)
        try:
            session.wait(timeout=5)
        except subprocess.TimeoutExpired:
            session.kill()
            session.wait()
    try:
        return session.stderr.read() if session.stderr else ""
    except (OSError, ValueError):
        return ""


# --- the remote watcher: its parent -------------------------------------------------------------------------
def reconnect_window(every: float, ssh_timeout: float, timeout: float) -> float:
    """Seconds a watcher whose session closed without ``end`` waits for its parent's next session: a parent
    that lost its session in a blip reconnects at once (a new login within ssh's ConnectTimeout plus a
    second, pings every interval), a killed one never does."""
    return min(timeout, 3 * every + ssh_timeout)


def parent_record(pattern: str) -> Path:
    """The file whose modification time is the last ping any session to this node received for the job whose
    processes match ``pattern`` (one per job and node, in the node's temporary folder)."""
    digest = hashlib.sha256(pattern.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"ddp-liveness-{digest}"


class ParentLink:
    """What a remote watcher knows of its parent: the pings on its input (and, through ``record``, on any
    other session to this node for the same job), ``end``, the input's end. :meth:`verdict` says when the
    parent is gone. Times are wall-clock nanoseconds (``clock``), as the record's modification time."""

    def __init__(
        self,
        timeout: float,
        window: float,
        record: Path | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.timeout_ns = int(timeout * 1e9)
        self.window_ns = int(window * 1e9)
        self.record = record
        self.clock = clock
        self.news = threading.Event()  # set on ``end`` and on the input's end: the loop acts at once
        self._lock = threading.Lock()
        self._pinged = clock()  # the watcher's start counts as a ping: the parent pings at once
        self._closed: int | None = None
        self._ended = False

    def line(self, text: str) -> None:
        word = text.strip()
        if word == "ping":
            now = self.clock()
            with self._lock:
                self._pinged = now
            if self.record is not None:
                try:
                    self.record.touch()
                    os.utime(self.record, ns=(now, now))
                except OSError:
                    pass
        elif word == "end":
            with self._lock:
                self._ended = True
            self.news.set()

    def closed(self) -> None:
        with self._lock:
            if self._closed is None:
                self._closed = self.clock()
        self.news.set()

    def follow(self, source: IO[str]) -> None:
        """Read the parent's words until the input ends (run in a thread)."""
        try:
            for text in source:
                self.line(text)
        except (OSError, ValueError):
            pass
        self.closed()

    def verdict(self) -> str | None:
        """None while the parent is alive or may yet come back; 'end' (it said so), 'gone' (killed, frozen
        or unreachable: stop the job's processes here), 'superseded' (this session is dead but a newer one to
        this node pings: end quietly, the newer watcher watches)."""
        with self._lock:
            ended, pinged, closed = self._ended, self._pinged, self._closed
        if ended:
            return "end"
        now = self.clock()
        if closed is not None and self.record is None:
            return "gone"  # nothing can tell a reconnection: nothing to wait for
        newer = self._record_ns() > pinged
        if closed is not None:
            if newer:
                return "superseded"
            return "gone" if now - closed >= self.window_ns else None
        if now - pinged >= self.timeout_ns:
            return "superseded" if newer else "gone"
        return None

    def superseded(self) -> bool:
        """Whether another session to this node for the same job pinged after this one's last ping."""
        with self._lock:
            pinged = self._pinged
        return self._record_ns() > pinged

    def _record_ns(self) -> int:
        if self.record is None:
            return -1
        try:
            return self.record.stat().st_mtime_ns
        except OSError:
            return -1


def sweep_node(
    pattern: str,
    run: Callable[[list[str]], int] | None = None,
    grace: float = SWEEP_GRACE,
    sleep: Callable[[float], None] = time.sleep,
    proceed: Callable[[], bool] = lambda: True,
) -> None:
    """Stop this node's processes whose command lines match ``pattern``: TERM, up to ``grace`` seconds for
    them to end, then KILL of what is left, unless ``proceed`` says no by then (a newer watcher of the job
    pings here: the job was restarted, and what matches now may be its new ranks)."""
    run = run or _run
    if run(["pkill", "-TERM", "-f", "--", pattern]) != 0:  # 1: nothing matched
        return
    step = 0.2
    for _ in range(max(1, round(grace / step))):
        sleep(step)
        if run(["pgrep", "-f", "--", pattern]) != 0:  # all gone: no need to wait out the grace
            return
    if proceed():
        run(["pkill", "-KILL", "-f", "--", pattern])


def say(text: str) -> None:
    """A line to stderr, which for a remote watcher is its ssh session: once the parent is gone that session
    may be closed, and a write there must not end the watcher before it sweeps the job and gives its claim
    back."""
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)


def release_claim(job_dir: str) -> None:
    """This node's claim of the job, released once its processes here were swept (its parent is gone or its
    attempt ended: a node cut off from its job, thawed later, is free for the next job at once; a restart's
    supervisor claims its nodes again before it launches)."""
    try:
        from ddp_cluster.supervisor import jobs  # here: only when sweeping (jobs imports this module)

        folder = job_dir.rstrip("/")
        jobs.release(folder.rsplit("/", 1)[0], folder.rsplit("/", 1)[-1])
    except Exception as error:  # a claim left behind goes stale by itself
        say(f"liveness: the claim of {job_dir} was not released: {error}")


def _run(argv: list[str]) -> int:
    try:
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
        return done.returncode
    except (OSError, subprocess.TimeoutExpired) as error:
        say(f"liveness: {' '.join(argv)} failed: {error}")
        return -1


def serve(
    watch: Watch,
    every: float,
    out: IO[str],
    parent: ParentLink,
    sweep: Callable[[], None] | None = None,
    lock: threading.Lock | None = None,
) -> str:
    """A remote watcher's loop: ``up AGE`` every ``every`` s to the parent until the parent is gone; then,
    unless a newer session took over, the job's processes here are stopped (``sweep``) and the children told
    to stop theirs. Returns the parent's verdict."""
    watch.start()
    tick = min(every, 0.5)
    next_up = 0.0
    talking = True
    verdict = parent.verdict()
    while verdict is None:
        now = time.monotonic()
        if talking and now >= next_up:
            next_up = now + every
            age = watch.activity_age()
            talking = _tell(out, f"up {'-' if age is None else f'{age:.1f}'}", lock or threading.Lock())
        parent.news.wait(tick)
        parent.news.clear()
        verdict = parent.verdict()
    if verdict == "superseded":
        watch.stop(end=False)  # the children's newer sessions, from this node's newer watcher, carry on
        return verdict
    watch.close(end=True)  # the children stop theirs meanwhile
    if sweep is not None:
        if verdict != "end":
            here = watch.nodes[watch.index]
            say(f"liveness: {here}'s parent is gone; stopping the job here")
        sweep()
    watch.stop(end=True)
    return verdict


def main(
    argv: Sequence[str] | None = None,
    stdin: IO[str] | None = None,
    stdout: IO[str] | None = None,
    run: Callable[[list[str]], int] | None = None,
    spawn: Spawn = _spawn,
) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ddp_cluster.supervisor.liveness", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--nodes", required=True, help="the job's nodes, comma-separated, the first node first"
    )
    parser.add_argument("--index", type=int, required=True, help="this node's place in --nodes")
    parser.add_argument("--fanout", type=int, default=FANOUT)
    parser.add_argument("--every", type=float, default=3.0, help="seconds between heartbeats and keepalives")
    parser.add_argument("--ssh-timeout", type=int, default=3)
    parser.add_argument(
        "--timeout", type=float, default=TIMEOUT, help="seconds unheard before a node (or the parent) is lost"
    )
    parser.add_argument("--job-dir", type=Path, help="the job's folder: its progress here is reported up")
    parser.add_argument(
        "--tag",
        default="",
        help="pgrep's pattern of the job's processes ('[/]workspace/jobs/ID/'): stopped on this node when "
        "the parent is gone",
    )
    args = parser.parse_args(argv)
    nodes = [node for node in args.nodes.split(",") if node]
    if not 0 <= args.index < len(nodes) or args.fanout < 1 or args.every <= 0 or args.timeout <= 0:
        parser.error("--index must be a place in --nodes, --fanout at least 1, --every and --timeout above 0")
    if args.tag and not re.fullmatch(r"\[.\].*", args.tag):
        parser.error(
            f"--tag {args.tag!r} must be in pattern form ('[/]workspace/jobs/ID/'), so that this command "
            "line does not match it and the sweep does not stop this watcher"
        )
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    lock = threading.Lock()  # "up" and "down" lines come from different threads

    def tell_parent(node: str) -> None:
        _tell(stdout, f"down {node}", lock)

    # The tag's pattern (JOB/ escaped, its first character bracketed) names the same processes as JOB/ itself.
    tag = node_jobs.literal_of(args.tag) if args.tag else ""
    watch = Watch(
        nodes,
        args.index,
        args.fanout,
        args.every,
        args.ssh_timeout,
        report=tell_parent,
        spawn=spawn,
        timeout=args.timeout,
        job_dir=args.job_dir,
        tag=tag,
    )
    parent = ParentLink(
        args.timeout,
        reconnect_window(args.every, args.ssh_timeout, args.timeout),
        record=parent_record(args.tag) if args.tag else None,
    )
    threading.Thread(target=parent.follow, args=(stdin,), daemon=True).start()

    def sweep() -> None:
        sweep_node(args.tag, run, proceed=lambda: not parent.superseded())
        if args.job_dir and not parent.superseded():
            release_claim(str(args.job_dir))

    serve(watch, args.every, stdout, parent, sweep if args.tag else None, lock)
    return 0


def _tell(out: IO[str], line: str, lock: threading.Lock) -> bool:
    """Write one line to the parent; False once its session is gone (the input's end follows)."""
    with lock:
        try:
            out.write(line + "\n")
            out.flush()
            return True
        except (OSError, ValueError):
            return False


if __name__ == "__main__":
    raise SystemExit(main())
