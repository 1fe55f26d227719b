"""A stop's SIGTERM to a job's ranks (supervisor.remote Mesh.term_ranks, RANKS_OF): the launcher's children
whose environment holds the job's DDP_JOB_ID, on this machine's own /proc, with a stand-in launcher (a shell
named orted); another job's rank, the launcher itself and a process of the job that is not the launcher's
child are left alone; then the grace: a rank whose own handler takes 1 s has it."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ddp_cluster.supervisor import remote

# A rank whose SIGTERM handler takes argv[2] seconds, then writes argv[1]; argv[1].ready once it is installed.
RANK = (
    "import signal, sys, time\n"
    "def on(*_):\n"
    "    time.sleep(float(sys.argv[2])); open(sys.argv[1], 'w').write('saved'); sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, on)\n"
    "open(sys.argv[1] + '.ready', 'w').close()\n"
    "while True: time.sleep(0.1)\n"
)


def launcher(tmp_path: Path, job: str, saved: Path, pause: float) -> subprocess.Popen[bytes]:
    """A shell named orted (as Open MPI's daemon) whose child is a rank of ``job``."""
    orted = tmp_path / "orted"
    if not orted.exists():
        shutil.copy("/bin/sh", orted)
    program = shlex.join([sys.executable, "-c", RANK, str(saved), str(pause)])
    rank = f"DDP_JOB_ID={job} {program}"
    return subprocess.Popen([str(orted), "-c", f"{rank} & wait"])


def children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(line) for line in found.split()]


def test_the_ranks_of_the_job_are_found_and_given_their_grace(tmp_path: Path) -> None:
    mine = launcher(tmp_path, "j1", tmp_path / "j1.saved", 1)
    # a job whose id extends this one's; its ranks' handler outlasts any grace the test gives
    other = launcher(tmp_path, "j10", tmp_path / "j10.saved", 120)
    # the job's own process that the launcher did not start (the supervisor's side): not a rank
    beside = subprocess.Popen(["sleep", "30"], env={"DDP_JOB_ID": "j1", "PATH": "/usr/bin:/bin"})
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"{job}.saved.ready").exists() for job in ("j1", "j10")):
            assert time.monotonic() < deadline, "the stand-in ranks did not install their handlers"
            time.sleep(0.1)
        ranks = remote.RANKS_OF.format(job=shlex.quote("DDP_JOB_ID=j1"), launcher=remote.LAUNCHER_COMMS)
        listed = subprocess.run(
            ["sh", "-c", ranks], capture_output=True, text=True, check=True
        ).stdout.split()
        assert [int(pid) for pid in listed] == children(mine.pid)
        mesh = remote.Mesh("node0")
        mesh.me = "node0"
        with ThreadPoolExecutor(2) as pool:
            began = time.monotonic()
            left = mesh.term_ranks(["node0"], "j1", pool, grace=60)
            took = time.monotonic() - began
        assert left == [] and 1 <= took < 60, (left, took)  # its end ends the wait, not the grace
        assert (tmp_path / "j1.saved").read_text() == "saved"  # its handler ran to its end
        assert not (tmp_path / "j10.saved").exists() and children(other.pid), "another job's rank was stopped"
        assert beside.poll() is None
        # the grace is a bound: a rank that does not end is named after it
        with ThreadPoolExecutor(2) as pool:
            began = time.monotonic()
            assert mesh.term_ranks(["node0"], "j10", pool, grace=0.3) == ["node0"]
            assert time.monotonic() - began < 60  # the rank takes 120 s: the grace, not its end, ended it
    finally:
        for process in (mine, other, beside):
            for pid in children(process.pid):
                subprocess.run(["kill", "-KILL", str(pid)], check=False)
            process.kill()
            process.wait()
