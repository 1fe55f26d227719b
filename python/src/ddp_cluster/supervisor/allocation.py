"""A job's start inside its Slurm allocation: Slurm runs the job's batch script on the first node it gave the
job, and that script becomes the job's supervisor.

train.yml puts the job's files (job.tar.gz unpacked, the checkpoint to resume from, the secrets) into the
staged folder ``<jobs>/.staged/<id>`` of the node it submits from, then ``sbatch``. Here, once Slurm gave the
nodes:

Slurm runs ``DDP_SUBMITTED_ON=NODE python -m ddp_cluster.supervise --job-dir JOB`` (the batch script,
:func:`ddp_cluster.job.queue.batch_script`), whose first step is :func:`start_here`:

1. **The nodes**: ``SLURM_JOB_NODELIST`` expanded (:func:`ddp_cluster.job.queue.expand`), this node first (it
   runs rank 0 and the supervisor); the job runs on as many as it asked for, and the rest of the allocation
   are its spares (a restart takes one: it is the job's own, no claim needed).
2. **The check**, on every node of the allocation from here over the mesh, as the controller's check made it
   before the start (:mod:`ddp_cluster.job.node_check`): the image's start files put back, the job's id unused
   on each node, the master port free here, no other job's process running. A refusal ends the Slurm job
   with the problems on its output (train.yml shows them) and changes nothing.
3. **The files**: the staged folder moved into the job's directory here (or, when another node submitted,
   copied over the mesh and the staged copy removed there); ``job.json``, the hostfile and (npu) the rank
   table written for the nodes Slurm gave.
4. **The supervisor** (:mod:`ddp_cluster.supervisor.loop`) then runs in the batch script's process, so
   Slurm tracks it: ``scancel`` and the time limit reach it as SIGTERM, which stops every rank cleanly.

Standard library only (the node's Python).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ddp_cluster.job import node_check, node_jobs, queue
from ddp_cluster.job import spec as jobspec
from ddp_cluster.job.queue import staged_dir
from ddp_cluster.supervisor.check import check_all
from ddp_cluster.supervisor.recovery import plan_files
from ddp_cluster.supervisor.remote import DISTRIBUTE_TIMEOUT, POOL, Mesh

# The last words of a job that cannot start (supervisor.loop.LAST_WORDS).
LAST_WORDS = "last-words"


class AllocationError(Exception):
    """The job cannot start in the nodes Slurm gave; the message names what and the fix."""


def allocated(nodelist: str, me: str) -> list[str]:
    """The allocation's nodes (Slurm's hostlist), this node first, then Slurm's order."""
    names = queue.expand(nodelist)
    if me not in names:
        raise AllocationError(f"this node ({me}) is not in the job's allocation ({nodelist})")
    return [me, *[name for name in names if name != me]]


def assign(spec: jobspec.JobSpec, nodes: Sequence[str]) -> jobspec.JobSpec:
    """The spec on the nodes Slurm gave: the first as many as the job asked for run it, the rest are its
    spares (only a job that may restart holds any)."""
    wanted = len(spec.nodes)
    if len(nodes) < wanted:
        raise AllocationError(
            f"Slurm gave {len(nodes)} node(s) ({', '.join(nodes)}) for a job of {wanted}: scancel it and"
            " submit it again"
        )
    return dataclasses.replace(
        spec,
        nodes=tuple(nodes[:wanted]),
        spares=tuple(nodes[wanted:]) if spec.max_restarts else (),
    )


def check(spec: jobspec.JobSpec, nodes: Sequence[str], mesh: Mesh) -> list[str]:
    """The check before the start on every node of the allocation (see the module's text): its problems."""
    jobs = node_jobs.jobs_dir(spec.job_dir)
    first = node_check.node_script(spec.master_port, jobs, spec.job_dir)
    others = node_check.node_script(None, jobs, spec.job_dir)
    with ThreadPoolExecutor(max_workers=min(POOL, max(1, len(nodes)))) as pool:
        answers = check_all(mesh, list(nodes), first, others, pool)
    found: list[str] = []
    for node in nodes:
        port = spec.master_port if node == mesh.me else None
        found += node_check.problems(node, node, answers[node], port, [], own=spec.id, ranks=spec.world_size)
    return found


def take_files(job_dir: Path, submitted_on: str, mesh: Mesh) -> None:
    """The staged files into the job's directory: moved here, or copied from the node that submitted the job
    over the mesh (its staged copy then removed)."""
    staged = staged_dir(job_dir)
    if job_dir.is_symlink():  # planted by something in the node (a job's code can): nothing goes through it
        raise AllocationError(
            f"{job_dir} in node {mesh.me} is a symbolic link (to {os.readlink(job_dir)}), not a directory:"
            " something in the node container made it (a job's code can); nothing was written through it."
            f" Remove it (docker exec {mesh.me} rm {job_dir}) and run the job again"
        )
    if submitted_on == mesh.me:
        if not staged.is_dir():
            raise AllocationError(f"the job's staged files {staged} are not here: submit it again")
        os.rename(staged, job_dir)
        return
    job_dir.mkdir(mode=0o700, parents=True)
    source = shlex.quote(str(staged))
    try:
        copy = subprocess.run(
            [*mesh.ssh(submitted_on), f"tar -C {source} -cf - ."],
            capture_output=True,
            timeout=DISTRIBUTE_TIMEOUT,
            check=False,
        )
        unpacked = (
            subprocess.run(
                ["tar", "-xf", "-", "-C", str(job_dir), "--no-same-owner"],
                input=copy.stdout,
                capture_output=True,
                timeout=DISTRIBUTE_TIMEOUT,
                check=False,
            )
            if copy.returncode == 0
            else None
        )
        said = (
            ""
            if unpacked is not None and unpacked.returncode == 0
            else (copy.stderr if unpacked is None else unpacked.stderr).decode(errors="replace").strip()
        )
    except subprocess.TimeoutExpired:
        said = f"no copy within {DISTRIBUTE_TIMEOUT:g} s"
    if said or unpacked is None:
        shutil.rmtree(job_dir, ignore_errors=True)  # half a copy (the secrets with it) is not left
        raise AllocationError(
            f"the job's files could not be copied from {submitted_on}, which submitted it ({said[-300:]})"
        )
    mesh.run(submitted_on, f"rm -rf {source}")


