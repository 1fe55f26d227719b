"""The progress watchdog: a job that stops making progress is stopped, with every rank's Python stacks kept.

Progress on a node is the newest change under ``JOB/logs`` (a rank's output), ``JOB/heartbeat``
(``ddp_cluster.heartbeat()``) and ``JOB/output/metrics.jsonl`` (the entrypoint's steps); the liveness tree
reports its age for every node, and the supervisor gives the freshest of them to :class:`Watchdog` at each
poll. The rules (``stall_timeout`` and ``stall_start_timeout``, job settings):

* The first progress of an attempt is the first change anywhere dated after the attempt's start: a rank's
  first line of output counts, whether a step, a warning printed by an import or the script's own
  "loading data". Changes older than the start (a previous attempt's logs) never count.
* Before it, the attempt has ``stall_start_timeout`` seconds from its start (the launch, ssh to every node,
  the interpreter and torch starting): none by then is a stall.
* After it, a silence longer than ``stall_timeout`` is a stall, whatever the phase: a script that loads data
  or evaluates silently for longer calls ``ddp_cluster.heartbeat()`` meanwhile (or the job sets a larger
  ``stall_timeout``). ``stall_timeout=0``: no watchdog.

On a stall, :func:`capture` has every rank dump its stacks (SIGUSR2: the ranks' ``faulthandler``, installed by
``ddp_cluster.runtime.heartbeat``; ``py-spy dump`` too where a node has it), brings the dumps to this node
under ``JOB/stacks/<node>/`` and names the ranks whose main thread is not inside a collective: while one rank
waits outside (a hung data loader, a stuck file, a sleep), all the others wait inside one for it.

Standard library only (the supervisor's Python); the file layout is ``ddp_cluster.runtime.heartbeat``'s,
which the supervisor may not import: ``tests/test_stall.py`` holds the names equal.
"""

from __future__ import annotations

import math
import re
import shlex
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STALL = "stall"  # a Failure's cause: the restart record's and the status's word for it
STACKS_DIR = "stacks"
DUMP_LIMIT = 256 * 1024  # bytes of a rank's newest dump brought back (the main thread is dumped last)
CAPTURE_POOL = 32  # nodes asked at a time
PY_SPY_TIMEOUT = 10
NO_SIGN = "no rank printed a line, recorded a step or called ddp_cluster.heartbeat()"
NO_DUMP = "no stack dump (the process did not answer SIGUSR2: stuck in the kernel, on a file or a device?)"
# A frame from one of these files means the thread waits in (or runs) a collective: DDP's backward waits for
# the gradients' all-reduce inside autograd.
COLLECTIVE_FRAMES = ("torch/distributed/", "torch/nn/parallel/distributed.py", "torch/autograd/")
THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):\s*$")
FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')
FILE_MARK = "=== FILE "
ANSWERED = "stacks: signalled"  # the last line of a node's answer to the signal command
RANK_FILE = re.compile(r"^rank\.(\d+)\.(txt|pid)$")
PY_SPY_FILE = re.compile(r"^py-spy\.rank\.(\d+)\.txt$")


class Watchdog:
    """Whether the job has stalled, from the age of its freshest progress (see the module's rules)."""

    def __init__(self, stall_timeout: float, start_timeout: float, started: float) -> None:
        self.stall_timeout = stall_timeout
        self.start_timeout = start_timeout
        self.started = started
        self.last: float | None = None  # when the attempt's freshest progress happened

    def reset(self, started: float) -> None:
        """A new attempt (a restart) started at ``started``: it gets its own start-up allowance."""
        self.started = started
        self.last = None

    def check(self, now: float, age: float | None) -> str | None:
        """None while the job makes progress; else why it stalled. ``age``: seconds since the freshest
        progress on any node (None: none found, or no node answered this time: the last one seen stands)."""
        if self.stall_timeout <= 0:
            return None
        if age is not None:
            at = now - age
            if at >= self.started and (self.last is None or at > self.last):
                self.last = at
        if self.last is None:
            waited = now - self.started
            if waited <= self.start_timeout:
                return None
            return (
                f"no progress within {math.ceil(waited)} s of the start"
                f" (stall_start_timeout={self.start_timeout:g}: {NO_SIGN})"
            )
        silent = now - self.last
        if silent <= self.stall_timeout:
            return None
        # Rounded up: "no progress for 20 s (stall_timeout=20)" would read as no stall at all.
        return f"no progress for {math.ceil(silent)} s (stall_timeout={self.stall_timeout:g}: {NO_SIGN})"


