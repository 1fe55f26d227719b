"""The job's standby supervisor: the first node is not a single point of failure.

The supervisor starts one on the job's second node at every launch (:func:`start_command`). It follows the
first node over one ssh session that runs this module there in ``--report`` mode, which prints the job's
status.json whenever it changes and, every second, whether the supervisor still lives (``alive`` / ``gone``);
the standby keeps the latest status in ``JOB/standby/status.json`` and answers with ``ping`` lines (a reporter
whose standby went silent ends). Its verdicts (:meth:`Standby.step`):

- the status says the job ended: the standby ends;
- the supervisor is ``gone`` while its node answers (killed, crashed): every rank on every node is stopped
  (the controller names the dead supervisor and its last words) and the standby ends;
- the first node is unheard for ``liveness_timeout`` seconds (killed, cut off, frozen) and a last direct probe
  does not log in: the standby **takes the job over**, if it can. It becomes the supervisor in place (``exec
  python -m ddp_cluster.supervise --took-over-from NODE --job-dir JOB``), which first asks the job's voters
  for the next generation of its supervisor (:mod:`ddp_cluster.supervisor.fence`: a majority, or proof that
  the silent first node is gone; a first node that was only cut off from this one keeps the job otherwise,
  and one that thaws later finds it superseded and steps down). Won, it stops what is left of the attempt,
  restarts on the survivors (rank 0 and the master address move here) from the newest verified checkpoint
  copy, takes a spare or shrinks within min_nodes, and without max_restarts ends the job cleanly, every rank
  stopped and the copies kept.

Why a standby process and not the liveness tree: the takeover needs the job's last status (progress, the
restarts so far) at the moment of the loss, and a single, known node to act, so that two survivors never both
restart the job; the tree's watchers only know their own subtree.

    python -m ddp_cluster.supervisor.standby --job-dir JOB --primary NODE [--timeout 25]
    python -m ddp_cluster.supervisor.standby --job-dir JOB --report

Standard library only (it runs in the node image's Python, beside the job).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from ddp_cluster.files import write_atomic
from ddp_cluster.job import node_jobs
from ddp_cluster.job import status as job_status

FOLDER = "standby"
LOG = "standby.log"
EVERY = 1.0  # seconds between the reporter's lines and the standby's pings


def supervisor_alive(job_dir: Path, pid: int | None = None) -> bool:
    """Whether this job's supervisor runs here: process ``pid`` when given, else any process whose command
    line is the supervisor's of this job (the status may be unreadable: a full disk, a mount over it)."""
    wanted = str(job_dir).rstrip("/")
    candidates = [str(pid)] if pid else [entry for entry in os.listdir("/proc") if entry.isdigit()]
    for entry in candidates:
        try:
            line = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if "ddp_cluster.supervise " in line and line.rstrip().endswith(wanted):
            return True
    return False


def report(
    job_dir: Path, out: IO[str], pings: Callable[[], float], every: float = EVERY, timeout: float = 25.0
) -> None:
    """The reporter, on the first node: the status whenever it changes and ``alive``/``gone`` every
    ``every`` seconds, until the job ended (after saying so) or the standby was silent for ``timeout``."""
    path = job_dir / job_status.FILE
    shown, current = "", None  # the file's text last said, and the status it holds
    while time.time() - pings() < timeout:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, ValueError):  # not there, or not text: no status to say
            text = ""
        if text and text != shown:
            # a torn read (the next one is whole), or no status at all
            with contextlib.suppress(job_status.StatusError, ValueError):
                current = job_status.loads(text)
                out.write("status " + json.dumps(current.to_dict(), separators=(",", ":")) + "\n")
                shown = text
        if current is not None and current.done:
            out.write("done\n")
            out.flush()
            return
        out.write(("alive" if supervisor_alive(job_dir) else "gone") + "\n")
        out.flush()
        time.sleep(every)


