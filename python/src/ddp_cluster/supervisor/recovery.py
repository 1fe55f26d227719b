"""A job's restart on the cluster, by its supervisor: no controller is needed.

After a failure that a restart can cure (:func:`ddp_cluster.supervisor.failures.restart_cause`), within
``max_restarts``: on the nodes that still answer, a free spare in place of each lost node (never a drained
one: :mod:`ddp_cluster.supervisor.drain`; else fewer, down to ``min_nodes``), from the newest checkpoint
that is whole (:func:`ddp_cluster.supervisor.replicas.newest_verified`: the entrypoint's, or a user's
script's under the same names), named to the ranks in ``DDP_RESUME_FROM``; the attempt's logs kept under
``JOB/attempts/<n>/`` on each node; the restart recorded in the status (and in summary.json at the end).
"""

from __future__ import annotations

import io
import json
import os
import shlex
import tarfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddp_cluster.ascend import ranktable
from ddp_cluster.files import add_file, write_atomic
from ddp_cluster.job import queue
from ddp_cluster.job import spec as jobspec
from ddp_cluster.runtime.checkpoint_names import FOLDER, NAME
from ddp_cluster.server import image_reset
from ddp_cluster.supervisor import failures
from ddp_cluster.supervisor.failures import Failure, read_text
from ddp_cluster.supervisor.jobs import claim_one
from ddp_cluster.supervisor.replicas import newest_verified

if TYPE_CHECKING:
    from ddp_cluster.supervisor.loop import Supervisor
    from ddp_cluster.supervisor.remote import Mesh

# Where a restarted job's earlier attempts keep their logs (JOB/attempts/<n>/), on every node.
ATTEMPTS = "attempts"
# The job's files, unpacked on every node before the launcher starts (see Supervisor.run).
BUNDLE = jobspec.BUNDLE_FILE
LAUNCHER_LOG = "launcher.log"
# A node's answer to "did a rank here raise an error of the program?": the exception lines among the last
# lines of each rank's log there (mpirun's, or torchrun's agent's with its ranks' lines), a few KiB at most.
EXCEPTION_LINES = (
    'for f in {logs}/*/rank.*/stdout; do tail -n 200 "$f"; done 2>/dev/null'
    " | grep -E '(Error|Exception)(:|$)' | tail -n 64; true"
)


def newest_checkpoint(output: Path) -> tuple[str, int]:
    """The newest checkpoint's file name in OUTPUT/checkpoints and its step ('' and 0 when none), by name
    (:func:`checkpoint_step`); names sort in training order; temporary files are not checkpoints."""
    folder = output / FOLDER
    names = sorted(path.name for path in folder.iterdir() if NAME.match(path.name)) if folder.is_dir() else []
    return (names[-1], checkpoint_step(output, names[-1])) if names else ("", 0)


def checkpoint_step(output: Path, name: str) -> int:
    """The step of checkpoint ``name`` of OUTPUT/checkpoints: a mid-epoch checkpoint (epoch-E.step-S.ckpt)
    names its step; an epoch's is found in metrics.jsonl's record of that epoch (0 when none says)."""
    match = NAME.match(name)
    if match is None:
        return 0
    if match.group(2):
        return int(match.group(2))
    epoch = int(match.group(1))
    for line in read_text(output / "metrics.jsonl", limit=16 * 1024 * 1024).splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") == "epoch" and record.get("epoch") == epoch:
            return int(record.get("step") or 0)
    return 0


def step_of_copy(name: str, known: Mapping[str, Any]) -> int:
    """The step of an epoch's checkpoint copied from the first node, from the steps the first node wrote into
    the status: its own, else its epoch times the steps of an epoch seen in another epoch's checkpoint (every
    epoch of an attempt has as many steps); 0 when nothing says."""
    if isinstance(known.get(name), int):
        return int(known[name])
    match = NAME.match(name)
    if match is None or match.group(2):
        return 0
    epoch = int(match.group(1))
    for other, step in sorted(known.items(), reverse=True):
        seen = NAME.match(other)
        if seen and not seen.group(2) and int(seen.group(1)) > 0 and isinstance(step, int):
            return epoch * step // int(seen.group(1))
    return 0


def step_of(progress: Any) -> int | None:
    if isinstance(progress, Mapping) and isinstance(progress.get("step"), int):
        return int(progress["step"])
    return None


