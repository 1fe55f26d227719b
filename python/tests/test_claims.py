"""The claim of a node by one job (ddp_cluster.supervisor.jobs: claim, release, claim_all, release_all) and
the controller's side of it (ddp_cluster.job.node_jobs: claim_command, parse_claim): one claimant of many
wins, a claim is re-taken by its own job, a stale one is taken over only after its grace and with no process
of its job left, another job's claim is never released, a job's nodes are claimed all or nothing in sorted
order. The other nodes are reached through a stand-in mesh that runs the node's own command here, on a folder
per node. No container."""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ddp_cluster.job import node_jobs
from ddp_cluster.job import status as job_status
from ddp_cluster.job.status import Status
from ddp_cluster.supervisor import drain, jobs, remote


def claim_of(root: Path) -> dict[str, object] | None:
    path = root / jobs.CLAIM
    return json.loads(path.read_text()) if path.exists() else None


def holder(root: Path) -> str | None:
    """The job whose claim the node holds; None: no claim."""
    found = claim_of(root)
    return None if found is None else str(found["job"])


def age(root: Path, seconds: float) -> None:
    """Make the node's claim ``seconds`` old."""
    then = time.time() - seconds
    os.utime(root / jobs.CLAIM, (then, then))


# contextlib.redirect_stdout swaps sys.stdout for every thread: one node command at a time runs here.
PRINTING = threading.Lock()


def no_processes(monkeypatch: pytest.MonkeyPatch, found: dict[int, str] | None = None) -> None:
    monkeypatch.setattr(jobs, "processes", lambda jobs_dir: dict(found or {}))


# --- one node ---


