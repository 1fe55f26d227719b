"""What a job leaves in its node never reaches the host or the controller's own files (local inventory):
a link planted in place of a job's directory is refused with nothing written through it on the host, and a
job whose output holds absolute, directory and dangling links succeeds, its report naming what was left
out."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

from conftest import REPO, STATE_DIR, PlaybookResult, node_exec, run_playbook

RUNS = REPO / "runs"
HOST_TMP = Path("/var/tmp")
# What a job's start and collect write into its directory: none may appear in the host's /var/tmp.
JOB_FILES = {"job.json", "job.tar.gz", "output", "results.tar.gz", "status.json", "supervisor.log"}

LINKS = """
import json
import os
from pathlib import Path

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    output = Path(os.environ["DDP_JOB_DIR"]) / "output"
    (output / "data").mkdir(parents=True, exist_ok=True)
    (output / "data" / "part-0.bin").write_bytes(b"0" * 16)
    os.symlink("data", output / "latest")  # a link to a directory inside the output: kept
    os.symlink("gone.bin", output / "gone")  # dangling, inside: kept
    os.symlink("/etc", output / "etc")  # absolute: left out
    os.symlink("/nonexistent/dataset", output / "dangling")  # absolute and dangling: left out
    (output / "summary.json").write_text(json.dumps({"final_loss": 0.5, "accuracy": 0.9}))
dist.barrier()
dist.destroy_process_group()
"""


def job_id(name: str) -> str:
    return f"test-paths-{name}-{uuid.uuid4().hex[:6]}"


def train(job: str, **extravars: object) -> PlaybookResult:
    return run_playbook("train.yml", extravars={"job_id": job, "nodes": 1, **extravars})


@pytest.mark.parametrize("target", ["existing", "dangling"])
def test_a_link_planted_in_place_of_a_job_directory_is_refused_and_nothing_reaches_the_host(
    local_cluster: PlaybookResult, tmp_path: Path, target: str
) -> None:
    """/workspace/jobs/ID -> /var/tmp planted in node0 before a job with that id: the host's /var/tmp (the
    link's target seen from the server's root) gets nothing. A link to a directory that does not exist yet
    passes the node's check and is refused by the start itself."""
    job = job_id(target)
    planted = HOST_TMP if target == "existing" else HOST_TMP / f"ddp-planted-{job}"
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('this job must not start')\n")
    before = set(os.listdir(HOST_TMP))
    node_exec("node0", f"mkdir -p /workspace/jobs && ln -s {planted} /workspace/jobs/{job}")
    started = time.monotonic()
    try:
        result = train(job, script=str(script))
    finally:
        node_exec("node0", f"rm -f /workspace/jobs/{job}", check=False)
    took = time.monotonic() - started
    print(f"planted link ({target}): refused in {took:.1f} s")
    flat = " ".join(result.stdout.split())
    assert result.rc != 0, result.stdout[-4000:]
    assert f"/workspace/jobs/{job}" in flat, result.stdout[-4000:]
    if target == "dangling":
        assert f"/workspace/jobs/{job} in node node0 is a symbolic link (to {planted})" in flat, flat[-3000:]
    assert not planted.exists() or planted == HOST_TMP
    new = set(os.listdir(HOST_TMP)) - before
    assert not new & JOB_FILES, f"written in the host's {HOST_TMP}: {sorted(new)}"
    assert not (STATE_DIR / "node0" / "workspace" / "jobs" / job).exists()


def test_a_job_whose_output_holds_links_succeeds_and_its_report_names_what_was_left_out(
    local_cluster: PlaybookResult, tmp_path: Path
) -> None:
    job = job_id("links")
    script = tmp_path / "links.py"
    script.write_text(LINKS)
    started = time.monotonic()
    result = train(job, script=str(script))
    took = time.monotonic() - started
    print(f"a job whose output holds links: {took:.1f} s")
    flat = " ".join(result.stdout.split())
    assert result.rc == 0, result.stdout[-4000:]
    assert f"job {job}: succeeded in" in result.stdout
    assert (
        f"[WARNING] job {job}: results: skipped 2 unsafe member(s) from node0: output/dangling (link to"
        " /nonexistent/dataset), output/etc (link to /etc)" in flat
    ), result.stdout[-4000:]
    run = RUNS / job
    assert json.loads((run / "output" / "summary.json").read_text())["final_loss"] == 0.5
    assert "final loss: 0.5;" in result.stdout
    assert (run / "output" / "latest").is_symlink() and (run / "output" / "latest" / "part-0.bin").is_file()
    assert (run / "output" / "gone").is_symlink()
    assert not (run / "output" / "etc").is_symlink() and not (run / "output" / "dangling").is_symlink()
    assert json.loads((run / "plan.json").read_text())["run_dir"] == str(run)
    assert json.loads((run / "status.json").read_text())["state"] == "succeeded"
    # the archive was fetched and removed from the server
    assert not (STATE_DIR / "node0" / "workspace" / "jobs" / job / "results.tar.gz").exists()


SPARSE = """
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    output = Path(os.environ["DDP_JOB_DIR"]) / "output"
    (output / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save({"step": 7}, output / "checkpoints" / "epoch-00001.ckpt")  # a user's own: no header of ours
    with open(output / "scratch.bin", "wb") as handle:
        handle.write(b"a little data")
        handle.truncate(20 << 30)  # 20 GiB of holes: costs this node nothing
    (output / "summary.json").write_text(json.dumps({"final_loss": 0.25, "accuracy": 0.5}))
dist.barrier()
dist.destroy_process_group()
"""


def test_a_job_leaving_a_large_sparse_file_has_its_other_results_and_the_file_named(
    local_cluster: PlaybookResult, tmp_path: Path
) -> None:
    """A 20 GiB sparse file stays on the node, named in the collect's warning; the job's summary and its
    user-written torch.save checkpoint come back, and the controller holds no 20 GiB."""
    job = job_id("sparse")
    script = tmp_path / "sparse.py"
    script.write_text(SPARSE)
    started = time.monotonic()
    result = train(job, script=str(script))
    print(f"a job leaving a 20 GiB sparse file: {time.monotonic() - started:.1f} s")
    flat = " ".join(result.stdout.split())
    assert result.rc == 0, result.stdout[-4000:]
    assert f"left out of its results: output/scratch.bin (sparse: {20 << 30} bytes," in flat, flat[-4000:]
    run = RUNS / job
    assert json.loads((run / "output" / "summary.json").read_text())["final_loss"] == 0.25
    checkpoint = run / "output" / "checkpoints" / "epoch-00001.ckpt"
    assert checkpoint.read_bytes()[:2] == b"PK"  # torch.save's zip, collected as it was written
    assert not (run / "output" / "scratch.bin").exists()
    on_node = STATE_DIR / "node0" / "workspace" / "jobs" / job / "output" / "scratch.bin"
    assert on_node.stat().st_size == 20 << 30  # left where it is
    on_node.unlink()