# --- the stacks -------------------------------------------------------------------------------------------
@dataclass
class RankStack:
    """A rank's newest dump, read: where its main thread is, and whether that is inside a collective."""

    in_collective: bool
    top: str  # "file:line function" of the main thread's innermost frame


def dump_threads(dump: str) -> list[tuple[int, list[tuple[str, str, str]]]]:
    """A faulthandler dump's threads, in its order: (id, frames (file, line, function), innermost first)."""
    threads: list[tuple[int, list[tuple[str, str, str]]]] = []
    for line in dump.splitlines():
        if match := THREAD.match(line):
            threads.append((int(match.group(1), 16), []))
        elif threads and (frame := FRAME.match(line)):
            threads[-1][1].append((frame.group(1), frame.group(2), frame.group(3)))
    return threads


def read_stack(dump: str, main_thread: int | None = None) -> RankStack | None:
    """The rank's place from its dump: its main thread, the one whose id is ``main_thread``, else the last
    one dumped (CPython lists the newest thread first). None when the dump holds no thread."""
    threads = dump_threads(dump)
    if not threads:
        return None
    frames = next((frames for ident, frames in threads if ident == main_thread), threads[-1][1])
    inside = any(fragment in path for path, _, _ in frames for fragment in COLLECTIVE_FRAMES)
    top = f"{frames[0][0]}:{frames[0][1]} {frames[0][2]}" if frames else "no Python frame"
    return RankStack(inside, top)


def signal_command(job_dir: str, token: str) -> str:
    """Shell (sh) run on a node: SIGUSR2 to every rank of the job there whose pid file still names it (its
    start time matches: a reused pid is left alone), after a marker line in its dump file; ``py-spy dump``
    beside it where installed. Prints each signalled rank. The command names the job's folder without the
    trailing slash that marks the job's own processes (the supervisor's sweeps look for it)."""
    mark = shlex.quote(f"--- ddp_cluster stack dump {token} ---")
    answered = shlex.quote(ANSWERED)
    return (
        f"cd {shlex.quote(job_dir)} 2>/dev/null || {{ echo {answered}; exit 0; }}\n"
        f"for f in {STACKS_DIR}/rank.*.pid; do\n"
        '  [ -f "$f" ] || continue\n'
        f"  r=${{f#{STACKS_DIR}/rank.}}; r=${{r%.pid}}\n"
        '  set -- $(cat "$f" 2>/dev/null)\n'
        '  [ -n "$1" ] && [ -r "/proc/$1/stat" ] || continue\n'
        '  [ "$(sed \'s/.*) //\' "/proc/$1/stat" | cut -d\' \' -f20)" = "$2" ] || continue\n'
        f'  echo {mark} >> "{STACKS_DIR}/rank.$r.txt"\n'
        '  kill -USR2 "$1" 2>/dev/null && echo "signalled $r"\n'
        "  if command -v py-spy >/dev/null 2>&1; then\n"
        f'    {{ echo {mark}; timeout {PY_SPY_TIMEOUT} py-spy dump --pid "$1"; }}'
        f' > "{STACKS_DIR}/py-spy.rank.$r.txt" 2>&1 &\n'
        "  fi\n"
        "done\n"
        "wait\n"
        f"echo {answered}\n"
    )


def read_command(job_dir: str, token: str) -> str:
    """Shell run on a node after the dumps: every dump file written for this capture (from its marker on,
    its last DUMP_LIMIT bytes) and every pid file, each after a ``=== FILE name`` line."""
    quoted = shlex.quote(token)
    return (
        f"cd {shlex.quote(job_dir)} 2>/dev/null || exit 0\n"
        f"for f in {STACKS_DIR}/rank.*.txt {STACKS_DIR}/py-spy.rank.*.txt; do\n"
        f'  [ -f "$f" ] && grep -qF {quoted} "$f" || continue\n'
        f'  echo "{FILE_MARK}${{f#{STACKS_DIR}/}}"\n'
        f"  sed -n '/{token}/,$p' \"$f\" | tail -c {DUMP_LIMIT}\n"
        "  echo\n"
        "done\n"
        f"for f in {STACKS_DIR}/rank.*.pid; do\n"
        f'  [ -f "$f" ] && {{ echo "{FILE_MARK}${{f#{STACKS_DIR}/}}"; cat "$f"; }}\n'
        "done\n"
    )


def split_files(output: str) -> dict[str, str]:
    """``read_command``'s output as {file name: text}."""
    files: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output.splitlines():
        if line.startswith(FILE_MARK):
            current = files.setdefault(line[len(FILE_MARK) :].strip(), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).strip("\n") + "\n" for name, lines in files.items()}


