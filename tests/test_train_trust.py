"""A multi-day job survives the faults that used to end it (local inventory, 3 nodes: node2 is the spare of a
2-node job): the first node killed (its standby takes the job over on node1 and the spare, or without
max_restarts ends it cleanly keeping the checkpoint copies for a resume), a node frozen (declared lost within
liveness_timeout, the job finished on the spare) and the supervisor killed (the controller names it within
seconds and no rank is left).

Named to run after test_train_lifecycle.py, whose fixture and helpers it shares."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_train_lifecycle import (  # noqa: F401 (three: the fixture every test here uses)
    LONG,
    finish,
    job_id,
    playbook,
    processes,
    start,
    status_of,
    step_of,
    three,
    wait_for,
)

from conftest import REPO, STATE_DIR, docker, node_exec

RUNS = REPO / "runs"
pytestmark = pytest.mark.usefixtures("three")


def status_on(node: str, job: str) -> dict[str, object]:
    try:
        return dict(json.loads((STATE_DIR / node / "workspace" / "jobs" / job / "status.json").read_text()))
    except (OSError, ValueError):
        return {}


def past(proc: subprocess.Popen[str], job: str, step: int) -> bool:
    """The job's progress passed ``step``; train.yml ending before that fails the test with its output."""
    if proc.poll() is not None:
        output, _ = proc.communicate()
        raise AssertionError(f"train.yml ended (rc {proc.returncode}) before step {step}:\n{output[-4000:]}")
    return step_of(job) > step


def replicated(job: str) -> bool:
    """node1 holds a copy of a checkpoint of rank 0 (node0)."""
    folder = STATE_DIR / "node1" / "workspace" / "jobs" / job / "output" / "checkpoints"
    return folder.is_dir() and any(path.name.endswith(".ckpt") for path in folder.iterdir())