def restart_cause(supervisor: Supervisor, failure: Failure, pool: ThreadPoolExecutor) -> str | None:
    """Why a restart could cure ``failure``, from this attempt's logs: the launcher's, the ranks' here, and
    the failing rank's on its own node (mpirun writes a rank's log there); None when it cannot.

    The rank mpirun names is the first whose exit it heard of, not always the one that failed first: a
    rank's peers here lose their connection as soon as it exits, and their exit is heard before its own on
    another node. So a cause read from the logs (a collective's lost peer or timeout) stands only once the
    other nodes' rank logs hold no error of the program (:data:`EXCEPTION_LINES`, asked of all at once)."""
    job_dir = supervisor.job_dir
    logs = sorted(path for path in (job_dir / "logs").rglob("*") if path.is_file())
    texts = [read_text(job_dir / LAUNCHER_LOG), *(read_text(log, 256 * 1024) for log in logs)]
    curable = failure.restartable and not failure.lost and failure.signal is None
    if curable and failure.node in supervisor.nodes and failure.node != supervisor.me:
        process = supervisor.nodes.index(failure.node) if supervisor.spec.agents else failure.rank
        texts.append("\n".join(supervisor.rank_log_tail(process or 0, failure.node)))
    cause = failures.restart_cause(failure, texts)
    others = [node for node in supervisor.nodes if node != supervisor.me]
    if cause is None or not curable or failure.cause or not others:
        return cause
    command = EXCEPTION_LINES.format(logs=shlex.quote(str(job_dir / "logs")))
    said = supervisor.mesh.run_on(others, command, pool)
    return None if any(failures.users_error(text) for text in said.values()) else cause