def report_main(job_dir: Path, every: float, timeout: float) -> int:
    last = [time.time()]

    def follow() -> None:
        for _ in sys.stdin:
            last[0] = time.time()
        last[0] = 0.0  # the standby closed the session

    threading.Thread(target=follow, daemon=True).start()
    with contextlib.suppress(BrokenPipeError, OSError):
        report(job_dir, sys.stdout, lambda: last[0], every, timeout)
    return 0


def start_command(job_dir: str, primary: str, timeout: float, node_env: str) -> str:
    """The shell command (for the standby's node, over the mesh) that starts the standby unless it runs."""
    where = shlex.quote(job_dir.rstrip("/"))
    pattern = shlex.quote(f"supervisor[.]standby --job-dir {node_jobs.ere_escape(job_dir.rstrip('/'))} ")
    # "--job-dir" quoted: the text of this command (the shell that runs it) must not match the pattern,
    # only the standby's own command line does.
    standby = (
        f'python -m ddp_cluster.supervisor.standby "--job-dir" {where} --primary {shlex.quote(primary)}'
        f" --timeout {timeout:g}"
    )
    inner = f". {node_env} 2>/dev/null; exec {standby} >> {where}/{LOG} 2>&1 < /dev/null"
    return (
        f"pgrep -f {pattern} >/dev/null || (mkdir -p {where} && setsid nohup bash -c {shlex.quote(inner)}"
        " >/dev/null 2>&1 &)"
    )


Spawn = Callable[[list[str]], "subprocess.Popen[str]"]


def _spawn(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
    )


