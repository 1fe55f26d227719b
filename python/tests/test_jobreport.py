"""ddp-cluster report: a run directory's nodes' archives laid out, and the lines, warnings, failure and exit
status of a job or a health gate, as train.yml and check.yml print them."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

from test_health import gate_results, pair
from test_plan import OPTIONS, inventory, request

from ddp_cluster import cli
from ddp_cluster.job import plan
from ddp_cluster.job import report as jobreport
from ddp_cluster.job.status import Status


def archive(run_dir: Path, node: str, files: dict[str, str]) -> None:
    incoming = run_dir / ".incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    with tarfile.open(incoming / f"{node}.tar.gz", "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def planned(tmp_path: Path, **changes: Any) -> Path:
    made = plan.make_plan(request(**changes), OPTIONS, inventory(tmp_path))
    plan.write_files(made)
    return Path(made.run_dir)


def test_a_job_that_succeeded_is_laid_out_and_summed_up(tmp_path: Path) -> None:
    run_dir = planned(tmp_path)
    summary = {"final_loss": 0.409412, "accuracy": 0.95263, "samples_per_s": 18662.4, "seconds": 0.1612}
    archive(run_dir, "s0", {
        "status.json": Status(state="succeeded", elapsed=6.4, rc=0).dumps(),
        "output/summary.json": json.dumps(summary),
        "logs/1/rank.0/stdout": "[rank 0/4] done\n",
    })  # fmt: skip
    archive(run_dir, "s1", {"logs/1/rank.2/stdout": "[rank 2/4] done\n"})
    done = jobreport.report(run_dir)
    assert done.exit_status == 0 and not done.failure
    assert done.lines[:5] == [
        "job j1: succeeded in 6.4 s",
        "nodes: s0, s1; ranks: 4 (mpirun)",
        "final loss: 0.4094; accuracy: 0.9526",
        "samples/s: 18662; training seconds: 0.16",
        "started fresh",
    ]
    assert (run_dir / "logs" / "rank.2.log").read_text() == "[rank 2/4] done\n" and (
        run_dir / "output" / "summary.json"
    ).exists()
    assert done.warnings == ["no loss curve: the job wrote no metrics.jsonl (a user script writes one only"
                             " if it chooses to, into $DDP_JOB_DIR/output/)"]  # fmt: skip


def test_a_failed_job_names_node_rank_exit_and_the_likely_cause(tmp_path: Path) -> None:
    run_dir = planned(tmp_path)
    failed = Status(state="failed", reason="a rank exited with an error", failed_node="s1", failed_rank=1,
                    exit_code=3, log_file="s1:/workspace/jobs/j1/logs/1/rank.1/stdout",
                    log_tail=("failing on purpose",))  # fmt: skip
    archive(run_dir, "s0", {"status.json": failed.dumps()})
    done = jobreport.report(run_dir)
    assert done.exit_status == 1
    assert done.failure.startswith("job j1 failed: a rank exited with an error (node s1)")
    assert done.lines[:6] == [
        "job j1 failed: a rank exited with an error",
        "node: s1, rank: 1,",
        "exit code 3",
        "ranks left running after the stop: none",
        "last lines of s1:/workspace/jobs/j1/logs/1/rank.1/stdout:",
        "failing on purpose",
    ]
    assert any(line.startswith("ddp-cluster doctor: ") for line in done.lines)
    assert done.warnings == ["s1: no archive came back (its results are missing)"]


def test_a_gate_prints_its_results_and_a_preflight_gate_keeps_them_with_its_job(tmp_path: Path) -> None:
    run_dir = planned(tmp_path, kind="preflight")
    archive(
        run_dir,
        "s0",
        {"status.json": Status(state="succeeded").dumps(), "output/health.json": json.dumps(gate_results())},
    )
    done = jobreport.report(run_dir)
    assert done.gate_passed and done.exit_status == 0 and done.lines[0].startswith("health gate PASSED")
    kept = run_dir.parent / "output" / "health.json"
    assert kept.read_bytes() == (run_dir / "output" / "health.json").read_bytes()
    assert f"results: {run_dir}/output/health.json" in done.lines
    slow = gate_results(
        pairs=[pair("node0", "node1", 1.0), pair("node1", "node2", 0.01), pair("node2", "node0", 0.01)]
    )
    check_dir = planned(tmp_path, kind="check", id="c1")
    archive(
        check_dir,
        "s0",
        {"status.json": Status(state="succeeded").dumps(), "output/health.json": json.dumps(slow)},
    )
    failed = jobreport.report(check_dir)
    assert failed.failure.startswith("health gate c1 failed: node node2 is slow") and not failed.gate_passed


def test_the_command_prints_the_report_and_exits_with_its_status(tmp_path: Path, capsys: Any) -> None:
    run_dir = planned(tmp_path)
    archive(run_dir, "s0", {"status.json": Status(state="failed", reason="the job was stopped").dumps()})
    assert cli.main(["report", str(run_dir)]) == 1
    out = capsys.readouterr()
    assert "job j1 failed: the job was stopped" in out.out and "(node unknown)" in out.err
    assert cli.main(["report", str(run_dir)]) == 1  # again, on what is laid out already
    assert cli.main(["report", str(tmp_path / "none")]) == 2


def test_what_a_job_left_never_fails_the_report_of_a_job_that_succeeded(tmp_path: Path) -> None:
    """An absolute link, a link out and a cut archive in a job's results: warnings, and the report of the job
    that succeeded."""
    run_dir = planned(tmp_path)
    incoming = run_dir / ".incoming"
    incoming.mkdir(parents=True)
    with tarfile.open(incoming / "s0.tar.gz", "w:gz") as tar:
        for name, text in {
            "status.json": Status(state="succeeded", elapsed=1.0, rc=0).dumps(),
            "output/summary.json": json.dumps({"final_loss": 0.5}),
            "output/metrics.jsonl": "",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text.encode()))
        for name, target in [("output/dangling", "/abs/gone"), ("output/plan.json", "../plan.json")]:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    archive(run_dir, "s1", {"logs/1/rank.2/stdout": "x" * 100_000})
    cut = incoming / "s1.tar.gz"
    cut.write_bytes(cut.read_bytes()[:40])
    done = jobreport.report(run_dir)
    assert done.exit_status == 0 and done.lines[0] == "job j1: succeeded in 1.0 s", done
    assert done.warnings[0] == (
        "results: skipped 2 unsafe member(s) from s0: output/dangling (link to /abs/gone),"
        " output/plan.json (link to ../plan.json, outside the output)"
    )
    assert "results: s1's archive is truncated or corrupt" in done.warnings[1]
    assert json.loads((run_dir / "plan.json").read_text())["id"] == "j1"


# --- what a job wrote: read defensively, shown never obeyed -------------------------------------------------
def test_a_status_json_that_is_no_utf8_is_named_with_its_node_never_a_traceback(tmp_path: Path) -> None:
    run_dir = planned(tmp_path)
    incoming = run_dir / ".incoming"
    incoming.mkdir(parents=True)
    with tarfile.open(incoming / "s0.tar.gz", "w:gz") as tar:
        data = b'{"state": "succeeded", "reason": "\xff\xfe"}'
        info = tarfile.TarInfo("status.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    archive(run_dir, "s1", {"logs/1/rank.2/stdout": "[rank 2/4] done\n"})
    done = jobreport.report(run_dir)
    said = [warning for warning in done.warnings if "status.json" in warning]
    assert len(said) == 1 and said[0].startswith(f"s0: {run_dir}/nodes/s0/status.json is not a status")
    assert "it is not UTF-8: byte 0xff at offset 34" in said[0]
    assert done.failure.startswith(
        "job j1 failed: its status.json cannot be read (the warning above says why)"
    )
    assert (run_dir / "logs" / "rank.2.log").is_file()  # the other node's results laid out all the same


def test_a_status_and_logs_full_of_escape_sequences_are_reported_written_out(tmp_path: Path) -> None:
    run_dir = planned(tmp_path)
    failed = Status(
        state="failed",
        reason="a rank exited\x1b]0;owned\x07",
        failed_node="s0",
        failed_rank=0,
        exit_code=1,
        log_tail=(
            "\x1b[2J\x1b[Hcleared",
            "progress 50%\r[s0 rank 0] forged",
            "clip \x1b]52;c;eA==\x07 \u202eevil",
        ),
    )
    archive(run_dir, "s0", {
        "status.json": failed.dumps(),
        "logs/1/rank.0/stdout": "\x1b[31mAddress already in use\x1b[0m\n",
    })  # fmt: skip
    done = jobreport.report(run_dir)
    shown = [*done.lines, *done.warnings, done.failure]
    assert all(char == "\t" or char.isprintable() for line in shown for char in line)
    assert "job j1 failed: a rank exited\\x1b]0;owned\\x07" in done.lines
    assert "\\x1b[2J\\x1b[Hcleared" in done.lines and "progress 50%\\r[s0 rank 0] forged" in done.lines
    assert "clip \\x1b]52;c;eA==\\x07 \\u202eevil" in done.lines
    doctor = "\n".join(done.lines[done.lines.index("") :])  # the doctor's table: its evidence cells wrap
    assert "logs/rank.0.log:1: \\x1b[31mAddress" in doctor


def test_a_summary_that_is_no_utf8_or_too_large_is_a_warning(tmp_path: Path) -> None:
    for name, summary in {"a": b'{"final_loss": "\xff"}', "b": b" " * (jobreport.SUMMARY_MAX + 1)}.items():
        run_dir = planned(tmp_path / name)
        incoming = run_dir / ".incoming"
        incoming.mkdir(parents=True)
        with tarfile.open(incoming / "s0.tar.gz", "w:gz") as tar:
            for member, data in {
                "status.json": Status(state="succeeded", elapsed=1.0, rc=0).dumps().encode(),
                "output/summary.json": summary,
            }.items():
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        done = jobreport.report(run_dir)
        assert done.exit_status == 0
        assert any(warning.startswith("summary.json is not valid JSON (") for warning in done.warnings)
        assert "final loss: n/a; accuracy: n/a" in done.lines