def recover(supervisor: Supervisor, failure: Failure, pool: ThreadPoolExecutor) -> bool:
    """After a failure, restart the job if it may be (max_restarts, the cause, enough nodes); False (the
    failure's reason then says why) when it is not restarted."""
    spec, done, mesh = supervisor.spec, len(supervisor.restarts), supervisor.mesh
    cause = restart_cause(supervisor, failure, pool)
    lost_before = [item for record in supervisor.restarts for item in record.get("lost", [])]
    if cause is None or not spec.max_restarts:
        if spec.max_restarts and failure.restartable:
            failure.reason += "; not restarted: a restart does not cure this (the job's own error)"
        return False
    if done >= spec.max_restarts:
        failure.reason += (
            f"; not restarted again: max_restarts={spec.max_restarts} reached"
            f" (lost before: {', '.join(lost_before) or 'none'})"
        )
        return False
    # the restart is this supervisor's only once it won the next generation on a majority of the job's voters
    # (supervisor.fence): a standby that took the job over meanwhile, or a first node cut off from this one
    # only, keeps it otherwise
    election = supervisor.elect(pool, unheard=failure.lost)
    if not election.won:
        failure.reason += f"; not restarted here: {election.describe()}"
        return False
    others = [node for node in supervisor.nodes if node != supervisor.me and node not in failure.lost]
    down = set(failure.lost) | set(mesh.down_now(others, pool))
    healthy = [node for node in supervisor.nodes if node not in down]
    if leftover := mesh.leftover(healthy, supervisor.tag, pool):
        failure.reason += f"; not restarted: processes of the job outlived the stop on {', '.join(leftover)}"
        return False
    number = done + 1
    last_step = step_of(supervisor.progress())
    # Newer checkpoints that are not whole: passed over (ours renamed aside), the next older taken.
    skipped: list[str] = []
    checkpoint, _ = newest_verified(supervisor.job_dir, spec.checkpoint_dir, spec.id, skipped)
    resume_step = checkpoint_step(supervisor.job_dir / "output", checkpoint) if checkpoint else 0
    if checkpoint and not resume_step:  # an epoch's checkpoint copied here: its step, as the first node said
        resume_step = step_of_copy(checkpoint, supervisor.status.status.checkpoint_steps)
    archived = False
    # A node that does not take the job's files (it froze, its disk is full) is replaced by a spare too.
    taken: list[str] = []
    refused: list[str] = []
    drained: list[str] = []  # spares passed over: drained (kept out of new work)
    while True:
        taken = [node for node in taken if node not in refused]
        healthy = [node for node in healthy if node not in refused]
        for node in spec.spares:
            if len(healthy) + len(taken) >= supervisor.wanted:
                break
            if (
                node not in supervisor.nodes
                and node not in lost_before
                and node not in taken
                and node not in refused
                and node not in drained
                and spare_free(supervisor, node, drained)
            ):
                taken.append(node)
        nodes = healthy + taken
        fewest = spec.min_nodes or supervisor.wanted
        if len(nodes) < fewest or supervisor.me not in nodes:
            failure.reason += (
                f"; not restarted: {len(nodes)} node(s) left ({', '.join(nodes)}), fewer than"
                f" min_nodes={fewest}, and no spare up and free"
                + (f" among {', '.join(spec.spares)}" if spec.spares else " (the inventory has none)")
                + (f" (did not take the job's files: {', '.join(refused)})" if refused else "")
                + (f" (drained, passed over: {', '.join(drained)})" if drained else "")
            )
            return False
        if not archived:
            archive_attempt(supervisor, number - 1, healthy, pool)
            archived = True
        supervisor.spec = replace(
            spec,
            nodes=tuple(nodes),
            spares=tuple(node for node in spec.spares if node not in nodes),
            restart=number,
            resume=spec.kind == "train" and not spec.script,
            resume_from=f"{spec.job_dir}/output/{FOLDER}/{checkpoint}" if checkpoint else "",
        )
        supervisor.nodes = list(nodes)
        supervisor.launcher = supervisor.spec.launch_argv()
        update = write_plan_files(supervisor)
        job_dir = supervisor.job_dir
        # a spare joins as a node starting a job does: what an earlier job left in its image is put back first
        error = reset_images(mesh, taken, str(Path(spec.job_dir).parent), pool) if taken else None
        error = error or (mesh.give(taken, supervisor.files_for_others(), job_dir, pool) if taken else None)
        error = error or mesh.give([node for node in nodes if node != supervisor.me], update, job_dir, pool)
        if error is None:
            break
        if not error.node or error.node == supervisor.me or error.node in refused:
            failure.reason += f"; not restarted: {error.reason}"
            return False
        refused.append(error.node)
        down.add(error.node)
    record = {
        "restart": number,
        "cause": cause,
        "lost": sorted(down),
        "nodes_before": list(spec.nodes),
        "nodes_after": nodes,
        "spares_taken": taken,
        "lost_at": round(failure.at, 2),
        "restarted_at": round(time.time(), 2),
        "training_again_s": None,
        "checkpoint": checkpoint or None,
        "resume_step": resume_step,
        "last_step": last_step,
        "steps_redone": max(0, last_step - resume_step) if last_step is not None else None,
        "checkpoints_skipped": skipped,
    }
    if given_back := give_back_to_slurm(supervisor.spec, down | set(lost_before)):
        record["given_back_to_slurm"] = given_back
    supervisor.restarts.append(record)
    supervisor.progress_at_restart = supervisor.progress()
    status = supervisor.status.status
    supervisor.status.write(
        nodes=nodes,
        launcher=supervisor.launcher,
        ran_on=list(dict.fromkeys([*status.ran_on, *nodes])),
        restarts=supervisor.restarts,
        lost_nodes=sorted(set(status.lost_nodes) | down),
        ranks_running=False,
    )
    return True


def give_back_to_slurm(spec: jobspec.JobSpec, lost: set[str], run: Any = None) -> list[str]:
    """The lost nodes taken out of the job's Slurm allocation (a job Slurm started: ``DDP_SLURM_JOB_ID``),
    so that Slurm gives them to the next job once they are back rather than holding them for this one until
    it ends; the nodes given back, [] when none was (not a Slurm job, or Slurm refused: the job goes on
    either way)."""
    slurm_id = os.environ.get("DDP_SLURM_JOB_ID", "")
    kept = [node for node in (*spec.nodes, *spec.spares) if node not in lost]
    gone = sorted(lost)
    if not slurm_id.isdigit() or not gone or not kept:
        return []
    argv = ["scontrol", "update", f"jobid={slurm_id}", f"nodelist={','.join(kept)}"]
    return gone if queue.run_slurm(argv, run) else []


# the last line of a spare's reset: it ran (the reset says nothing when nothing changed)
RESET_RAN = "image-reset-ran"


