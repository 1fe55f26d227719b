"""A planned job's files on the controller, written whole and atomically under ``runs/<id>/``:

    plan.json         the plan as :meth:`ddp_cluster.job.plan.Plan.to_dict` makes it (``ddp-cluster report``,
                      ``train.yml -e attach=ID`` read it back: :func:`load`)
    job.tar.gz        what every node's job directory starts with: job.json, the script or the project under
                      workdir/, the rank table; the first node unpacks it and its supervisor gives every other
                      node
    workdir.tar.gz    the project directory (train.yml -e workdir), packed once for a health gate and the job
                      after it (:func:`pack_project`)

Standard library only.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddp_cluster.files import add_file, write_atomic
from ddp_cluster.job import spec as job
from ddp_cluster.job import workdir
from ddp_cluster.job.request import PlanError

if TYPE_CHECKING:
    from ddp_cluster.job.plan import Plan

PLAN_FILE = "plan.json"
BUNDLE = job.BUNDLE_FILE
WORKDIR_ARCHIVE = "workdir.tar.gz"


def pack_project(
    project: str,
    script: str,
    job_runs: Path,
    max_mb: float,
    base_id: str,
    previous: Mapping[str, Any],
    pack: bool,
    follow_links: bool = False,
) -> dict[str, Any]:
    """The project packed into ``job_runs``/workdir.tar.gz, or the packing of ``previous`` (the plan of the
    job's health gate) when it packed the same project the same way; without ``pack`` (check mode) nothing
    is written. ``follow_links``: a link to outside the project is packed as what it points to (else
    refused)."""
    archive = job_runs / WORKDIR_ARCHIVE
    before = previous.get("packed") or {}
    if (
        previous.get("base_id") == base_id
        and before.get("workdir") == project
        and before.get("script") == script
        and bool(before.get("follow_links")) == follow_links
        and archive.is_file()
    ):
        return {**before, "reused": True}
    if not pack:
        return {
            "files": 0,
            "bytes": 0,
            "script": script,
            "workdir": project,
            "follow_links": follow_links,
            "reused": False,
        }
    try:
        summary = workdir.pack(Path(project), script, archive, int(max_mb * 2**20), follow_links=follow_links)
    except workdir.WorkdirError as error:
        raise PlanError([f"{error}; nothing was started"]) from None
    return {**summary, "workdir": project, "follow_links": follow_links, "reused": False}


def bundle_bytes(plan: Plan) -> bytes:
    """job.tar.gz: what every node's job directory starts with (job.json, the script or the project under
    workdir/, the rank table), in memory (the project is bounded)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        add_file(tar, job.JOB_FILE, plan.spec.dumps().encode())
        if plan.rank_table:
            add_file(tar, "rank_table.json", plan.rank_table.encode())
        if plan.script:
            add_file(tar, Path(plan.script).name, Path(plan.script).read_bytes())
        if plan.workdir:
            with tarfile.open(Path(plan.run_dir.removesuffix("/preflight")) / WORKDIR_ARCHIVE) as project:
                for member in project.getmembers():
                    data = project.extractfile(member) if member.isfile() else None
                    member.name = f"workdir/{member.name}"
                    tar.addfile(member, data)
    return buffer.getvalue()


def write_files(plan: Plan) -> None:
    """runs/<id>/plan.json and job.tar.gz on the controller (written whole, atomically)."""
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / BUNDLE, bundle_bytes(plan))
    write_atomic(run_dir / PLAN_FILE, (json.dumps(plan.to_dict(), indent=2, sort_keys=True) + "\n").encode())


def load(run_dir: Path) -> dict[str, Any]:
    """A run's plan.json (as :meth:`ddp_cluster.job.plan.Plan.to_dict` wrote it)."""
    data = json.loads((run_dir / PLAN_FILE).read_text(encoding="utf-8"))
    return dict(data) if isinstance(data, Mapping) else {}