def test_a_claim_is_taken_once_and_renewed_by_its_own_job(tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    assert jobs.claim(str(root), "J1", ["n0", "n1"]) is None
    first = claim_of(root)
    assert first is not None and first["job"] == "J1" and first["nodes"] == ["n0", "n1"]
    age(root, 100)
    assert jobs.claim(str(root), "J1") is None  # the supervisor adopts its start's claim
    again = claim_of(root)
    assert (
        again is not None
        and again["nodes"] == ["n0", "n1"]
        and float(str(again["at"])) >= float(str(first["at"]))
    )
    assert time.time() - (root / jobs.CLAIM).stat().st_mtime < 50  # its grace starts again
    refused = jobs.claim(str(root), "J2", ["n0"])
    assert refused is not None and refused.job == "J1" and refused.nodes == ("n0", "n1")
    assert sorted(path.name for path in root.iterdir()) == [jobs.CLAIM, jobs.CLAIM_LOCK]  # no temporary left


def test_a_claim_is_stale_only_after_its_grace_with_no_process_of_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "jobs"
    assert jobs.claim(str(root), "J1", ["n0"]) is None
    no_processes(monkeypatch, {40: f"python -m ddp_cluster.train --output-dir {root}/J1/output"})
    age(root, jobs.CLAIM_GRACE + 60)
    held = jobs.claim(str(root), "J2")
    assert held is not None and held.job == "J1"  # old, but its rank runs: the job still has the node
    no_processes(monkeypatch, {41: f"python -m ddp_cluster.train --output-dir {root}/J10/output"})
    age(root, jobs.CLAIM_GRACE - 10)
    held = jobs.claim(str(root), "J2")
    assert held is not None and held.job == "J1"  # nothing of it runs yet: its start window
    age(root, jobs.CLAIM_GRACE + 1)
    assert jobs.claim(str(root), "J2", ["n0"]) is None  # a crashed start's claim, taken over
    taken = claim_of(root)
    assert taken is not None and taken["job"] == "J2"


def test_the_claim_of_a_job_whose_status_says_it_ended_is_stale_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "jobs"
    no_processes(monkeypatch)
    assert jobs.claim(str(root), "J1") is None
    (root / "J1").mkdir()
    (root / "J1" / job_status.FILE).write_text(Status(state="running", updated=1.0).dumps())
    assert jobs.claim(str(root), "J2") is not None
    (root / "J1" / job_status.FILE).write_text(Status(state="succeeded", rc=0, updated=2.0).dumps())
    assert jobs.claim(str(root), "J2") is None


def test_the_claim_of_a_job_whose_supervisor_here_is_gone_is_stale_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This node was the job's first node, was lost and came back: the job ended or went on elsewhere."""
    root = tmp_path / "jobs"
    no_processes(monkeypatch)
    assert jobs.claim(str(root), "J1") is None
    (root / "J1").mkdir()
    alive = Status(state="running", pid=os.getpid(), supervisor_node=socket.gethostname())
    (root / "J1" / job_status.FILE).write_text(alive.dumps())  # this process is no supervisor of J1
    assert jobs.claim(str(root), "J2") is None
    elsewhere = Status(state="running", pid=os.getpid(), supervisor_node="another-node")
    jobs.release(str(root), "J2")
    assert jobs.claim(str(root), "J1") is None
    (root / "J1" / job_status.FILE).write_text(elsewhere.dumps())
    assert jobs.claim(str(root), "J2") is not None, "a status written elsewhere says nothing of here"


def test_a_claim_older_than_the_nodes_own_start_is_stale_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node (its container) was lost and started again: nothing of the claiming job runs here."""
    root = tmp_path / "jobs"
    no_processes(monkeypatch)
    assert jobs.claim(str(root), "J1") is None
    assert jobs.claim(str(root), "J2") is not None, "within its grace"
    monkeypatch.setattr(jobs, "node_started", lambda: time.time() + 1)
    assert jobs.claim(str(root), "J2") is None


def test_the_nodes_start_is_read_from_its_first_process() -> None:
    started = jobs.node_started()
    assert 0 < started <= time.time()


def test_an_unreadable_claim_is_nobodys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "jobs"
    root.mkdir()
    (root / jobs.CLAIM).write_text("{half a")
    no_processes(monkeypatch)
    assert jobs.claim(str(root), "J2") is None
    assert holder(root) == "J2"


def test_only_the_jobs_own_claim_is_released(tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    assert jobs.release(str(root), "J1") is True  # none there: nothing held
    assert jobs.claim(str(root), "J1") is None
    assert jobs.release(str(root), "J2") is False
    assert holder(root) == "J1"
    assert jobs.release(str(root), "J1") is True and claim_of(root) is None


def _claim_in_a_process(root: str, job: str, start: float, answers: multiprocessing.Queue[bool]) -> None:
    while time.time() < start:  # every claimant at once
        pass
    answers.put(jobs.claim(root, job) is None)


def test_of_many_processes_claiming_a_node_at_once_exactly_one_wins(tmp_path: Path) -> None:
    forks = multiprocessing.get_context("fork")
    for round_ in range(5):
        root = str(tmp_path / f"jobs{round_}")
        answers: multiprocessing.Queue[bool] = forks.Queue()
        start = time.time() + 0.5
        claimants = [
            forks.Process(target=_claim_in_a_process, args=(root, f"J{index}", start, answers))
            for index in range(8)
        ]
        for claimant in claimants:
            claimant.start()
        for claimant in claimants:
            claimant.join(timeout=30)
        won = [answers.get(timeout=5) for _ in claimants]
        assert won.count(True) == 1, won
        assert jobs.read_claim(root) is not None


def test_of_many_threads_claiming_a_node_at_once_exactly_one_wins(tmp_path: Path) -> None:
    for round_ in range(10):
        root = str(tmp_path / f"jobs{round_}")
        barrier = threading.Barrier(8)

        def claimant(job: str, root: str = root, barrier: threading.Barrier = barrier) -> bool:
            barrier.wait()
            return jobs.claim(root, job) is None

        with ThreadPoolExecutor(max_workers=8) as pool:
            won = list(pool.map(claimant, [f"J{index}" for index in range(8)]))
        assert won.count(True) == 1, won


def test_the_node_command_claims_and_refuses_in_one_json_line(tmp_path: Path) -> None:
    """The single-node form as another node runs it, in processes of their own, several at once."""
    root = str(tmp_path / "jobs")
    base = [sys.executable, "-m", node_jobs.MODULE, "--jobs-dir", root]
    claimants = [
        subprocess.Popen(
            [*base, "--claim", f"J{index}", "--here", "--nodes", "n0,n1"], stdout=subprocess.PIPE
        )
        for index in range(4)
    ]
    outputs = [claimant.communicate(timeout=60)[0] for claimant in claimants]
    answers = [
        (claimant.returncode, json.loads(out)) for claimant, out in zip(claimants, outputs, strict=True)
    ]
    winners = [answer for rc, answer in answers if rc == 0]
    assert len(winners) == 1 and winners[0]["claimed"] is True
    winner = next(f"J{index}" for index, (rc, _) in enumerate(answers) if rc == 0)
    for rc, answer in answers:
        if rc != 0:
            assert answer["claimed"] is False and answer["job"] == winner and answer["nodes"] == ["n0", "n1"]
    released = subprocess.run([*base, "--release", winner, "--here"], capture_output=True, text=True)
    assert released.returncode == 0 and json.loads(released.stdout)["released"] is True
    assert jobs.read_claim(root) is None


# --- what the node reports ---


def test_a_live_claim_makes_the_node_busy_with_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "jobs"
    no_processes(monkeypatch)
    assert jobs.claim(str(root), "J5", ["n0", "n1"]) is None
    report = jobs.node_report(str(root))
    assert report["busy"] == ["J5"] and report["claim"]["job"] == "J5"
    assert node_jobs.busy(report, own="J1") == {"J5": ["n0", "n1"]}  # its nodes, before its job.json is there
    assert node_jobs.busy(report, own="J5") == {}
    age(root, jobs.CLAIM_GRACE + 1)
    stale = jobs.node_report(str(root))
    assert stale["busy"] == [] and stale["claim"] is None


def test_a_stop_here_releases_the_claim_once_nothing_of_the_job_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "jobs"
    no_processes(monkeypatch)
    assert jobs.claim(str(root), "J1") is None
    assert jobs.stop_here(str(root), "J2", "R")["released"] is False and claim_of(root) is not None
    assert jobs.stop_here(str(root), "J1", "R")["released"] is True and claim_of(root) is None


# --- a job's nodes, all or nothing ---


class Mesh(remote.Mesh):
    """Stand-in for the mesh: node N's jobs' directory is ``folders[N]``; a command on another node runs the
    node's own command line here, on that node's folder. ``down``: nodes that do not answer."""

    def __init__(self, me: str, folders: dict[str, Path], down: tuple[str, ...] = ()) -> None:
        super().__init__(me)
        self.folders = folders
        self.down = down
        self.asked: list[tuple[str, str]] = []

    def run(self, node: str, command: str) -> str:
        argv = shlex.split(command.split(" && ", 1)[1])
        assert argv[:3] == ["python", "-m", node_jobs.MODULE] and "--here" in argv, command
        action = "claim" if "--claim" in argv else "release"
        self.asked.append((node, action))
        if node in self.down:
            return ""
        argv[argv.index("--jobs-dir") + 1] = str(self.folders[node])
        with PRINTING, contextlib.redirect_stdout(io.StringIO()) as out:
            jobs.main(argv[3:])
        return out.getvalue()


def folders_of(tmp_path: Path, *nodes: str) -> dict[str, Path]:
    return {node: tmp_path / node / "jobs" for node in nodes}


def claim_all(mesh: Mesh, nodes: list[str], job: str) -> dict[str, object]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        return jobs.claim_all(mesh, nodes, job, str(mesh.folders[mesh.me]), pool)


def test_a_jobs_nodes_are_claimed_in_sorted_order_and_the_first_refusal_releases_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_processes(monkeypatch)
    folders = folders_of(tmp_path, "n0", "n1", "n2", "n3")
    assert jobs.claim(str(folders["n2"]), "J9", ["n2", "n5"]) is None
    mesh = Mesh("n0", folders)
    answer = claim_all(mesh, ["n3", "n1", "n0", "n2"], "J1")
    assert answer["claimed"] is False and (answer["node"], answer["job"], answer["nodes"]) == (
        "n2",
        "J9",
        ["n2", "n5"],
    )
    assert answer["released"] == ["n0", "n1"] and answer["not_released"] == []
    claims = [(node, action) for node, action in mesh.asked if action == "claim"]
    assert claims == [("n1", "claim"), ("n2", "claim")]  # n0 is this node; n3 was never asked
    assert [claim_of(folders[node]) for node in ("n0", "n1", "n3")] == [None, None, None]
    assert holder(folders["n2"]) == "J9"

    assert jobs.release(str(folders["n2"]), "J9")
    again = claim_all(Mesh("n0", folders), ["n3", "n1", "n0", "n2"], "J1")
    assert again == {"claimed": True, "nodes": ["n0", "n1", "n2", "n3"]}
    for node in folders:
        held = claim_of(folders[node])
        assert held is not None and held["job"] == "J1" and held["nodes"] == ["n3", "n1", "n0", "n2"]
    assert claim_all(Mesh("n0", folders), ["n0", "n1"], "J1")["claimed"] is True  # its own: again

    mesh = Mesh("n0", folders)
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert jobs.release_all(mesh, list(folders), "J1", str(folders["n0"]), pool) == []
    assert all(claim_of(folder) is None for folder in folders.values())


def test_a_node_that_does_not_answer_is_a_refusal_and_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_processes(monkeypatch)
    folders = folders_of(tmp_path, "n0", "n1", "n2")
    answer = claim_all(Mesh("n0", folders, down=("n2",)), ["n0", "n1", "n2"], "J1")
    assert answer["claimed"] is False and answer["node"] == "n2" and answer["job"] == ""
    assert all(claim_of(folder) is None for folder in folders.values())
    ok, said = node_jobs.parse_claim(json.dumps(answer))
    assert not ok and said.startswith("n2 did not answer the claim of its node over the cluster's ssh")
    assert jobs.claim(str(folders["n1"]), "J1") is None
    with ThreadPoolExecutor(max_workers=2) as pool:
        left = jobs.release_all(
            Mesh("n0", folders, down=("n1",)), ["n0", "n1"], "J1", str(folders["n0"]), pool
        )
    assert left == ["n1"]


def test_of_two_starts_whose_nodes_overlap_exactly_one_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each round, two jobs claim overlapping node sets at once; in sorted order, the one that takes the
    lowest node they share goes on, and the other takes none of the rest."""
    no_processes(monkeypatch)
    for round_ in range(15):
        folders = folders_of(tmp_path / str(round_), "n0", "n1", "n2", "n3")
        barrier = threading.Barrier(2)

        def start(
            job: str,
            nodes: list[str],
            folders: dict[str, Path] = folders,
            barrier: threading.Barrier = barrier,
        ) -> bool:
            mesh = Mesh(nodes[0], folders)
            barrier.wait()
            return bool(claim_all(mesh, nodes, job)["claimed"])

        starts: list[Callable[[], bool]] = [
            lambda: start("A", ["n0", "n1", "n2"]),
            lambda: start("B", ["n1", "n2", "n3"]),
        ]
        with ThreadPoolExecutor(max_workers=2) as pool:
            won = [future.result(timeout=60) for future in [pool.submit(one) for one in starts]]
        assert won.count(True) == 1, won
        winner = "A" if won[0] else "B"
        for node in ("n1", "n2"):
            assert holder(folders[node]) == winner
        assert claim_of(folders["n3" if winner == "A" else "n0"]) is None


# --- the controller's side ---


def test_the_controllers_command_and_its_answer() -> None:
    command = node_jobs.claim_command("/workspace/jobs", "J1", ["node0", "node1"])
    assert command == (
        f". {node_jobs.NODE_ENV} && python -m {node_jobs.MODULE} --jobs-dir /workspace/jobs --claim J1"
        " --nodes node0,node1"
    )
    assert "--release J1 --nodes node0,node1" in node_jobs.release_command(
        "/workspace/jobs", "J1", ["node0", "node1"]
    )
    assert node_jobs.parse_claim('noise\n{"claimed": true, "nodes": ["node0"]}\n') == (True, "")
    refused = json.dumps({"claimed": False, "node": "node1", "job": "J9", "nodes": ["node0", "node1"]})
    ok, said = node_jobs.parse_claim(refused)
    assert not ok and said.startswith(
        "node1 runs another job: job J9 (nodes node0, node1). One job per node at a time: wait for it"
        " (-e wait=true waits, within job_timeout), stop it (ansible-playbook jobs.yml -e stop=J9)"
    )
    ok, said = node_jobs.parse_claim("bash: python: command not found\n")
    assert not ok and said == "the claim of the job's nodes gave no answer (bash: python: command not found)"


def test_the_first_node_command_claims_through_its_mesh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--claim ID --nodes ...`` without --here goes through claim_all (here: every node is this one)."""
    no_processes(monkeypatch)
    root = tmp_path / "jobs"
    me = socket.gethostname()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = jobs.main(["--jobs-dir", str(root), "--claim", "J1", "--nodes", me])
    assert rc == 0 and json.loads(out.getvalue()) == {"claimed": True, "nodes": [me]}
    with contextlib.redirect_stdout(io.StringIO()) as said:
        assert jobs.main(["--jobs-dir", str(root), "--claim", "J2", "--nodes", me]) == 1
    answer = json.loads(said.getvalue())
    assert (answer["claimed"], answer["node"], answer["job"]) == (False, me, "J1")
    with pytest.raises(SystemExit):
        jobs.main(["--jobs-dir", str(root), "--claim", "../J1"])


def test_a_jobs_own_nodes_are_renewed_at_once_and_a_lost_one_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_processes(monkeypatch)
    folders = folders_of(tmp_path, "n0", "n1", "n2")
    assert claim_all(Mesh("n0", folders), ["n0", "n1", "n2"], "J1")["claimed"] is True
    for folder in folders.values():
        age(folder, jobs.CLAIM_GRACE + 1)
    assert jobs.claim(str(folders["n2"]), "J7") is None  # stale: another job took it
    with ThreadPoolExecutor(max_workers=3) as pool:
        lost = jobs.renew_all(Mesh("n0", folders), ["n0", "n1", "n2"], "J1", str(folders["n0"]), pool)
    assert list(lost) == ["n2"] and lost["n2"]["job"] == "J7"
    assert [holder(folders[node]) for node in ("n0", "n1", "n2")] == ["J1", "J1", "J7"]
    assert time.time() - (folders["n1"] / jobs.CLAIM).stat().st_mtime < 60


# --- every wait bounded (issue 45, point 9) ---


@contextlib.contextmanager
def lock_held_by_another_process(root: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process (as a job's code could) holding the node's claim lock until it is ended."""
    root.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; h = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
            " fcntl.flock(h, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)",
            str(root / jobs.CLAIM_LOCK),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_a_claim_lock_held_by_another_process_is_a_bounded_refusal_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "jobs"
    monkeypatch.setattr(drain, "LOCK_WAIT", 1.0)
    with lock_held_by_another_process(root) as holder:
        began = time.monotonic()
        with pytest.raises(drain.NodeLockBusy) as refused:
            jobs.claim(str(root), "J1", ["n0"])
        assert time.monotonic() - began < 5
        said = str(refused.value)
        assert said.startswith(f"{socket.gethostname()}: the node's claim lock {root / jobs.CLAIM_LOCK}")
        assert (
            f"did not come free within 1 s (held by pid {holder.pid}: {sys.executable} -c import fcntl"
            in said
        )
        assert f"docker exec {socket.gethostname()} kill PID" in said
        answer = jobs.claim_one(remote.Mesh(socket.gethostname()), socket.gethostname(), "J1", str(root))
        assert answer["claimed"] is False and answer["locked"] is True
        ok, why = node_jobs.parse_claim(json.dumps(answer))
        assert not ok and why == answer["error"]
        assert jobs.stop_here(str(root), "J1", "R")["released"] is False  # nothing held: no lock asked
    assert jobs.claim(str(root), "J1") is None, "the lock let go: the claim goes on"


def test_the_node_command_answers_a_held_lock_within_its_bound(tmp_path: Path) -> None:
    """The answer comes back below the mesh's command bound, so the first node names the node and the lock
    instead of an ssh that gave no answer."""
    root = tmp_path / "jobs"
    with lock_held_by_another_process(root):
        began = time.monotonic()
        # the node's command in a process of its own, its bound shortened for the test's sake
        script = (
            "import sys; from ddp_cluster.supervisor import drain, jobs; drain.LOCK_WAIT = 2.0;"
            " sys.exit(jobs.main(sys.argv[1:]))"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, "--jobs-dir", str(root), "--claim", "J1", "--here"],
            capture_output=True,
            text=True,
            timeout=remote.COMMAND_TIMEOUT,
        )
        took = time.monotonic() - began
    assert drain.LOCK_WAIT < remote.COMMAND_TIMEOUT - 5  # the real bound, under the mesh's
    assert done.returncode == 1 and took < 10
    answer = json.loads(done.stdout)
    assert answer["locked"] is True and "held by pid" in answer["error"]