def test_the_first_node_killed_its_standby_takes_the_job_over_on_the_spare() -> None:
    reference = job_id("trust-undisturbed")
    undisturbed = playbook("train.yml", job_id=reference, nodes=2, script_args=LONG)
    assert undisturbed.rc == 0, undisturbed.stdout[-4000:]
    expected = json.loads((RUNS / reference / "output" / "summary.json").read_text())["accuracy"]

    job = job_id("takeover")
    proc = start(job, LONG, "-e", "max_restarts=1")
    try:
        wait_for("step 1000", lambda: past(proc, job, 1000))
        wait_for("a checkpoint copy on node1", lambda: replicated(job), 60)
        docker("kill", "node0")
        killed = time.time()
        output = finish(proc, 360)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-6000:]
    assert f"job {job}: the first node node0 is gone; following the job to its standby node1" in output
    assert f"job {job}: followed to node1, which took the job over" in output
    status = json.loads((RUNS / job / "status.json").read_text())
    assert status["supervisor_node"] == "node1" and status["state"] == "succeeded"
    [restart] = status["restarts"]
    assert restart["lost"] == ["node0"] and restart["spares_taken"] == ["node2"], restart
    assert restart["nodes_after"] == ["node1", "node2"] and restart["supervisor_moved"] == "node0 -> node1"
    again = float(restart["lost_at"]) + float(restart["training_again_s"]) - killed
    assert again < 60 + 30, f"training again {again:.0f} s after node0 was killed"
    print(f"training again {again:.1f} s after the kill; {restart['steps_redone']} step(s) redone")
    # The copies are made beside the training (rank 0 never waits for them): the newest copy may be one
    # checkpoint behind rank 0's, by the time a copy takes (one to two seconds here, up to 400 steps of this
    # small job, which checkpoints three times a second; a real job's checkpoints are minutes apart).
    assert 0 <= restart["steps_redone"] <= 50 + 400, restart
    summary = json.loads((RUNS / job / "output" / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert abs(summary["accuracy"] - expected) <= 0.02, (summary["accuracy"], expected)
    assert processes("node1", job) == "" and processes("node2", job) == ""


def test_the_first_node_killed_without_restarts_ends_cleanly_and_resumes_from_the_copy() -> None:
    job = job_id("firstlost")
    proc = start(job, LONG)
    try:
        wait_for("step 1000", lambda: past(proc, job, 1000))
        wait_for("a checkpoint copy on node1", lambda: replicated(job), 60)
        docker("kill", "node0")
        killed = time.monotonic()
        wait_for("every rank on node1 stopped", lambda: processes("node1", job) == "", 60)
        stopped = time.monotonic() - killed
        output = finish(proc, 300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode not in (0, None)
    said = "node node0, the job's first node (its supervisor and rank 0), stopped answering"
    assert said in output, output[-4000:]
    assert f"train.yml -e resume=true -e resume_from={job}" in output
    print(f"node1's ranks stopped {stopped:.0f} s after node0 was killed")
    assert stopped < 60
    assert any((RUNS / job / "output" / "checkpoints").glob("*.ckpt")), (
        "the checkpoint copies did not come back"
    )

    back = playbook("site.yml")
    assert back.rc == 0, back.stdout[-4000:]
    resumed = job_id("fromcopy")
    result = playbook("train.yml", job_id=resumed, nodes=2, resume=True, resume_from=job, script_args=LONG)
    assert result.rc == 0, result.stdout[-4000:]
    assert json.loads((RUNS / resumed / "output" / "summary.json").read_text())["world_size"] == 2


# A user's own script: plain torch.save checkpoints straight under their final names (no header of ours, not
# even a rename), resumed through DDP_RESUME_FROM; about 20 s of epochs on two nodes.
PLAIN_TORCH_SAVE = """
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
folder = os.path.join(os.environ["DDP_JOB_DIR"], "output", "checkpoints")
resumed = os.environ.get("DDP_RESUME_FROM", "")
start = torch.load(resumed)["epoch"] if resumed else 0
print(f"attempt {os.environ['DDP_RESTART_COUNT']}: from {resumed or 'scratch'} at epoch {start}", flush=True)
for epoch in range(start, 40):
    total = torch.ones(1)
    dist.all_reduce(total)
    time.sleep(0.5)
    if rank == 0:
        os.makedirs(folder, exist_ok=True)
        torch.save({"epoch": epoch + 1, "total": total}, os.path.join(folder, f"epoch-{epoch + 1:05d}.ckpt"))
dist.destroy_process_group()
"""


def test_a_users_plain_torch_save_checkpoints_resume_the_job_on_the_spare(tmp_path: Path) -> None:
    script = tmp_path / "plain_save.py"
    script.write_text(PLAIN_TORCH_SAVE)
    job = job_id("plainsave")
    proc = start(job, "", "-e", f"script={script}", "-e", "max_restarts=1")
    folder = STATE_DIR / "node0" / "workspace" / "jobs" / job / "output" / "checkpoints"
    try:
        wait_for("epoch 6's checkpoint on node0", lambda: (folder / "epoch-00006.ckpt").is_file(), 120)
        docker("kill", "node1")
        output = finish(proc, 240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-5000:]
    [restart] = json.loads((RUNS / job / "status.json").read_text())["restarts"]
    assert restart["lost"] == ["node1"] and restart["spares_taken"] == ["node2"], restart
    resumed = int(str(restart["checkpoint"]).removeprefix("epoch-").removesuffix(".ckpt"))
    # rank 0 may have been stopped in the middle of a torch.save: only such a newer one may be passed over
    assert resumed >= 6 and all("not a whole zip" in why for why in restart["checkpoints_skipped"]), restart
    log = (RUNS / job / "logs" / "rank.0.log").read_text()
    said = (
        f"attempt 1: from /workspace/jobs/{job}/output/checkpoints/{restart['checkpoint']} at epoch {resumed}"
    )
    assert said in log, log[-2000:]
    assert not [name for name in os.listdir(folder) if name.endswith(".corrupt")]  # nothing set aside
    assert (RUNS / job / "output" / "checkpoints" / "epoch-00040.ckpt").is_file()


def test_a_frozen_node_is_lost_within_liveness_timeout_and_the_job_finishes_on_the_spare() -> None:
    job = job_id("frozen")
    proc = start(job, LONG, "-e", "max_restarts=1", "-e", "liveness_timeout=20")
    try:
        wait_for("step 1000", lambda: past(proc, job, 1000))
        docker("pause", "node1")
        frozen = time.time()
        wait_for("the restart", lambda: len(status_of(job).get("restarts") or []) == 1, 120)  # type: ignore[arg-type]
        declared = time.time() - frozen
        output = finish(proc, 300)
    finally:
        docker("unpause", "node1", check=False)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    print(f"node1 declared lost {declared:.0f} s after it froze")
    assert declared < 60
    assert proc.returncode == 0, output[-6000:]
    [restart] = json.loads((RUNS / job / "status.json").read_text())["restarts"]
    assert restart["lost"] == ["node1"] and restart["spares_taken"] == ["node2"], restart
    # thawed, node1 finds its parent gone, stops its own ranks and gives its claim back: free for the next job
    # (its watcher releases the claim just after the sweep, so the ranks' end alone does not say so)
    wait_for("node1's ranks stopped after the thaw", lambda: processes("node1", job) == "", 60)
    claim = STATE_DIR / "node1" / "workspace" / "jobs" / ".claim"
    wait_for("node1's claim given back after the thaw", lambda: job not in claimed(claim), 60)


def claimed(path: Path) -> str:
    """A node's claim file as its text ('' when there is none)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def supervisors(job: str) -> dict[str, int]:
    """How many supervisors of ``job`` run on each node (the start's, or a standby's that took it over)."""
    pattern = f"ddp_cluster[.]supervise .*--job-dir /workspace/jobs/{job}$"
    found = {}
    for node in ("node0", "node1", "node2"):
        out = node_exec(node, f"pgrep -fc '{pattern}' || true", check=False).stdout.strip()
        found[node] = int(out) if out.isdigit() else 0
    return found


def cut(node: str, other: str, undo: bool = False) -> None:
    """Drop every packet between ``node`` and ``other`` in ``node``'s network namespace (both directions);
    ``undo`` takes the rules out again."""
    pid = docker("inspect", "-f", "{{.State.Pid}}", node).stdout.strip()
    address = docker(
        "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", other
    ).stdout.strip()
    for chain, side in (("INPUT", "-s"), ("OUTPUT", "-d")):
        rule = ["-D" if undo else "-I", chain, side, address, "-j", "DROP"]
        subprocess.run(["nsenter", "-t", pid, "-n", "iptables", *rule], check=not undo, capture_output=True)


def test_two_nodes_cut_from_each_other_leave_one_supervisor_and_the_job_ends_once() -> None:
    """node0 (the supervisor) and node1 (its standby) cannot reach each other, both still reach node2: each
    takes the other for lost; the fence gives the job to one of them (node2's vote), the other steps down.
    Within 60 s one supervisor of the job runs, and the job ends once, restarted once, on two nodes."""
    job = job_id("cut")
    extra = ("-e", "nodes=3", "-e", "max_restarts=1", "-e", "min_nodes=2", "-e", "liveness_timeout=20")
    # long enough to still run a minute after the cut (about 25 s to judge it, 10 s to train again)
    proc = start(job, LONG.replace("--epochs 200", "--epochs 1500"), *extra)
    try:
        wait_for("step 1000", lambda: past(proc, job, 1000))
        wait_for("a checkpoint copy on node1", lambda: replicated(job), 60)
        cut("node0", "node1")
        cut_at = time.monotonic()
        time.sleep(60)
        running = supervisors(job)
        print(f"supervisors 60 s after the cut: {running}")
        assert sum(running.values()) == 1, running  # one, and the job still runs under it
        output = finish(proc, 400)
    finally:
        cut("node0", "node1", undo=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    print(f"the job ended {time.monotonic() - cut_at:.0f} s after the cut")
    assert proc.returncode == 0, output[-6000:]
    status = json.loads((RUNS / job / "status.json").read_text())
    assert status["state"] == "succeeded", status
    [restart] = status["restarts"]
    assert len(restart["nodes_after"]) == 2 and "node2" in restart["nodes_after"], restart
    kept = status["supervisor_node"]
    assert kept in ("node0", "node1") and kept in restart["nodes_after"], status
    assert output.count(f"job {job}: succeeded after") == 1, output[-6000:]  # said by one supervisor
    assert json.loads((RUNS / job / "output" / "summary.json").read_text())["world_size"] == 2
    # the node whose supervisor stepped down is free for the next job at once
    loser = "node0" if kept == "node1" else "node1"
    listed = playbook("jobs.yml")
    assert listed.rc == 0 and f"{loser}: free" in listed.stdout, listed.stdout[-3000:]


def test_a_first_node_paused_shorter_than_liveness_timeout_is_followed_to_its_end() -> None:
    """The controller's calls to the first node fail for a while (node0's container paused 15 s, shorter than
    liveness_timeout): nothing is taken for lost, nothing restarts, train.yml follows the job to its end."""
    job = job_id("blink")
    extra = ("-e", "max_restarts=1", "-e", "liveness_timeout=40")
    proc = start(job, LONG.replace("--epochs 200", "--epochs 600"), *extra)
    try:
        wait_for("step 1000", lambda: past(proc, job, 1000))
        docker("pause", "node0")
        time.sleep(15)
        docker("unpause", "node0")
        output = finish(proc, 300)
    finally:
        docker("unpause", "node0", check=False)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-6000:]
    status = json.loads((RUNS / job / "status.json").read_text())
    assert status["state"] == "succeeded" and status["restarts"] == [], status
    assert status["supervisor_node"] == "node0" and "is gone" not in output, output[-4000:]


def test_a_killed_supervisor_fails_the_job_within_seconds_and_leaves_no_rank() -> None:
    job = job_id("nosupervisor")
    proc = start(job, LONG)
    try:
        wait_for("step 200", lambda: past(proc, job, 200))
        node_exec("node0", f"pkill -KILL -f 'ddp_cluster[.]supervise --job-dir /workspace/jobs/{job}$'")
        killed = time.monotonic()
        said = ""
        while time.monotonic() - killed < 60 and "the job's supervisor" not in said:
            assert proc.stdout is not None
            said += proc.stdout.readline()
        named = time.monotonic() - killed
        wait_for("no rank left", lambda: processes("node0", job) == "" and processes("node1", job) == "", 30)
        gone = time.monotonic() - killed
        output = said + finish(proc, 120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    print(f"supervisor named {named:.1f} s after the kill; no rank left {gone:.1f} s after it")
    assert proc.returncode not in (0, None)
    assert "the job's supervisor (pid" in output and "on node0) died" in output, output[-4000:]
    assert named < 20 and gone < named + 10 + 5
    assert json.loads((RUNS / job / "status.json").read_text())["state"] == "failed"


def test_a_full_disk_under_the_job_directory_ends_the_job_naming_it() -> None:
    """A small tmpfs mounted over the job's directory inside node0 (the supervisor's and rank 0's), then
    filled: the status cannot be written; the job ends, named, with no rank left."""
    job = job_id("fulldisk")
    proc = start(job, LONG)
    pid, where = "", f"/workspace/jobs/{job}"
    try:
        wait_for("step 200", lambda: past(proc, job, 200))
        pid = docker("inspect", "-f", "{{.State.Pid}}", "node0").stdout.strip()
        fill = f"mount -t tmpfs -o size=64k tmpfs {where} && (dd if=/dev/zero of={where}/fill bs=4k || true)"
        subprocess.run(["nsenter", "-t", pid, "-m", "sh", "-c", fill], check=True, capture_output=True)
        filled = time.monotonic()
        output = finish(proc, 180)
        took = time.monotonic() - filled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if pid:
            subprocess.run(
                ["nsenter", "-t", pid, "-m", "umount", "-l", where], check=False, capture_output=True
            )
    print(f"train.yml ended {took:.0f} s after the disk filled")
    assert proc.returncode not in (0, None)
    assert "No space left on device" in output, output[-4000:]
    wait_for("no rank left", lambda: processes("node0", job) == "" and processes("node1", job) == "", 30)