class Standby:
    """Follows the first node ``primary`` of the job in ``job_dir`` (see the module's text). ``spawn``
    starts the reporter's session and ``probe`` logs in once ('up', 'slow', 'down'); tests give stand-ins."""

    def __init__(
        self,
        job_dir: Path,
        primary: str,
        timeout: float = 25.0,
        ssh_timeout: int = 3,
        spawn: Spawn = _spawn,
        probe: Callable[[str], str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_dir = job_dir
        self.primary = primary
        self.timeout = timeout
        self.ssh_timeout = ssh_timeout
        self.spawn = spawn
        self.probe = probe or self._probe
        self.clock = clock
        self.heard = clock()
        self.status: dict[str, Any] = {}
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.session: subprocess.Popen[str] | None = None
        self.verdict = ""  # 'done', 'gone', 'lost' once decided

    # --- the session to the first node -------------------------------------------------------------------
    def argv(self) -> list[str]:
        remote = (
            f"python -m ddp_cluster.supervisor.standby --job-dir {shlex.quote(str(self.job_dir))} --report"
        )
        return [
            "ssh", "-T", "-o", "ControlPath=none", "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={self.ssh_timeout}",
            "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3", self.primary, remote,
        ]  # fmt: skip

    def _probe(self, node: str) -> str:
        from ddp_cluster.supervisor.remote import Mesh

        return Mesh("", self.ssh_timeout).probe(node)

    def connect(self) -> None:
        session = self.spawn(self.argv())
        self.session = session

        def read() -> None:
            assert session.stdout is not None
            for line in session.stdout:
                self.lines.put(line.strip())
            self.lines.put(None)

        threading.Thread(target=read, daemon=True).start()

    def ping(self) -> None:
        session = self.session
        if session is None or session.stdin is None:
            return
        try:
            session.stdin.write("ping\n")
            session.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def close(self) -> None:
        session, self.session = self.session, None
        if session is None:
            return
        try:
            if session.stdin:
                session.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            session.wait(timeout=3)
        except subprocess.TimeoutExpired:
            session.kill()

    # --- verdicts ----------------------------------------------------------------------------------------
    def take(self, line: str) -> None:
        """One line of the reporter."""
        word, _, rest = line.partition(" ")
        if word in ("alive", "done", "gone"):
            self.heard = self.clock()
        if word == "status":
            self.heard = self.clock()
            try:
                data = json.loads(rest)
            except ValueError:
                return
            if isinstance(data, dict):
                self.status = data
                folder = self.job_dir / FOLDER
                folder.mkdir(parents=True, exist_ok=True)
                write_atomic(folder / job_status.FILE, (json.dumps(data, indent=1) + "\n").encode())
        elif word == "done":
            self.verdict = "done"
        elif word == "gone":
            self.verdict = "gone"

    def step(self, wait: float = EVERY) -> str:
        """Read what came within ``wait`` seconds, reconnect a session that ended; the verdict ('' while
        the first node is followed)."""
        if self.session is None:
            self.connect()
        deadline = self.clock() + wait
        while not self.verdict:
            left = deadline - self.clock()
            try:
                line = self.lines.get(timeout=max(0.0, left)) if left > 0 else self.lines.get_nowait()
            except queue.Empty:
                break
            if line is None:  # the session ended: reconnect at the next step
                self.close()
                break
            self.take(line)
        if self.verdict:
            return self.verdict
        self.ping()
        if self.no_longer_standby():
            self.verdict = "superseded"
        elif self.clock() - self.heard > self.timeout:
            # unheard for the whole timeout: one last login decides (a reporter that cannot run on a node
            # that answers is no loss)
            if self.probe(self.primary) == "up":
                self.heard = self.clock()
            else:
                self.verdict = "lost"
        return self.verdict

    def no_longer_standby(self) -> bool:
        """A restart moved the job to nodes where this one is not the standby (or not there at all)."""
        nodes = self.status.get("nodes") or []
        standby = self.status.get("standby")
        me = os.uname().nodename
        return bool(nodes) and (me not in nodes or (bool(standby) and standby != me))

    def follow(self) -> str:
        """Follow the first node until a verdict."""
        try:
            while not (verdict := self.step()):
                pass
            return verdict
        finally:
            self.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ddp_cluster.supervisor.standby", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--job-dir", type=Path, required=True)
    parser.add_argument("--primary", default="", help="the job's first node, followed over ssh")
    parser.add_argument("--timeout", type=float, default=25.0, help="liveness_timeout, seconds")
    parser.add_argument("--report", action="store_true", help="the reporter, run on the first node")
    args = parser.parse_args(argv)
    job_dir = Path(str(args.job_dir).rstrip("/"))
    if args.report:
        return report_main(job_dir, EVERY, args.timeout)
    if not args.primary:
        parser.error("--primary is required (or --report)")
    standby = Standby(job_dir, args.primary, args.timeout)
    verdict = standby.follow()
    said = time.strftime("%H:%M:%S")
    print(f"{said} standby of {job_dir.name}: {verdict}", flush=True)
    if verdict == "gone":
        _sweep_everywhere(job_dir, standby.status)
        return 0
    if verdict != "lost":
        return 0
    argv_next = [
        sys.executable, "-m", "ddp_cluster.supervise", "--took-over-from", args.primary,
        "--job-dir", str(job_dir),
    ]  # fmt: skip
    print(f"{said} {args.primary} unheard for {args.timeout:g} s: taking the job over", flush=True)
    os.execv(sys.executable, argv_next)
    return 1  # not reached


def _sweep_everywhere(job_dir: Path, status: dict[str, Any]) -> None:
    """The supervisor died: stop the job's processes on every node of the attempt and release the job's
    claims there (no supervisor is left to), so that the nodes are free for the next job at once."""
    from concurrent.futures import ThreadPoolExecutor

    from ddp_cluster.supervisor import jobs
    from ddp_cluster.supervisor.remote import Mesh

    me = os.uname().nodename
    nodes = [str(node) for node in status.get("nodes") or [] if node]
    others = [node for node in nodes if node != me]
    mesh = Mesh(me)
    with ThreadPoolExecutor(max_workers=max(1, min(64, len(others) + 1))) as pool:
        mesh.sweep([me, *others], f"{job_dir}/", pool)
        jobs.release_all(mesh, [me, *others], job_dir.name, str(job_dir.parent), pool)


if __name__ == "__main__":
    raise SystemExit(main())
