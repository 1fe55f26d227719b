"""Which node runs a job's supervisor, asked from any node of the cluster through the mesh.

``jobs.yml -e logs=ID`` and ``-e sync=ID`` reach the cluster through one node (the entry node: the
inventory's first, or ``-e via=NODE``), which need not be the job's. :func:`locate` finds the job from there:
the node that holds ``JOB/status.json`` is the one whose supervisor runs it (its first node, or the node that
took the job over when the first was lost); its status names the job's nodes now (after a restart: with the
spares it took). The entry node answers at once when the job's supervisor runs on it; else it asks every node
of the mesh at once (one short ssh command each, :data:`POOL` in flight), and of several nodes holding a
status (an old first node, the one that took over) the live one that wrote last wins.

The mesh's nodes are the cluster's, as the ssh_mesh role wrote them into the node's ssh configuration
(:data:`MESH_CONFIG`'s ``Host`` line); a caller that knows them (the controller's inventory) hands them in.

Standard library only: it runs in the node image's Python.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.job import node_jobs
from ddp_cluster.job import spec as jobspec
from ddp_cluster.job import status as job_status
from ddp_cluster.supervisor.remote import POOL, Mesh

# The ssh_mesh role's client configuration on every node: its Host line names the cluster's nodes.
MESH_CONFIG = Path("/etc/ddp-cluster/ssh_config")


class JobNotFound(DdpClusterError):
    """No node of the cluster has the job (or the job id is no job id); the message says where to look."""


@dataclass(frozen=True)
class Located:
    """Where a job is: ``first`` runs its supervisor (holds its status.json), ``nodes`` are its nodes now,
    ``here`` whether ``first`` is the node that asked."""

    first: str
    nodes: list[str]
    here: bool


def mesh_nodes(config: Path | None = None) -> list[str]:
    """The cluster's nodes, from the mesh's ssh configuration (:data:`MESH_CONFIG`; [] when there is none)."""
    try:
        text = (config or MESH_CONFIG).read_text(encoding="utf-8")
    except OSError:
        return []
    nodes: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if len(words) > 1 and words[0].lower() == "host":
            nodes += [word for word in words[1:] if word not in nodes and not set(word) & set("*?!")]
    return nodes


def check_job_id(job_id: str) -> None:
    """JobNotFound when ``job_id`` is not a job's id (it goes into file paths and command lines)."""
    if problem := node_jobs.id_problem(job_id):
        raise JobNotFound(f"{problem}: jobs.yml lists the cluster's jobs")


def _spec_nodes(job_dir: Path) -> list[str]:
    try:
        return list(jobspec.load(job_dir / jobspec.JOB_FILE).nodes)
    except jobspec.JobSpecError:
        return []


def status_command(jobs_dir: str, job_id: str) -> str:
    """The shell command that prints a job's status.json on a node (nothing when it has none)."""
    return f"cat {shlex.quote(f'{jobs_dir}/{job_id}/{job_status.FILE}')} 2>/dev/null; true"


def pick(found: dict[str, job_status.Status]) -> str:
    """Of the nodes holding a status, the one whose supervisor runs the job: a live status before an ended
    one, then the one written last (a node that took the job over writes after the first node stopped)."""
    return max(found, key=lambda node: (not found[node].done, found[node].updated, node))


def locate(job_id: str, jobs_dir: str, mesh: Mesh, nodes: Sequence[str] | None = None) -> Located:
    """Where job ``job_id`` is (see the module's text), asked from ``mesh.me``; ``nodes``: the cluster's
    nodes to ask (default: :func:`mesh_nodes`). JobNotFound when no node that answered has it."""
    check_job_id(job_id)
    jobs_dir = jobs_dir.rstrip("/")
    job_dir = Path(jobs_dir, job_id)
    own = job_status.read(job_dir / job_status.FILE)
    if own is not None and not own.done and own.supervisor_node in ("", mesh.me):
        return Located(mesh.me, list(own.nodes) or _spec_nodes(job_dir), True)
    found: dict[str, job_status.Status] = {mesh.me: own} if own is not None else {}
    others = [node for node in dict.fromkeys(nodes or mesh_nodes()) if node != mesh.me]
    if others:
        command = status_command(jobs_dir, job_id)
        with ThreadPoolExecutor(max_workers=min(POOL, len(others))) as pool:
            answers = list(pool.map(lambda node: mesh.run(node, command), others))
        for node, text in zip(others, answers, strict=True):
            if not text.strip():
                continue
            try:
                found[node] = job_status.loads(text)
            except job_status.StatusError:
                continue  # torn or foreign: not a supervisor's word
    if not found:
        asked = len(others) + 1
        raise JobNotFound(
            f"no node has job {job_id} (asked {asked} node(s) from {mesh.me}):"
            " jobs.yml lists the cluster's jobs"
        )
    first = pick(found)
    status = found[first]
    listed = list(status.nodes) or (_spec_nodes(job_dir) if first == mesh.me else [])
    return Located(first, listed or [first], first == mesh.me)