# --- one id started twice at once ---


def test_of_two_starts_of_one_id_at_once_exactly_one_goes_on_and_the_other_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_processes(monkeypatch)
    for round_ in range(10):
        folders = folders_of(tmp_path / str(round_), "n0", "n1", "n2")
        barrier = threading.Barrier(2)

        def start(
            mark: str, folders: dict[str, Path] = folders, barrier: threading.Barrier = barrier
        ) -> dict[str, object]:
            mesh = Mesh("n0", folders)
            barrier.wait()
            with ThreadPoolExecutor(max_workers=3) as pool:
                return jobs.claim_all(mesh, ["n0", "n1", "n2"], "same", str(folders["n0"]), pool, mark)

        with ThreadPoolExecutor(max_workers=2) as pool:
            answers = list(pool.map(start, ["start-a", "start-b"]))
        won = [bool(answer["claimed"]) for answer in answers]
        assert won.count(True) == 1, answers
        winner = "start-a" if won[0] else "start-b"
        loser = answers[won.index(False)]
        assert loser["twin"] is True and loser["job"] == "same"
        ok, said = node_jobs.parse_claim(json.dumps(loser))
        assert not ok and said.startswith("job same is being started by another train.yml already: ")
        assert "-e attach=same" in said and "another job_id" in said
        for folder in folders.values():  # the loser gave back nothing of the winner's
            found = jobs.read_claim(str(folder))
            assert found is not None and (found.job, found.start) == ("same", winner)


