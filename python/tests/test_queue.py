"""Slurm's side of a job (ddp_cluster.job.queue): hostlists expanded as Slurm writes them, a node selection
checked against the cluster before anything is submitted, sbatch's command line, and the queue read back with
its reasons and each pending job's place."""

from __future__ import annotations

import pytest

from ddp_cluster.job import queue
from ddp_cluster.job.queue import QueueError, Selection

CLUSTER = [f"node{index}" for index in range(4)]


def test_hostlists_expand_as_slurm_writes_them() -> None:
    assert queue.expand("node[0-2,5]") == ["node0", "node1", "node2", "node5"]
    assert queue.expand("n[08-10],gpu01") == ["n08", "n09", "n10", "gpu01"]
    assert queue.expand("sim-server0") == ["sim-server0"]
    assert queue.expand("a[1-2]-x,b") == ["a1-x", "a2-x", "b"]
    for bad in ("node[0-", "node[a-b]", "node]", ""):
        with pytest.raises(QueueError):
            queue.expand(bad)


def test_a_request_names_nodes_as_a_list_a_comma_line_or_a_hostlist() -> None:
    assert queue.names("node0,node2") == ["node0", "node2"]
    assert queue.names(["node1", "node[2-3]"]) == ["node1", "node2", "node3"]
    assert queue.names("node[0-1],node1") == ["node0", "node1"]
    assert queue.names(None) == [] and queue.names("") == []


def test_a_selection_slurm_could_never_meet_is_refused_naming_each_fix() -> None:
    assert queue.select(2, "node1", "node0", CLUSTER) == Selection(("node1",), ("node0",))
    with pytest.raises(QueueError) as raised:
        queue.select(2, "node1,node9,node2,node3", "node1,nodeX", CLUSTER)
    said = str(raised.value)
    assert (
        "nodelist names node9, which the inventory does not have (its nodes: node0, node1, node2, node3)"
        in said
    )
    assert "exclude names nodeX" in said
    assert "node1 is in both nodelist and exclude" in said
    assert "nodelist names 4 nodes for a job of nodes=2: ask for nodes=4" in said
    with pytest.raises(QueueError, match="nodes=4 but the cluster has 3 nodes once 1 are excluded"):
        queue.select(4, None, "node0", CLUSTER)


def test_sbatch_asks_for_whole_nodes_the_time_limit_the_warning_and_the_selection() -> None:
    argv = queue.sbatch_argv(
        "run-7", 2, timeout_s=3601, comment="alice@ctl", selection=Selection(("node1",), ("node0",)),
        partition="ddp", qos="high", script="/workspace/jobs/run-7/batch.sh",
    )  # fmt: skip
    assert argv == [
        "sbatch", "--parsable", "--job-name=run-7", "--nodes=2", "--exclusive", "--no-kill", "--no-requeue",
        "--time=0-01:01:00",
        "--comment=alice@ctl", "--signal=B:USR1@60", "--output=/tmp/ddp-cluster-slurm-%j.out",
        "--nodelist=node1",
        "--exclude=node0",
        "--partition=ddp", "--qos=high", "/workspace/jobs/run-7/batch.sh",
    ]  # fmt: skip
    assert queue.time_limit(0) == "UNLIMITED" and queue.time_limit(90000) == "1-01:00:00"
    with pytest.raises(QueueError, match="partition='a b' is not a Slurm name"):
        queue.sbatch_argv("j", 1, timeout_s=0, comment="", partition="a b", script="s")


SQUEUE = """\
41|train-a|RUNNING|None|2|node[0-1]|4294901759|2026-12-06T03:00:00|root|node0|alice@ctl
42|train-b|PENDING|Resources|2||4294901758|2026-12-06T03:00:05|root|(null)|bob@ctl
43|train-c|PENDING|Priority|2||4294901700|2026-12-06T03:00:01|root||(null)
44|train-d|PENDING|ReqNodeNotAvail, UnavailableNodes:node3|1||4294901758|2026-12-06T03:00:09|root|n/a|x
"""


def test_the_queue_reads_back_with_reasons_in_words_and_each_pending_jobs_place() -> None:
    entries = queue.parse_squeue(SQUEUE)
    running, waiting, behind, odd = entries
    assert (
        running.nodelist == ("node0", "node1") and running.waiting() == "" and running.comment == "alice@ctl"
    )
    assert waiting.waiting() == "waiting for nodes that other jobs hold (Resources)"
    assert behind.waiting() == "waiting behind jobs of higher priority (Priority)" and behind.comment == ""
    assert odd.waiting() == (
        "a node it asks for (nodelist) is down, drained or reserved (ReqNodeNotAvail, UnavailableNodes:node3)"
    )
    # Higher priority first, then the earlier submission: b and d share a priority, b came first.
    assert queue.place(entries, "train-b") == (1, 3)
    assert queue.place(entries, "train-d") == (2, 3)
    assert queue.place(entries, "train-c") == (3, 3)
    assert queue.place(entries, "train-a") is None
    assert queue.by_name(entries)["train-b"].slurm_id == "42"
    # other users' jobs none of ours can be (array and heterogeneous ids, a name holding the separator) and
    # a purged id are passed over; Slurm not answering is an error
    foreign = [
        "41 train-a RUNNING",
        "43_[1-4]|arr|PENDING|Priority|1||9|2026-12-06T03:00:00|bob|n/a|(null)",
        "44+0|het|RUNNING|None|1|node1|9|2026-12-06T03:00:00|bob|node1|(null)",
        "45|a|b|RUNNING|None|1|node1|9|2026-12-06T03:00:00|bob|node1|(null)",
        "slurm_load_jobs error: Invalid job id specified",
    ]
    assert queue.parse_squeue("\n".join(foreign)) == []
    with pytest.raises(QueueError, match="Unable to contact slurm controller"):
        queue.parse_squeue("slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
