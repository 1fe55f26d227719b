"""After the job: no step may fail a job that succeeded (they warn), resume that would train nothing is an
error, and the summary's figures are printed rounded."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

from conftest import REPO, STATE_DIR, PlaybookResult, run_playbook

RUNS = REPO / "runs"
QUICK = "--dataset digits --epochs 2 --batch-size 32 --lr 0.05"

NO_METRICS = """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""

EMPTY_METRICS = """
import os
from pathlib import Path
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    output = Path(os.environ["DDP_JOB_DIR"]) / "output"
    output.mkdir(parents=True, exist_ok=True)
    (output / "metrics.jsonl").write_text("")
dist.barrier()
dist.destroy_process_group()
"""


def job_id(name: str) -> str:
    return f"test-post-{name}-{uuid.uuid4().hex[:6]}"


def train(job: str, **extravars: object) -> PlaybookResult:
    return run_playbook("train.yml", extravars={"job_id": job, "nodes": 2, **extravars})


def test_succeeded_job_without_metrics_succeeds_with_a_warning(
    local_cluster: PlaybookResult, tmp_path: Path
) -> None:
    for name, text, warning in [
        ("no-metrics", NO_METRICS, "no loss curve: the job wrote no metrics.jsonl"),
        ("empty-metrics", EMPTY_METRICS, "no loss curve: ddp-cluster plot: error:"),
    ]:
        script = tmp_path / f"{name.replace('-', '_')}.py"
        script.write_text(text)
        job = job_id(name)
        result = train(job, script=str(script))
        assert result.rc == 0, result.stdout[-4000:]
        flat = " ".join(result.stdout.split())  # the output callback folds long messages
        assert f"[WARNING] job {job}: {warning}" in flat, result.stdout[-4000:]
        assert f"job {job}: succeeded in" in result.stdout
        assert not (RUNS / job / "output" / "loss.png").exists()


def test_summary_figures_are_rounded(local_cluster: PlaybookResult) -> None:
    job = job_id("rounded")
    result = train(job, script_args=QUICK)
    assert result.rc == 0, result.stdout[-4000:]
    summary = json.loads((RUNS / job / "output" / "summary.json").read_text())
    loss = re.search(r"final loss: ([0-9.e+-]+); accuracy: ([0-9.]+)", result.stdout)
    assert loss is not None, result.stdout[-3000:]
    assert loss.group(1) == f"{summary['final_loss']:.4g}" and loss.group(2) == f"{summary['accuracy']:.4f}"
    speed = re.search(r"samples/s: ([0-9]+); training seconds: ([0-9]+\.[0-9]{2})$", result.stdout, re.M)
    assert speed is not None, result.stdout[-3000:]
    # summary.json keeps the full values.
    assert len(repr(summary["final_loss"])) > len(loss.group(1))


def test_resume_with_epochs_not_above_the_checkpoint_fails_naming_both(local_cluster: PlaybookResult) -> None:
    first = job_id("resume-src")
    assert train(first, script_args=QUICK).rc == 0
    job = job_id("resume-none")
    result = train(job, resume=True, resume_from=first, script_args=QUICK)
    assert result.rc != 0
    flat = " ".join(result.stdout.split())
    assert "--epochs 2 is not above the checkpoint's epoch 2 (checkpoints/epoch-00002.ckpt)" in flat, (
        result.stdout[-4000:]
    )
    assert "ask for --epochs 3 or more" in flat


ESCAPES = r"""
import sys
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    sys.stdout.write("title \x1b]0;owned\x07 clip \x1b]52;c;cm0gLXJmIH4=\x07")
    sys.stdout.write(" clear \x1b[2J\x1b[H bidi \u202eevil\n")
    sys.stdout.write("progress 50%\r[node1 rank 1] forged\n")
    sys.stdout.flush()
dist.barrier()
dist.destroy_process_group()
sys.exit(3 if rank == 0 else 0)
"""


def test_a_job_printing_escape_sequences_and_a_status_that_is_no_utf8_are_shown_never_obeyed(
    local_cluster: PlaybookResult, tmp_path: Path
) -> None:
    """The report's tail and jobs.yml -e logs write the rank's control characters out, its prefix first on
    every line; then node0's status.json of that job, overwritten with bytes that are no UTF-8, is named by
    jobs.yml, which lists both nodes all the same."""
    script = tmp_path / "escapes.py"
    script.write_text(ESCAPES)
    job = job_id("escapes")
    result = train(job, script=str(script))
    assert result.rc != 0, result.stdout[-4000:]
    flat = " ".join(result.stdout.split())
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout and "\u202e" not in result.stdout
    assert (
        "title \\x1b]0;owned\\x07 clip \\x1b]52;c;cm0gLXJmIH4=\\x07 clear \\x1b[2J\\x1b[H bidi \\u202eevil"
        in flat
    )
    assert "progress 50%\\r[node1 rank 1] forged" in flat, result.stdout[-4000:]
    shown = run_playbook("jobs.yml", extravars={"logs": job, "rank": 0})
    assert shown.rc == 0, shown.stdout[-4000:]
    assert "\x1b" not in shown.stdout and "\r" not in shown.stdout.replace("\r\n", "\n")
    assert "[node0 rank 0] progress 50%\\r[node1 rank 1] forged" in shown.stdout, shown.stdout[-4000:]
    status = STATE_DIR / "node0" / "workspace" / "jobs" / job / "status.json"
    kept = status.read_bytes()
    try:
        status.write_bytes(b'{"state": "failed", "reason": "\xff\xfe"}')
        listed = run_playbook("jobs.yml")
        assert listed.rc == 0, listed.stdout[-4000:]
        flat = " ".join(listed.stdout.split())
        assert "unknown (its status.json is no status: below)" in flat, listed.stdout[-4000:]
        assert "it is not UTF-8: byte 0xff at offset 31" in flat
        assert re.search(r"node0: (free|busy)", flat) and re.search(r"node1: (free|busy)", flat), flat[-2000:]
    finally:
        status.write_bytes(kept)