def reset_images(mesh: Mesh, nodes: Sequence[str], jobs_dir: str, pool: ThreadPoolExecutor) -> Failure | None:
    """Put back what the image owns of the files a shell or Python runs at its start on each of ``nodes``
    (spares about to join: :mod:`ddp_cluster.server.image_reset`, as the start's node check does); the
    failure naming the first node whose files could not be put back (the spare is then passed over)."""
    outputs = mesh.run_on(nodes, f"{image_reset.command(jobs_dir)}; echo {RESET_RAN}", pool)
    for node in nodes:
        said = outputs.get(node, "")
        if RESET_RAN not in said:  # the reset says nothing when nothing changed: the marker says it ran
            return Failure(f"node {node} did not answer the reset of its image's start files", node=node)
        refused = [line for line in said.splitlines() if line.startswith(image_reset.REFUSED)]
        if refused:
            return Failure(f"node {node}: {refused[0].removeprefix(image_reset.REFUSED)[:300]}", node=node)
    return None


def spare_free(supervisor: Supervisor, node: str, drained: list[str] | None = None) -> bool:
    """A spare is a node that answers, runs no job (the node's own answer: ddp_cluster.supervisor.jobs), is
    not drained and is claimed for this job (the claim refuses a drained node, under the node's lock: a drain
    and this claim never both win); a drained one is added to ``drained``."""
    if supervisor.mesh.probe(node) != "up":
        return False
    jobs_dir = str(Path(supervisor.spec.job_dir).parent)
    if supervisor.mesh.jobs_on(node, jobs_dir) != []:
        return False
    nodes = [*supervisor.nodes, node]
    answer = claim_one(supervisor.mesh, node, supervisor.spec.id, jobs_dir, nodes)
    if answer.get("drained") and drained is not None:
        drained.append(node)
    return bool(answer.get("claimed"))


def archive_attempt(
    supervisor: Supervisor, number: int, nodes: Sequence[str], pool: ThreadPoolExecutor
) -> None:
    """Move an attempt's logs to JOB/attempts/<number>/ on each node that answers (here: its launcher.log
    too), so that the next attempt starts with empty logs and the report keeps both."""
    where = shlex.quote(str(supervisor.job_dir))
    target = f"{where}/{ATTEMPTS}/{number}"
    move = f"mkdir -p {target} && if [ -d {where}/logs ]; then mv {where}/logs {target}/; fi"
    move += f" && mkdir -p {where}/logs"
    move += f" && if [ -f {where}/{LAUNCHER_LOG} ]; then mv {where}/{LAUNCHER_LOG} {target}/; fi; true"
    list(pool.map(lambda node: supervisor.mesh.run(node, move), nodes))


def write_plan_files(supervisor: Supervisor) -> bytes:
    """This attempt's job.json, hostfile and (npu, rank_table) rank table, here; the tar of what the other
    nodes need (job.json, the rank table)."""
    return plan_files(supervisor.spec, supervisor.job_dir)


def plan_files(spec: jobspec.JobSpec, job_dir: Path) -> bytes:
    """SPEC's job.json, hostfile and (npu, rank_table) rank table written in JOB_DIR; the tar of what the
    other nodes need (job.json, the rank table)."""
    files = {jobspec.JOB_FILE: spec.dumps().encode()}
    if spec.accelerator == "npu" and spec.hccl_init == "rank_table" and spec.recovery.get("npu_plan"):
        table = ranktable.job_rank_table_dict(
            spec.recovery["npu_plan"], list(spec.nodes), spec.nproc_per_node, spec.recovery.get("visible")
        )
        files["rank_table.json"] = ranktable.dumps(table).encode()
    for name, data in files.items():
        write_atomic(job_dir / name, data)
    (job_dir / "hostfile").write_text(spec.hostfile())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            add_file(tar, name, data)
    return buffer.getvalue()


def note_training_again(supervisor: Supervisor) -> None:
    """After a restart, the seconds from the loss to the first progress past the resumed step."""
    if not supervisor.restarts or supervisor.restarts[-1].get("training_again_s") is not None:
        return
    record, progress = supervisor.restarts[-1], supervisor.progress()
    step = step_of(progress)
    if progress is None or progress == supervisor.progress_at_restart:
        return
    if step is not None and step <= int(record.get("resume_step") or 0):
        return
    record["training_again_s"] = round(time.time() - float(record["lost_at"]), 1)
    supervisor.status.write(restarts=supervisor.restarts)


def record_restarts_in_summary(supervisor: Supervisor) -> None:
    """The restarts, in the job's summary.json too (when the program wrote one)."""
    summary = supervisor.job_dir / "output" / "summary.json"
    if not supervisor.restarts or not summary.is_file():
        return
    try:
        data = json.loads(summary.read_text())
    except ValueError:
        return
    data["restarts"] = supervisor.restarts
    write_atomic(summary, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