def prepare(job_dir: Path, submitted_on: str, environ: Mapping[str, str], mesh: Mesh) -> None:
    """Steps 1 to 3 of the module's text; AllocationError naming every problem."""
    nodes = allocated(str(environ.get("SLURM_JOB_NODELIST") or mesh.me), mesh.me)
    staged = staged_dir(job_dir)
    planned = staged / jobspec.JOB_FILE
    if submitted_on == mesh.me:
        spec = jobspec.load(planned)
    else:
        text = mesh.run(submitted_on, f"cat {shlex.quote(str(planned))}")
        try:
            spec = jobspec.JobSpec.from_dict(json.loads(text))
        except (ValueError, jobspec.JobSpecError) as error:
            raise AllocationError(
                f"the job's plan could not be read from {submitted_on}, which submitted it ({error})"
            ) from None
    spec = assign(spec, nodes)
    if problems := check(spec, [*spec.nodes, *spec.spares], mesh):
        raise AllocationError(" ".join(problems))
    take_files(job_dir, submitted_on, mesh)
    (job_dir / "allocation").write_text(
        f"slurm_job_id={environ.get('SLURM_JOB_ID', '')}\nnodes={','.join(spec.nodes)}\n"
        f"spares={','.join(spec.spares)}\n"
    )
    plan_files(spec, job_dir)


def forget_slurm(environ: MutableMapping[str, str]) -> None:
    """The batch step's Slurm variables (``SLURM_*``, ``SBATCH_*``, ``SRUN_*``) taken out of ENVIRON, the
    Slurm job's id kept as ``DDP_SLURM_JOB_ID`` (the job's processes are ours to launch, over the mesh)."""
    if "SLURM_JOB_ID" in environ:
        environ["DDP_SLURM_JOB_ID"] = environ["SLURM_JOB_ID"]
    for name in [name for name in environ if name.startswith(("SLURM_", "SBATCH_", "SRUN_"))]:
        del environ[name]


def start_here(job_dir: Path, submitted_on: str, environ: Mapping[str, str] | None = None) -> str:
    """Steps 1 to 3 here (the supervisor's, when Slurm started it): '' when the job may start, else why not,
    also left as the job's last words (the container's /tmp: the job's directory may not be its own), where
    train.yml's wait reads them."""
    mesh = Mesh(socket.gethostname())
    try:
        prepare(job_dir, submitted_on, os.environ if environ is None else environ, mesh)
    except (
        AllocationError,
        OSError,
        jobspec.JobSpecError,
        queue.QueueError,
        subprocess.SubprocessError,
    ) as error:
        said = f"{mesh.me}: the job cannot start in its Slurm allocation: {error}"
        print(said, file=sys.stderr)
        # what was staged (the secrets with it) is not left behind by a job that does not start
        if submitted_on == mesh.me:
            shutil.rmtree(staged_dir(job_dir), ignore_errors=True)
        else:
            with contextlib.suppress(Exception):
                mesh.run(submitted_on, f"rm -rf {shlex.quote(str(staged_dir(job_dir)))}")
        spare = Path("/tmp/ddp-cluster", f"{job_dir.name}.{LAST_WORDS}")
        with contextlib.suppress(OSError):
            spare.parent.mkdir(parents=True, exist_ok=True)
            spare.write_text(said[:4000] + "\n")
        return said
    finally:
        mesh.close()
    return ""


# How long a job's end is told to a Slurm that does not answer (its controller may have been lost with the
# job's first node), every SCANCEL_EVERY seconds.
SCANCEL_RETRY = 3600
SCANCEL_EVERY = 5


def end_in_slurm(job: str, run: Any = None, retry: Any = subprocess.Popen) -> bool:
    """The Slurm job named JOB (our job id) ended in Slurm, when the job ended on a node Slurm did not start
    it on (its standby took it over): its batch host was lost with the first node, so nothing else would
    end it, and its nodes would stay allocated. When Slurm does not answer (slurmctld ran on that first
    node too), a detached loop here asks again every SCANCEL_EVERY seconds for SCANCEL_RETRY seconds, until
    it is back. Whether Slurm answered at once; nothing happens where Slurm has no such job (a job started
    without Slurm)."""
    argv = ["scancel", "--quiet", f"--name={job}"]
    if queue.run_slurm(argv, run):
        return True
    again = (
        f"end=$(( $(date +%s) + {SCANCEL_RETRY} )); while [ $(date +%s) -lt $end ]; do"
        f" timeout {queue.SLURM_COMMAND_TIMEOUT} {shlex.join(argv)} && exit 0; sleep {SCANCEL_EVERY}; done"
    )
    with contextlib.suppress(OSError):
        retry(
            ["/bin/sh", "-c", again],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    return False
