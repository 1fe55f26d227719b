"""The fence of a job's supervisor (ddp_cluster.supervisor.fence): each node grants a generation once, an
election is won on a majority (a tie only by the side that held the job, or on proof the other is gone), and
a guarded command runs only where no newer supervisor holds the job."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ddp_cluster.supervisor import fence
from ddp_cluster.supervisor.fence import Election, Held


def test_a_node_grants_each_generation_once_and_only_a_newer_one_after(tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "j1"
    assert fence.read(job) == Held(0, "")  # none granted: the start's
    assert fence.ask(job, 1, "node1") == {"granted": True, "generation": 1, "node": "node1"}
    assert fence.ask(job, 1, "node0") == {"granted": False, "generation": 1, "node": "node1"}
    assert fence.ask(job, 1, "node1")["granted"] is True  # the same asker again
    assert fence.ask(job, 0, "node0")["granted"] is False  # older
    assert fence.ask(job, 2, "node0")["granted"] is True
    assert fence.read(job) == Held(2, "node0")


def test_two_askers_of_one_generation_at_once_never_both_get_it(tmp_path: Path) -> None:
    job = tmp_path / "j1"
    for generation in range(1, 30):
        answers: dict[str, bool] = {}

        def ask(node: str, generation: int = generation, answers: dict[str, bool] = answers) -> None:
            answers[node] = fence.ask(job, generation, node)["granted"]

        threads = [threading.Thread(target=ask, args=(node,)) for node in ("node0", "node1")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(answers.values()) == [False, True], (generation, answers)


def test_holds_is_true_until_a_newer_generation_of_another_node_was_granted(tmp_path: Path) -> None:
    job = tmp_path / "j1"
    assert fence.holds(job, 0, "node0")  # nothing granted: the start's supervisor holds it
    fence.ask(job, 1, "node0")
    assert fence.holds(job, 1, "node0") and fence.holds(job, 2, "node1")
    assert not fence.holds(job, 1, "node1")  # the same generation, another's
    fence.ask(job, 2, "node1")
    assert not fence.holds(job, 1, "node0") and not fence.holds(job, 0, "node0")


def test_the_command_line_grants_and_guards(tmp_path: Path) -> None:
    job = tmp_path / "j1"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", fence.MODULE, "--job-dir", str(job), *args]
        return subprocess.run(argv, capture_output=True, text=True, check=False)

    granted = run("--ask", "1", "--node", "node1")
    assert granted.returncode == 0 and json.loads(granted.stdout) == {
        "granted": True,
        "generation": 1,
        "node": "node1",
    }
    refused = run("--ask", "1", "--node", "node0")
    assert json.loads(refused.stdout)["granted"] is False
    assert run("--holds", "1", "--node", "node1").returncode == 0
    stale = run("--holds", "0", "--node", "node0")
    assert stale.returncode == 3
    assert "older than generation 1 of node1 on this node: refused" in stale.stderr
    # the guard, as a node runs it: what follows runs only while the sender is not superseded
    guarded = fence.guard(str(job), 0, "node0").replace("python ", f"{sys.executable} ", 1)
    done = subprocess.run(["/bin/sh", "-c", f"{guarded}echo swept"], capture_output=True, text=True)
    assert done.stdout == "" and done.returncode == 3
    guarded = fence.guard(str(job), 1, "node1").replace("python ", f"{sys.executable} ", 1)
    done = subprocess.run(["/bin/sh", "-c", f"{guarded}echo swept"], capture_output=True, text=True)
    assert done.stdout == "swept\n"


@pytest.mark.parametrize(
    ("nodes", "spares", "expected"),
    [
        (["n0", "n1", "n2"], ["n3"], ["n0", "n1", "n2"]),
        (["n0", "n1"], ["n2", "n3"], ["n0", "n1", "n2"]),  # even: the first spare breaks the tie
        (["n0", "n1"], [], ["n0", "n1"]),
        (["n0"], ["n1"], ["n0"]),
    ],
)
def test_the_voters_are_the_jobs_nodes_and_a_spare_when_they_are_even(
    nodes: list[str], spares: list[str], expected: list[str]
) -> None:
    assert fence.voters(nodes, spares) == expected


def election(granted: list[str], voters: list[str], **changes: object) -> Election:
    found = Election(1, voters, granted=granted)
    for name, value in changes.items():
        setattr(found, name, value)
    found.silent = [node for node in voters if node not in granted and node not in found.refused]
    return found


def never(node: str) -> bool:
    return False


def test_a_majority_wins_and_a_minority_loses() -> None:
    voters = ["n0", "n1", "n2"]
    assert fence.judge(election(["n1", "n2"], voters), holder=False, gone=never).won
    assert not fence.judge(election(["n0"], voters), holder=True, gone=never).won
    # a refusal at the same generation (the other asker got that node first) does not undo a majority
    refused = {"n0": Held(1, "n0")}
    assert fence.judge(election(["n1", "n2"], voters, refused=refused), holder=False, gone=never).won
    # a newer generation granted anywhere: a newer election was held
    newer = {"n0": Held(2, "n0")}
    assert not fence.judge(election(["n1", "n2"], voters, refused=newer), holder=False, gone=never).won


def test_a_tie_is_the_holders_and_the_others_only_on_proof_the_silent_half_is_gone() -> None:
    voters = ["n0", "n1"]
    assert fence.judge(election(["n0"], voters), holder=True, gone=never).won  # the first node keeps its job
    assert not fence.judge(election(["n1"], voters), holder=False, gone=never).won  # silence is no proof
    assert fence.judge(election(["n1"], voters), holder=False, gone=lambda node: node == "n0").won
    refused = {"n0": Held(1, "n0")}  # the other side asked too: a tie with a refusal is nobody's
    assert not fence.judge(election(["n1"], voters, refused=refused), holder=True, gone=never).won
    assert not fence.judge(election([], voters), holder=True, gone=lambda node: True).won


def test_an_election_asks_every_voter_once_and_reads_their_answers() -> None:
    asked: list[tuple[list[str], str]] = []
    answers = {
        "n0": '{"granted":true,"generation":3,"node":"n1"}\n',
        "n1": "some login banner\n" + '{"granted":true,"generation":3,"node":"n1"}\n',
        "n2": '{"granted":false,"generation":3,"node":"n0"}\n',
        "n3": "",
        "n4": '{"error":"lock busy"}\n',
    }

    def run_on(nodes: list[str], command: str) -> dict[str, str]:
        asked.append((list(nodes), command))
        return {node: answers[node] for node in nodes}

    found = fence.elect(run_on, "/workspace/jobs/j1", "n1", 3, list(answers), holder=False, gone=never)
    assert len(asked) == 1 and "--ask 3 --node n1" in asked[0][1]
    assert found.granted == ["n0", "n1"] and found.refused == {"n2": Held(3, "n0")}
    assert found.silent == ["n3", "n4"] and not found.won  # 2 of 5
    assert found.winner() == "n0"
    assert found.describe() == (
        "generation 3: 2 of 5 voters granted it; refused by n2 (holds generation 3 of n0);"
        " no answer from n3, n4"
    )


def test_a_voter_taken_for_lost_is_silent_without_being_asked() -> None:
    """A frozen node would hold the asker until its command's bound: the lost are counted silent, unasked."""
    asked: list[list[str]] = []

    def run_on(nodes: list[str], command: str) -> dict[str, str]:
        asked.append(list(nodes))
        return {node: '{"granted":true,"generation":2,"node":"n1"}' for node in nodes}

    found = fence.elect(run_on, "/j", "n1", 2, ["n0", "n1", "n2"], holder=False, gone=never, unheard=["n0"])
    assert asked == [["n1", "n2"]]
    assert found.granted == ["n1", "n2"] and found.silent == ["n0"] and found.won
    alone = fence.elect(run_on, "/j", "n1", 3, ["n0", "n1"], holder=False, gone=lambda node: node == "n0",
                        unheard=["n0"])  # fmt: skip
    assert asked[-1] == ["n1"] and alone.won  # half, and the unheard one proven gone
