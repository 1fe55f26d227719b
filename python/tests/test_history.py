"""The cluster's job history from Slurm's accounting (ddp_cluster.job.history): sacct's command for a time,
its lines read back (other shapes passed over) and the table jobs.yml -e history=true prints."""

from __future__ import annotations

import pytest

from ddp_cluster.job import history

SACCT = (
    "12|train-a|root|alice@ctl|2|node[0-1]|COMPLETED|2026-12-06T08:00:05|00:01:10\n"
    "13|train-b|root|bob@ctl|1|node2|CANCELLED by 0|2026-12-06T09:00:00|00:00:04\n"
    "14|wrap|carol||2|None assigned|PENDING|Unknown|00:00:00\n"
    "15_[1-4]|arr|dave||1|None assigned|PENDING|Unknown|00:00:00\n"
    "16|a|b|root||1|node1|FAILED|2026-12-06T10:00:00|00:00:01\n"
)


def test_the_command_asks_every_users_jobs_since_a_time_sacct_takes() -> None:
    assert history.command() == (
        "sacct -X -n -P -a -S now-7days -E now"
        " -o JobID,JobName,User,Comment,NNodes,NodeList,State,Start,Elapsed"
    )
    assert " -S 2026-12-01T08:00 " in history.command("2026-12-01T08:00")
    assert " -S now-2hours " in history.command("now-2hours")
    for bad in ("yesterday", "now-2", "2026-12-01; rm -rf /", "12/01/2026"):
        with pytest.raises(history.HistoryError, match="is not a time sacct takes: give a date"):
            history.command(bad)


def test_the_history_is_read_newest_first_with_who_submitted_each_job() -> None:
    jobs = history.parse(SACCT)
    assert [job.slurm_id for job in jobs] == ["12", "13", "14"]  # the array and the odd name passed over
    assert jobs[0].who == "alice@ctl" and jobs[2].who == "carol"  # our comment, else Slurm's user
    table = history.lines(jobs, "now-7days")
    assert table[0] == "Slurm's history since now-7days (3 job(s), newest first):"
    assert table[1].split() == ["SLURM", "ID", "JOB", "SUBMITTED", "BY", "NODES", "STATE", "START", "ELAPSED"]
    assert table[2].split() == ["14", "wrap", "carol", "2", "PENDING", "Unknown", "00:00:00"]
    assert table[3].split()[:6] == ["13", "train-b", "bob@ctl", "1", "node2", "CANCELLED"]
    assert table[4].split() == [
        "12",
        "train-a",
        "alice@ctl",
        "2",
        "node[0-1]",
        "COMPLETED",
        "2026-12-06T08:00:05",
        "00:01:10",
    ]
    assert history.lines([], "2026-12-01") == ["Slurm's history since 2026-12-01: no job"]