def test_a_start_whose_id_holds_a_node_under_another_start_is_refused_and_never_releases_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "jobs"
    no_processes(monkeypatch)
    assert jobs.claim(str(root), "J1", ["n0"], start="first") is None
    refused = jobs.claim(str(root), "J1", ["n0"], start="second")
    assert isinstance(refused, jobs.Claim) and refused.start == "first"
    assert jobs.release(str(root), "J1", start="second") is False and holder(root) == "J1"
    assert jobs.claim(str(root), "J1") is None, "the supervisor's renewal (no mark) is the job's own"
    assert jobs.read_claim(str(root)).start == "first"  # type: ignore[union-attr]
    age(root, jobs.CLAIM_GRACE + 1)
    assert jobs.claim(str(root), "J1", start="second") is None, "a stale claim of the id is taken over"


# --- a job's end, where the next claim looks ---


@contextlib.contextmanager
def stray(root: Path, job: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process left of ``job`` here (its command line names the job's directory) that ignores TERM."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True);"
            " time.sleep(120)",
            f"{root}/{job}/output",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


def test_a_leftover_process_of_an_ended_job_frees_the_node_once_its_end_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node1 was not reached when J1 ended (frozen, cut off): its claim and a rank of J1 are left. The end
    recorded there (the supervisor's release_all) makes the next claim take the node and end the stray."""
    folders = folders_of(tmp_path, "n0", "n1")
    monkeypatch.setattr(jobs, "STRAY_GRACE", 0.5)
    root = folders["n1"]
    assert jobs.claim(str(root), "J1", ["n0", "n1"]) is None
    with stray(root, "J1") as left:
        age(root, jobs.CLAIM_GRACE + 1)
        refused = jobs.claim(str(root), "J2", ["n1"])
        assert refused is not None and refused.job == "J1", "a process of J1 runs: without its end, busy"
        assert jobs.node_report(str(root))["busy"] == ["J1"]

        with ThreadPoolExecutor(max_workers=2) as pool:  # J1's supervisor ends (loop.release_claims)
            mesh = Mesh("n0", folders, down=("n1",))
            assert jobs.release_all(mesh, ["n0", "n1"], "J1", str(folders["n0"]), pool) == ["n1"]
            assert jobs.ended_record(str(root), "J1") is None, "n1 was not reached"
            assert jobs.claim(str(root), "J2", ["n1"]) is not None
            # reached later (the supervisor's end, or the first node that knows: here, the same records)
            assert jobs.release_all(Mesh("n0", folders), ["n1"], "J1", str(folders["n0"]), pool) == []
        assert jobs.ended_record(str(root), "J1") is not None
        assert jobs.ended_record(str(folders["n0"]), "J1") is not None
        report = jobs.node_report(str(root))
        assert report["busy"] == [] and report["strays"] == {"J1": [left.pid]} and report["claim"] is None
        assert any("stray" in line for line in node_jobs.table({"n1": report}))
        assert node_jobs.busy(report, own="J2") == {}
        assert left.poll() is None, "the report ends nothing"
        assert jobs.claim(str(root), "J2", ["n1"]) is None
        assert left.wait(timeout=10) is not None, "the stray (TERM ignored) was killed by the claim"
    assert holder(root) == "J2"


def test_a_new_start_of_an_id_clears_its_earlier_end_on_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "jobs"
    no_processes(monkeypatch)
    jobs.record_end(str(root), "J1")
    assert jobs.claim(str(root), "J1", start="again") is None
    assert jobs.ended_record(str(root), "J1") is None
    assert jobs.claim(str(root), "J9") is not None, "the new run of J1 holds the node"


def test_a_start_that_gives_back_its_nodes_records_no_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_processes(monkeypatch)
    folders = folders_of(tmp_path, "n0", "n1")
    assert jobs.claim(str(folders["n1"]), "J9") is None
    answer = claim_all(Mesh("n0", folders), ["n0", "n1"], "J1")
    assert answer["claimed"] is False and answer["released"] == ["n0"]
    assert jobs.ended_record(str(folders["n0"]), "J1") is None


# --- a status.json that is not UTF-8 (point 7, the node's side) ---


def test_a_status_that_is_not_utf8_is_named_and_the_node_still_lists_claims_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "jobs"
    no_processes(monkeypatch)
    assert jobs.claim(str(root), "J1", ["n0"]) is None
    (root / "J1").mkdir()
    (root / "J1" / job_status.FILE).write_bytes(b'{"state": "running", "reason": "\xff\xfe"}')
    report = jobs.node_report(str(root))
    problem = report["jobs"]["J1"]["status_problem"]
    assert report["busy"] == ["J1"] and "not UTF-8" in problem and "status.json" in problem
    assert any("J1: " in line and "not UTF-8" in line for line in node_jobs.table({"n0": report}))
    assert jobs.claim(str(root), "J2") is not None, "still J1's: within its grace"
    done = jobs.stop_here(str(root), "J1", "stopped by hand")
    assert done["closed"] is True and done["released"] is True
    closed = job_status.read(root / "J1" / job_status.FILE)
    assert closed is not None and closed.state == "failed"
    assert "could not be read and was replaced" in closed.reason
    assert jobs.claim(str(root), "J2") is None