def newest_dump(text: str, token: str) -> str:
    """The part of a dump file written for this capture: after its last marker line."""
    mark = f"--- ddp_cluster stack dump {token} ---"
    return text.rsplit(mark, 1)[-1].lstrip("\n") if mark in text else text


def capture(
    run: Callable[[str, str], str], nodes: Sequence[str], job_dir: str, wait: float = 2.0
) -> dict[str, Any]:
    """Have every rank on ``nodes`` dump its Python stacks and bring them here.

    ``run(node, shell_command) -> stdout`` ('' when the node does not answer: the supervisor's
    ``Mesh.run``); ``job_dir``: the job's folder, the same path on every node and on this one, where the
    dumps are saved as ``stacks/<node>/rank.R.txt`` (and ``py-spy.rank.R.txt``). Returns::

        {"ranks": {R: {"node": N, "in_collective": bool, "top": "file:line function"}},
         "not_in_collective": [R, ...], "no_answer": [node, ...], "stacks_dir": "JOB/stacks"}

    A rank signalled that wrote no dump within ``wait`` seconds (stuck in the kernel: a filesystem, a
    device) is "not in a collective", its top says so.
    """
    job_dir = job_dir.rstrip("/") or "/"
    token = f"{int(time.time())}-{uuid.uuid4().hex[:12]}"
    stacks = Path(job_dir) / STACKS_DIR
    with ThreadPoolExecutor(max_workers=max(1, min(CAPTURE_POOL, len(nodes)))) as pool:
        signalled = list(pool.map(lambda node: run(node, signal_command(job_dir, token)), nodes))
        time.sleep(wait)
        read = list(pool.map(lambda node: run(node, read_command(job_dir, token)), nodes))
    ranks: dict[int, dict[str, Any]] = {}
    no_answer = []
    for node, said, output in zip(nodes, signalled, read, strict=True):
        if ANSWERED not in said.splitlines():
            no_answer.append(node)
            continue
        sent = {
            int(word) for line in said.splitlines() if (word := line.removeprefix("signalled ")).isdigit()
        }
        ranks.update(node_ranks(node, sent, split_files(output), token, stacks / safe_name(node)))
    return {
        "ranks": dict(sorted(ranks.items())),
        "not_in_collective": sorted(rank for rank, seen in ranks.items() if not seen["in_collective"]),
        "no_answer": no_answer,
        "stacks_dir": str(stacks),
    }


def node_ranks(
    node: str, sent: set[int], files: dict[str, str], token: str, folder: Path
) -> dict[int, dict[str, Any]]:
    """One node's ranks from the files it sent back; their dumps saved in ``folder``."""
    main_threads: dict[int, int] = {}
    dumps: dict[int, str] = {}
    for name, text in files.items():
        if (match := RANK_FILE.match(name)) is None:
            if PY_SPY_FILE.match(name):
                save(folder / name, newest_dump(text, token))
            continue
        rank = int(match.group(1))
        if match.group(2) == "pid":
            fields = text.split()
            if len(fields) >= 3 and re.fullmatch(r"0x[0-9a-fA-F]+", fields[2]):
                main_threads[rank] = int(fields[2], 16)
        else:
            dumps[rank] = newest_dump(text, token)
            save(folder / name, dumps[rank])
    ranks: dict[int, dict[str, Any]] = {}
    for rank in sorted(sent | set(dumps)):
        stack = read_stack(dumps.get(rank, ""), main_threads.get(rank))
        if stack is None:
            stack = RankStack(False, NO_DUMP)
        ranks[rank] = {"node": node, "in_collective": stack.in_collective, "top": stack.top}
    return ranks


def safe_name(node: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", node) or "_"


def save(path: Path, text: str) -> None:
    """Keep a dump on this node; a failed write (a full disk) loses the copy, never the stop."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError:
        pass


def summary(captured: dict[str, Any]) -> str:
    """A line for the failure's reason: the ranks outside a collective and where, and where the stacks are."""
    ranks = captured.get("ranks", {})
    outside = captured.get("not_in_collective", [])
    where = f"stacks in {captured.get('stacks_dir', STACKS_DIR)}"
    if not ranks:
        return f"no rank's stacks could be dumped ({where})"
    if not outside:
        return f"every rank waits inside a collective ({where})"
    named = [f"rank {rank} on {ranks[rank]['node']} (at {ranks[rank]['top']})" for rank in outside[:4]]
    more = f" and {len(outside) - 4} more" if len(outside) > 4 else ""
    return f"not in a collective: {', '.join(named)}{more}; {where}"
