"""A job's plan, from the request to the :class:`ddp_cluster.job.spec.JobSpec`, its paths and its files.

``train.yml`` and ``check.yml`` call :func:`make_plan` once, on the controller, through the ``ddp_job_plan``
action, with

* the request: the ``ddp_job`` role's variables (train.yml's extra vars: nodes, launcher, script, ...), as
  Ansible resolved them, and the role's argument_specs (the one declaration of their types, choices and
  defaults: :mod:`ddp_cluster.job.request` reads them, and names the extra var a user typed);
* the inventory's facts (:class:`Inventory`): the nodes, the cluster's accelerator, and what site.yml
  recorded of each node on the controller (:mod:`ddp_cluster.job.records`), so that a job probes nothing that
  does not change between jobs.

It returns a :class:`Plan` (the spec, where the job's files are on the controller and on each node, what each
node checks before the start, the lines that say what will run) or raises :class:`PlanError` naming every
variable that is wrong and how to fix it. :func:`write_files` (:mod:`ddp_cluster.job.bundle`) then writes the
job's files: ``runs/<id>/plan.json`` and ``job.tar.gz``.

Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import random
import string
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddp_cluster.ascend import ranktable
from ddp_cluster.job import node_jobs, queue, secrets
from ddp_cluster.job import spec as job
from ddp_cluster.job.bundle import BUNDLE, PLAN_FILE, WORKDIR_ARCHIVE, load, pack_project, write_files
from ddp_cluster.job.records import (
    NOT_CONVERGED,
    RECORDS_DIR,
    NodeRecord,
    node_record,
    read_records,
    unconverged,
    unconverged_reason,
)
from ddp_cluster.job.request import (
    NUMBER,
    PREFIX,
    PlanError,
    check_request,
    flag,
    health_args,
    split_args,
    whole_number,
    with_defaults,
)
from ddp_cluster.runtime import checkpoint_names

# What the playbooks' action and the report import from here.
__all__ = [
    "PLAN_FILE",
    "PREFIX",
    "RECORDS_DIR",
    "WORKDIR_ARCHIVE",
    "Inventory",
    "NodeRecord",
    "Plan",
    "PlanError",
    "dry_run_line",
    "fact",
    "find_checkpoint",
    "load",
    "make_plan",
    "ping_targets",
    "read_records",
    "unconverged",
    "whole",
    "write_files",
]

# What the playbook keeps of a plan (the fact ``_ddp_job_plan``, templated in every task's arguments and
# conditions on every node of the job): the names its conditions, the report and a gate's job read. The
# whole plan (the spec with its environment, rank table and recovery plan: megabytes on a thousand npu
# servers) stays in runs/<id>/plan.json, which the actions read themselves, once per call.
FACT_KEYS = ("id", "base_id", "kind", "label", "first", "nodes", "spares", "run_dir", "job_dir", "lines")
# Keys a playbook sets on the fact for one call (``attach``: follow a job started before; ``follow``: on its
# standby), which the whole plan read from its file takes over.
OVERRIDES = ("attach", "detach", "follow")


# Nodes a plan's line names one by one; more are counted, with the first and the last named.
NAMED = 8


def named(nodes: Sequence[str]) -> str:
    """Nodes as a plan's line names them: each of a few; of many, how many and the first and last ones (a
    line of a thousand names says less)."""
    if len(nodes) <= NAMED:
        return ", ".join(nodes)
    return f"{len(nodes)} nodes ({', '.join(nodes[:2])}, ..., {nodes[-1]})"


def check_each(plan: Mapping[str, Any]) -> bool:
    """Whether every node checks itself before the start (an npu health gate: each pings its devices'
    counterparts with its server's hccn_tool), rather than the first node checking them all."""
    return any(targets for targets in (plan.get("ping") or {}).values())


def fact(plan: Mapping[str, Any], plan_path: str) -> dict[str, Any]:
    """The fact ``_ddp_job_plan`` of a plan (:meth:`Plan.to_dict`, or an earlier run's plan.json):
    :data:`FACT_KEYS`, its overrides, ``check_each`` (:func:`check_each`: which nodes run the check) and
    ``plan_path``, the file that holds the whole plan."""
    kept = {key: plan[key] for key in (*FACT_KEYS, *OVERRIDES) if key in plan}
    return {**kept, "check_each": check_each(plan), "plan_path": plan_path}


def made_fact(made: Plan, whole_plan: Mapping[str, Any], check: bool) -> dict[str, Any]:
    """The fact of a plan just made: its ``plan_path`` is runs/<id>/plan.json (:func:`write_files`), or in
    check mode (nothing under runs/ is written) a file of the controller's temporary directory."""
    path = str(Path(made.run_dir, PLAN_FILE))
    if check:
        with tempfile.NamedTemporaryFile(
            "w", prefix=f"ddp-plan-{made.spec.id}-", suffix=".json", delete=False
        ) as checked:
            json.dump(whole_plan, checked)
        path = checked.name
    return fact(whole_plan, path)


def attached_fact(result: dict[str, Any]) -> dict[str, Any]:
    """The action's result for ``attach=ID`` (``plan_inputs.attach``) with the earlier run's plan as a fact
    (its plan.json, in its run directory, holds the whole plan)."""
    earlier = result.get("ansible_facts", {}).get("_ddp_job_plan")
    if earlier:
        path = str(Path(earlier["run_dir"], PLAN_FILE))
        result["ansible_facts"]["_ddp_job_plan"] = fact(earlier, path)
    return result


def whole(given: Mapping[str, Any]) -> dict[str, Any]:
    """The whole plan an action was given the fact of: ``plan_path``'s JSON, with the fact's overrides
    (attach, follow) on it. A plan given whole (no ``plan_path``) is taken as it is. Raises OSError or
    ValueError when the file cannot be read."""
    path = str(given.get("plan_path") or "")
    if not path:
        return dict(given)
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, Mapping):
        raise ValueError(f"{path} holds no plan")
    return {**data, **{key: given[key] for key in OVERRIDES if key in given}, "plan_path": path}


@dataclass(frozen=True)
class Inventory:
    """What the plan needs of the inventory and of this playbook run."""

    nodes: Sequence[str]  # group nodes, in inventory order
    accelerator: str  # cluster_accelerator
    records: Mapping[str, Any]  # nodes.json: node -> NodeRecord fields
    records_dir: str = ""  # where they were read (for messages)
    cluster: str = ""  # cluster_name: recorded in each plan, so that resume=true looks at this cluster's runs
    visible: Mapping[str, str] = field(default_factory=dict)  # node -> ASCEND_RT_VISIBLE_DEVICES
    npu_plan: Mapping[str, Any] = field(default_factory=dict)  # the device-IP plan (npu)
    cwd: str = "."  # where relative paths of the request are resolved (the playbook's working directory)
    previous: Mapping[str, Any] = field(default_factory=dict)  # the plan made before, in this run (a gate's)
    gate_passed: str = ""  # the id of the health gate that passed in this run
    # The variables set (not empty) in the controller's environment: each of secret_env's must be; the plan
    # keeps no value (the start reads them).
    env_names: frozenset[str] = frozenset()
    now: float | None = None  # for the job's id (default: time.time())
    # The drained nodes (node -> its drain record: reason, since, by), as the nodes said it before the plan;
    # the plan takes "the first N undrained nodes". ``drain_unknown``: nodes whose state could not be read
    # (they did not answer; their own check before the start refuses a drained one).
    drained: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    drain_unknown: Sequence[str] = ()
    # The nodes the last site.yml did not converge (node -> why: job.records.unconverged): passed over as
    # drained ones are, until site.yml converges them.
    unconverged: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """A job, planned: its spec, where its files are, and what each node checks before it starts."""

    spec: job.JobSpec
    base_id: str  # the job's id; a preflight gate's spec.id is <base_id>-preflight
    run_dir: str  # runs/<id>/ on the controller (a preflight gate's: runs/<id>/preflight)
    host_dirs: Mapping[str, str]  # node -> the job's directory on its server
    script: str = ""  # the script on the controller (no workdir)
    workdir: str = ""  # the project directory on the controller
    resume_checkpoint: str = ""  # the checkpoint on the controller that the first node resumes from
    # Newer checkpoints that resume=true passed over, each with why (not whole, or not the entrypoint's).
    resume_skipped: Sequence[str] = ()
    cluster: str = ""  # the inventory's cluster_name: resume=true looks among the runs planned for it
    rank_table: str = ""  # the job's HCCL rank table (JSON text), npu with hccl_init rank_table
    ping: Mapping[str, Sequence[Mapping[str, Any]]] = field(
        default_factory=dict
    )  # node -> hccn_tool -ping targets
    bindings: Mapping[str, str] = field(default_factory=dict)  # node -> DDP_CPU_BINDING
    packed: Mapping[str, Any] = field(default_factory=dict)  # the project's packing: files, bytes, reused
    preflight: bool = False  # a job that a health gate passed first, in this run
    collect_timeout: int = 10
    detach: bool = False  # train.yml returns once every rank runs (the job goes on without it)
    wait_for_nodes: bool = False  # nodes busy with another job are waited for (within job_timeout)
    skipped: Mapping[str, str] = field(default_factory=dict)  # drained node passed over -> why (its record)
    drain_unknown: Sequence[str] = ()  # nodes whose drain record could not be read before the plan
    # A job Slurm schedules (train.yml's jobs): how it is submitted (queue.sbatch_argv's nodes, spares,
    # selection, partition, qos) and how long train.yml waits for it in the queue; empty: started directly
    # (a health gate). Its ``nodes`` are the candidates Slurm would give now; the nodes it gives replace them.
    slurm: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return "job" if self.spec.kind == "train" else "health gate"

    @property
    def first(self) -> str:
        return self.spec.nodes[0]

    @property
    def bundle(self) -> str:
        return f"{self.run_dir}/{BUNDLE}"

    def lines(self) -> list[str]:
        """What will run, as the plan prints it."""
        spec = self.spec
        cpu = (
            f" (asked for, on this {spec.accelerator} cluster)"
            if spec.device == "cpu" != spec.accelerator
            else ""
        )
        program = (
            "python -m ddp_cluster.gate"
            if spec.kind != "train"
            else spec.script or "python -m ddp_cluster.train"
        )
        line = (
            f"{self.label} {spec.id}: {spec.launcher} on {named(spec.nodes)},"
            f" {spec.nproc_per_node} process(es) per node, world size {spec.world_size},"
            f" device {spec.device}{cpu},"
            f" {' '.join([program, *spec.script_args])}"
        )
        if spec.kind == "preflight":
            line += f", results in {self.run_dir}"
        if self.packed:  # the job's project (a preflight gate packs it for the job after it)
            again = ", as packed for its health gate" if self.packed.get("reused") else ""
            mib = float(self.packed.get("bytes", 0)) / 1048576
            line += (
                f" in {self.packed.get('workdir')} ({self.packed.get('files')} files, {mib:.1f} MiB{again})"
            )
        if self.resume_checkpoint:
            line += f", resuming from {self.resume_checkpoint}"
        lines = [line]
        if self.slurm:
            lines.append(f"{self.label} {spec.id}: {slurm_line(self.slurm, spec.nodes)}")
        if self.resume_skipped:
            lines.append(
                f"{self.label} {spec.id}: passed over newer checkpoint(s): {'; '.join(self.resume_skipped)}"
            )
        drained = {node: why for node, why in self.skipped.items() if not why.startswith(NOT_CONVERGED)}
        if drained:
            passed = "; ".join(f"{node} ({why})" for node, why in drained.items())
            lines.append(
                f"{self.label} {spec.id}: skipped drained node(s): {passed}."
                " ansible-playbook jobs.yml -e undrain=NODE gives one back"
            )
        if len(drained) < len(self.skipped):
            passed = "; ".join(f"{node} ({why})" for node, why in self.skipped.items() if node not in drained)
            lines.append(f"{self.label} {spec.id}: skipped {passed}")
        if self.drain_unknown:
            lines.append(
                f"{self.label} {spec.id}: could not read whether {named(self.drain_unknown)} is drained"
                " (no answer); each node's own check before the start refuses a drained one"
            )
        if spec.max_restarts:
            fewer = f"down to min_nodes={spec.min_nodes}" if spec.min_nodes else "never with fewer nodes"
            spares = ", ".join(spec.spares) or "none in the inventory"
            if self.slurm:
                spares = (
                    f"up to {self.slurm['spares']} more node(s) Slurm has free at the start, held by the job"
                    if self.slurm.get("spares")
                    else "none in the inventory"
                )
            lines.append(
                f"{self.label} {spec.id}: restarts up to {spec.max_restarts} time(s) when a node is lost or a"
                f" rank killed, from the newest checkpoint; spares: {spares}; {fewer}"
            )
        if any(self.bindings.values()):
            bound = "; ".join(f"{node} {self.bindings.get(node) or '(unbound)'}" for node in spec.nodes)
            lines.append(
                f"{self.label} {spec.id}: ranks bound to the CPUs of their devices (cluster_cpu_binding numa;"
                f" device=CPUs): {bound}"
            )
        return lines

    def to_dict(self) -> dict[str, Any]:
        """The plan as the playbook keeps it (a fact) and as runs/<id>/plan.json holds it."""
        data = asdict(self)
        data["spec"] = json.loads(self.spec.dumps())  # lists, as plan.json has them
        data.update(
            id=self.spec.id,
            kind=self.spec.kind,
            label=self.label,
            nodes=list(self.spec.nodes),
            spares=list(self.spec.spares),
            first=self.first,
            job_dir=self.spec.job_dir,
            bundle=self.bundle,
            timeout=self.spec.timeout,
            poll=self.spec.poll,
            master_port=self.spec.master_port,
            world_size=self.spec.world_size,
            lines=self.lines(),
        )
        return data


def dry_run_line(whole: Mapping[str, Any]) -> str:
    """What train.yml --check says after the plan's lines (``whole``: Plan.to_dict())."""
    return (
        f"job {whole['id']}: a dry run (--check): planned here and checked from {whole['first']};"
        " nothing was packed, written under runs/, submitted to Slurm or started"
    )


def slurm_line(slurm: Mapping[str, Any], candidates: Sequence[str]) -> str:
    """How a job goes to Slurm, as the plan says it."""
    excluded = [node for node in slurm.get("exclude") or () if node not in (slurm.get("unfit") or ())]
    selection = [f"on {', '.join(slurm['nodelist'])}"] if slurm.get("nodelist") else []
    selection += [f"not on {', '.join(excluded)}"] if excluded else []
    selection += [f"{key} {slurm[key]}" for key in ("partition", "qos") if slurm.get(key)]
    said = f" ({'; '.join(selection)})" if selection else ""
    return (
        f"submitted to Slurm for {slurm['nodes']} whole node(s){said}; it runs where Slurm gives nodes"
        f" ({named(candidates)} if free now), and waits in the queue while they are taken"
    )


def slurm_nodes(
    inventory: Inventory, count: int, request: Mapping[str, Any], job_id: str
) -> tuple[list[str], dict[str, str], queue.Selection]:
    """A Slurm job's candidate nodes (choose_nodes among the nodes it may take: its nodelist first, never
    one it excludes), the drained ones passed over, and its selection for sbatch: the nodes it must have,
    and those it must not (the request's exclude, and the nodes drained or not converged here, which Slurm
    must not give it either)."""
    try:
        asked = queue.select(count, request.get("nodelist"), request.get("exclude"), list(inventory.nodes))
    except queue.QueueError as error:
        raise PlanError([f"{error}. Nothing was started (job {job_id})"]) from None
    unfit = {**{node: node_jobs.describe_drained(record) for node, record in inventory.drained.items()}}
    unfit.update({node: unconverged_reason(why) for node, why in inventory.unconverged.items()})
    if named_unfit := [node for node in asked.nodelist if node in unfit]:
        raise PlanError(
            [
                f"nodelist names {', '.join(f'{node} ({unfit[node]})' for node in named_unfit)}, which takes"
                " no job: give it back (ansible-playbook jobs.yml -e undrain=NODE, or site.yml for a node not"
                f" converged) or leave it out of nodelist. Nothing was started (job {job_id})"
            ]
        )
    pool = [
        *asked.nodelist,
        *(n for n in inventory.nodes if n not in asked.nodelist and n not in asked.exclude),
    ]
    nodes, skipped = choose_nodes(dataclasses.replace(inventory, nodes=pool), count, job_id)
    avoid = [
        *asked.exclude,
        *(node for node in inventory.nodes if node in unfit and node not in asked.exclude),
    ]
    return nodes, skipped, queue.Selection(asked.nodelist, tuple(avoid))


def run_cluster(run: Path) -> str | None:
    """The cluster (cluster_name) a run was planned for, from its plan.json; None when it does not say."""
    try:
        planned = json.loads((run / PLAN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    cluster = planned.get("cluster") if isinstance(planned, Mapping) else None
    return cluster if isinstance(cluster, str) else None


def find_checkpoint(
    runs_dir: Path,
    resume_from: str,
    cluster: str = "",
    skipped: list[str] | None = None,
    *,
    ours_only: bool = False,
) -> str:
    """The newest checkpoint by training progress (its name's epoch and step; the run's id breaks a tie),
    fetched under ``runs_dir``, that is whole (:func:`ddp_cluster.runtime.checkpoint_names.check_file`,
    streamed): of run ``resume_from`` when given, else of the runs planned for ``cluster``; '' when none.
    A file's mtime decides nothing. A run's checkpoints are its output's (``runs/<id>/output/checkpoints/``;
    ``runs/<id>/checkpoints/`` in runs laid out before the output had its own folder); the copies under
    ``runs/<id>/nodes/`` are not. Each newer one passed over is appended to ``skipped`` with why; with
    ``ours_only`` (a job of the package's entrypoint, which loads only its own format), one without our
    header is passed over too."""
    notes = skipped if skipped is not None else []
    if resume_from:
        runs = [runs_dir / resume_from]
    else:
        try:
            listed = sorted(runs_dir.iterdir())
        except OSError:
            listed = []
        runs = [run for run in listed if run.is_dir() and run_cluster(run) == cluster]
    found: list[tuple[tuple[int, int], str, Path]] = []
    for run in runs:
        for folder in (run / "output" / checkpoint_names.FOLDER, run / checkpoint_names.FOLDER):
            try:
                entries = list(folder.iterdir())
            except OSError:
                continue
            for path in entries:
                order = checkpoint_names.checkpoint_order(path.name)
                if order is not None and path.is_file():
                    found.append((order, run.name, path))
    for _, _, path in sorted(found, reverse=True):
        checked = checkpoint_names.check_file(path)
        if checked.problem:
            notes.append(checked.problem)
        elif ours_only and checked.kind != "ours":
            notes.append(
                f"{path} was written by a user's script (no ddp_cluster header): the package's entrypoint"
                " cannot load it; resume it with that script (-e script=...)"
            )
        else:
            return str(path)
    return ""


def ping_targets(
    npu_plan: Mapping[str, Any], nodes: Sequence[str], nproc_per_node: int, visible: Mapping[str, str]
) -> dict[str, list[dict[str, Any]]]:
    """For each of the job's nodes, the devices to ping with hccn_tool: each of its job's devices (the first
    nproc_per_node of its ASCEND_RT_VISIBLE_DEVICES, else 0..nproc_per_node-1) to the same device of the next
    node on the ring (with two nodes, each the other), at the address the device-IP plan gives that device."""
    addresses = {
        str(server["host"]): list(server.get("device_ips") or []) for server in npu_plan.get("servers", [])
    }

    def devices(node: str) -> list[int]:
        listed = [part.strip() for part in str(visible.get(node) or "").split(",") if part.strip()]
        return [int(part) for part in listed[:nproc_per_node]] if listed else list(range(nproc_per_node))

    targets: dict[str, list[dict[str, Any]]] = {}
    order = [str(node) for node in nodes]
    for index, node in enumerate(order):
        peer = order[(index + 1) % len(order)]
        targets[node] = []
        if peer == node:
            continue
        for local, (device, peer_device) in enumerate(zip(devices(node), devices(peer), strict=False)):
            peer_ips = addresses.get(peer, [])
            if peer_device >= len(peer_ips):
                raise PlanError(
                    [
                        f"{peer} has no address for device {peer_device} in the device-IP plan"
                        " (npu_device_ips or npu_device_ip_seed with npu_device_count)"
                    ]
                )
            targets[node].append(
                {
                    "device": device,
                    "local_rank": local,
                    "peer": peer,
                    "peer_device": peer_device,
                    "address": peer_ips[peer_device],
                }
            )
    return targets


def _job_id(request: Mapping[str, Any], inventory: Inventory) -> str:
    if request.get("id"):
        return str(request["id"])
    previous = inventory.previous
    if request.get("kind") == "train" and previous.get("kind") == "preflight" and previous.get("base_id"):
        return str(previous["base_id"])  # the gate's results go into its job's directory
    stamp = time.strftime(
        "%Y%m%d-%H%M%S", time.gmtime(inventory.now if inventory.now is not None else time.time())
    )
    return stamp + "-" + "".join(random.choices(string.ascii_lowercase + string.digits, k=4))


def _check_unused(run: Path, base_id: str, kind: str, previous: Mapping[str, Any]) -> None:
    """A job id names one job: refuse one whose run (runs/<id>) holds anything, before anything is written,
    but for the job after its own health gate in this playbook run (runs/<id>/preflight is that gate's, and
    the gate was refused the same way if runs/<id> was used)."""
    gate = previous.get("kind") == "preflight" and previous.get("base_id") == base_id
    if (kind == "train" and gate) or not (run.is_file() or (run.is_dir() and any(run.iterdir()))):
        return
    raise PlanError(
        [
            f"job_id={base_id} was used before: {run} holds its run, and a job id names one job. Pick another"
            " job_id, or leave job_id out (a fresh one is made). To follow that job: -e"
            f" attach={base_id}. To resume from it: -e resume=true -e resume_from={base_id}. Nothing was"
            " started"
        ]
    )


@dataclass(frozen=True)
class _Checked:
    """The request's values as the plan uses them, once every rule between them holds."""

    count: int  # the job's nodes: the first ``count`` of the inventory's
    timeout: int | None
    max_restarts: int
    min_nodes: int
    preflight: bool
    detach: bool
    wait_for_nodes: bool
    queue_timeout: int  # seconds train.yml waits for a queued job to start (0: not at all)
    gate_args: list[str]
    script: str  # as the user gave it: a path on the controller, or inside the project
    project: str  # the project directory as given (workdir), empty: none
    max_mb: str
    follow_links: bool  # the project's links to outside it are packed as what they point to
    secret_env: list[str]  # the names of the job's secrets (their values: the controller's environment)
    script_path: Path | None  # the script on the controller (no project)
    runs_dir: Path
    checkpoint: str  # the checkpoint on the controller to resume from, empty: none
    skipped_checkpoints: list[str]  # newer ones passed over, with why


def _check(
    request: Mapping[str, Any], options: Mapping[str, Mapping[str, Any]], inventory: Inventory
) -> _Checked:
    """The request (argument_specs' defaults filled in) checked: every problem at once, as one PlanError."""
    problems = check_request(request, options)
    gate = request["kind"] != "train"
    nodes_asked = request["nodes"]
    count = 0
    if str(nodes_asked).strip() == "":
        problems.insert(0, "nodes is required: run train.yml -e nodes=N")
    elif whole_number(nodes_asked, "nodes")[0] is None:
        problems.insert(0, f"nodes={nodes_asked} is not a whole number of 1 or more")
    elif int(str(nodes_asked)) > len(inventory.nodes):
        problems.insert(
            0,
            f"nodes={nodes_asked} is more than the {len(inventory.nodes)} nodes of the inventory (nodes:"
            f" {', '.join(inventory.nodes)}). Bring up more with site.yml, or ask for fewer",
        )
    else:
        count = int(str(nodes_asked))
    if request["launcher"] == "torch_npu_run" and inventory.accelerator != "npu":
        problems.append(
            "launcher=torch_npu_run needs torch_npu: it is for npu clusters"
            f" (this one is {inventory.accelerator})"
        )
    timeout, problem = whole_number(request["timeout"], "timeout")
    problems += [problem] if problem and not gate else []
    max_restarts, problem = whole_number(request["max_restarts"], "max_restarts", minimum=0)
    problems += [f"{problem} (0: no restart)"] if problem else []
    min_nodes, problem = whole_number(request["min_nodes"], "min_nodes", minimum=0)
    problems += [f"{problem} (0: every node of the job)"] if problem else []
    if count and min_nodes and min_nodes > count:
        problems.append(
            f"min_nodes={min_nodes} is more than nodes={count}: a job that lost a node goes on with fewer,"
            " never more; ask for min_nodes of at most nodes"
        )
    resume = flag(request["resume"], "resume", problems)
    preflight = flag(request["preflight"], "preflight", problems)
    detach = flag(request["detach"], "detach", problems)
    wait_for_nodes = flag(request["wait_for_nodes"], "wait_for_nodes", problems)
    queue_timeout, problem = whole_number(request.get("queue_timeout", 3600), "queue_timeout", minimum=0)
    problems += [f"{problem} (seconds; 0: return once queued)"] if problem and not gate else []
    gate_args, gate_problems = health_args(request)
    problems += gate_problems
    follow_links = flag(request["workdir_follow_links"], "workdir_follow_links", problems)
    secret_env, secret_problems = secrets.parse_names(request["secret_env"])
    env = request["env"] if isinstance(request["env"], Mapping) else {}
    secret_problems = secret_problems or secrets.name_problems(secret_env, [str(name) for name in env])
    if absent := [name for name in secret_env if name not in inventory.env_names and not secret_problems]:
        secret_problems.append(secrets.missing_message(absent))
    problems += secret_problems
    script = str(request["script"] or "")
    project = str(request["workdir"] or "")
    max_mb = str(request["workdir_max_mb"]).strip()
    if project and not script:
        problems.append(
            f"workdir={project} needs the script to run in it: add -e script=PATH, a path inside the"
            " directory (e.g. train.py)"
        )
    if project and NUMBER.match(max_mb) and float(max_mb) <= 0:
        problems.append(f"ddp_job_workdir_max_mb={max_mb} must be a number of MiB above 0")
    cwd = Path(inventory.cwd)
    script_path = (cwd / script).resolve() if script and not project else None
    if script_path is not None and not script_path.is_file():
        problems.append(
            f"script={script} does not exist on the controller (or is not a file): give the path of a"
            f" torchrun-style training script, relative to {cwd} or absolute"
        )
    runs_dir = (cwd / str(request["runs_dir"] or options[PREFIX + "runs_dir"]["default"])).resolve()
    resume_from = str(request["resume_from"] or "")
    skipped: list[str] = []
    checkpoint = ""
    if resume and not problems:
        ours_only = request["kind"] == "train" and not script
        checkpoint = find_checkpoint(runs_dir, resume_from, inventory.cluster, skipped, ours_only=ours_only)
    if resume and not problems and not checkpoint:
        runs = f"run {resume_from}" if resume_from else f"no earlier run of cluster {inventory.cluster!r}"
        problems.append(
            f"resume=true but {runs} under {runs_dir} has a checkpoint that is whole"
            + (f" (passed over: {'; '.join(skipped)})" if skipped else "")
            + ": run train.yml without resume first"
            + ("" if resume_from else ", or name a run with -e resume_from=JOB_ID")
        )
    if problems:
        raise PlanError(problems)
    return _Checked(
        count=count,
        timeout=timeout,
        max_restarts=max_restarts or 0,
        min_nodes=min_nodes or 0,
        preflight=preflight,
        detach=detach,
        wait_for_nodes=wait_for_nodes,
        queue_timeout=queue_timeout or 0,
        gate_args=gate_args,
        script=script,
        project=project,
        max_mb=max_mb,
        follow_links=follow_links,
        secret_env=secret_env,
        script_path=script_path,
        runs_dir=runs_dir,
        checkpoint=checkpoint,
        skipped_checkpoints=skipped,
    )


def choose_nodes(inventory: Inventory, count: int, job_id: str) -> tuple[list[str], dict[str, str]]:
    """The job's nodes, the first ``count`` undrained nodes of the inventory, and the drained ones passed
    over on the way (node -> why); PlanError naming the drained nodes when too few are left."""
    undrained = [node for node in inventory.nodes if node not in inventory.drained]
    if count > len(undrained):
        drained = "; ".join(
            f"{node} ({node_jobs.describe_drained(record)})"
            for node, record in inventory.drained.items()
            if node in inventory.nodes
        )
        raise PlanError(
            [
                f"nodes={count} but only {len(undrained)} of the inventory's {len(inventory.nodes)} nodes are"
                f" undrained ({', '.join(undrained) or 'none'}); drained: {drained}. A drained node takes no"
                " new job: once it is fixed, give it back with ansible-playbook jobs.yml -e undrain=NODE, or"
                f" ask for fewer nodes. Nothing was started (job {job_id})"
            ]
        )
    converged = [node for node in undrained if node not in inventory.unconverged]
    if count > len(converged):
        passed = "; ".join(
            f"{node} ({inventory.unconverged[node]})" for node in undrained if node in inventory.unconverged
        )
        raise PlanError(
            [
                f"nodes={count} but only {len(converged)} of the inventory's {len(undrained)} undrained nodes"
                f" were converged by the last site.yml ({', '.join(converged) or 'none'}); not converged:"
                f" {passed}. Run site.yml again for them, or ask for fewer nodes. Nothing was started (job"
                f" {job_id})"
            ]
        )
    nodes = converged[:count]
    last = inventory.nodes.index(nodes[-1]) if nodes else -1
    skipped = {
        node: node_jobs.describe_drained(inventory.drained[node])
        if node in inventory.drained
        else unconverged_reason(inventory.unconverged[node])
        for node in inventory.nodes[:last]
        if node in inventory.drained or node in inventory.unconverged
    }
    return nodes, skipped


def make_plan(
    request: Mapping[str, Any],
    options: Mapping[str, Mapping[str, Any]],
    inventory: Inventory,
    pack: bool = True,
) -> Plan:
    """The plan of ``request`` (the role's variables without ddp_job_), checked against ``options`` (its
    argument_specs, whose defaults fill in what the request leaves out) and ``inventory``; PlanError naming
    what is wrong. With ``pack``, a project directory (workdir) is checked and packed into
    runs/<id>/workdir.tar.gz (once for a gate and the job after it)."""
    request = with_defaults(request, options)
    asked = _check(request, options, inventory)
    kind = str(request["kind"])
    gate = kind != "train"
    base_id = _job_id(request, inventory)
    _check_unused(asked.runs_dir / base_id, base_id, kind, inventory.previous)
    if kind == "train" and asked.preflight and inventory.gate_passed != f"{base_id}-preflight":
        raise PlanError(
            [
                f"preflight={request.get('preflight')} but no health gate ran for job {base_id}: pass it on"
                " the command line (ansible-playbook train.yml -e preflight=true), not in the inventory;"
                " nothing was started"
            ]
        )
    slurm: dict[str, Any] = {}
    selection = queue.Selection()
    if gate:
        nodes, skipped = choose_nodes(inventory, asked.count, base_id)
    else:
        nodes, skipped, selection = slurm_nodes(inventory, asked.count, request, base_id)
    records = {node: node_record(inventory.records, node, inventory.records_dir) for node in nodes}
    # The spares a restart may take: the inventory's undrained nodes beyond the job's that site.yml recorded
    # (a Slurm job: any it may be given, other than its candidates; Slurm gives it up to max_restarts more).
    spares = [
        node
        for node in (
            inventory.nodes[inventory.nodes.index(nodes[-1]) + 1 :]
            if gate
            else [node for node in inventory.nodes if node not in nodes and node not in selection.exclude]
        )
        if node in inventory.records
        and node not in inventory.drained
        and node not in inventory.unconverged
        and not gate
        and asked.max_restarts
    ]
    # Any node Slurm may give the job (its first node may be one of them): where its directory would be. A
    # node site.yml has not recorded (or whose record the plan cannot use) is one Slurm must not give it.
    others, unrecorded = [], []
    for node in inventory.nodes:
        if gate or node in nodes or node in selection.exclude:
            continue
        if node in inventory.drained or node in inventory.unconverged:
            continue
        try:
            records[node] = node_record(inventory.records, node, inventory.records_dir)
            others.append(node)
        except PlanError:
            unrecorded.append(node)
    spares = [node for node in spares if node in others]
    if not gate:
        slurm = {
            "nodes": asked.count,
            "spares": min(asked.max_restarts, len(spares)),
            "nodelist": list(selection.nodelist),
            "exclude": [*selection.exclude, *unrecorded],
            # excluded because drained or not converged (the plan's lines name them)
            "unfit": [
                *(
                    node
                    for node in selection.exclude
                    if node in inventory.drained or node in inventory.unconverged
                ),
                *unrecorded,
            ],
            "partition": str(request.get("partition") or ""),
            "qos": str(request.get("qos") or ""),
            "queue_timeout": asked.queue_timeout,
        }
    spec_id = base_id + ("-preflight" if kind == "preflight" else "")
    run_dir = asked.runs_dir / base_id / ("preflight" if kind == "preflight" else "")
    networks: list[str] = []
    for record in records.values():
        if record.network not in networks:
            networks.append(record.network)
    job_dir = f"{records[nodes[0]].container_workspace}/jobs/{spec_id}"
    checkpoint = "" if gate else asked.checkpoint
    script_path = asked.script_path
    # A setting of the role that is a field of the spec by the same name (launcher, device, poll, ...) reaches
    # it as it is; what the plan makes or reads of the others follows.
    carried = {name: value for name, value in request.items() if name in job.JobSpec.__dataclass_fields__}
    made: dict[str, Any] = {
        "id": spec_id,
        "job_dir": job_dir,
        "nodes": nodes,
        "networks": networks,
        "timeout": float(str(request["health_timeout"])) if gate else asked.timeout,
        "kind": kind,
        "accelerator": inventory.accelerator,
        "script": ""
        if gate
        else (asked.script if asked.project else script_path.name if script_path else ""),
        "workdir": bool(asked.project) and not gate,
        "script_args": asked.gate_args if gate else split_args(request["script_args"]),
        "resume": bool(checkpoint),
        "launcher_ports": str(request.get("launcher_ports") or ""),
        "env": request["env"] or {},
        "secret_env": [] if gate else asked.secret_env,  # the gate runs no user code
        "mpirun_args": list(request["mpirun_args"] or []),
        "max_restarts": 0 if gate else asked.max_restarts,
        "min_nodes": 0 if gate else asked.min_nodes,
        "spares": spares,
        "resume_from": f"{job_dir}/output/checkpoints/{Path(checkpoint).name}" if checkpoint else "",
        "start_id": uuid.uuid4().hex[:16],
    }
    try:
        spec = job.JobSpec.from_dict(carried | made)
    except job.JobSpecError as error:
        raise PlanError([f"the job cannot be planned: {error}"]) from None
    rank_table, ping, nproc = "", {}, spec.nproc_per_node
    if inventory.accelerator == "npu":
        visible = {node: str(inventory.visible.get(node) or "") for node in nodes}
        if spec.hccl_init == "rank_table":
            try:
                table = ranktable.job_rank_table_dict(inventory.npu_plan, nodes, nproc, visible)
            except (ValueError, TypeError) as error:
                raise PlanError([f"the job's rank table cannot be made: {error}"]) from None
            rank_table = ranktable.dumps(table)
            if spares or not gate:  # a restart, or Slurm's nodes, make the table of its nodes on the cluster
                visible.update({node: str(inventory.visible.get(node) or "") for node in spares})
                spec = dataclasses.replace(
                    spec, recovery={"npu_plan": dict(inventory.npu_plan), "visible": visible}
                )
        if gate:
            ping = ping_targets(inventory.npu_plan, nodes, nproc, visible)
    packed: dict[str, Any] = {}
    project_dir = str((Path(inventory.cwd) / asked.project).resolve()) if asked.project else ""
    if asked.project and kind != "check":
        packed = pack_project(
            project_dir,
            asked.script,
            asked.runs_dir / base_id,
            float(asked.max_mb),
            base_id,
            inventory.previous,
            pack,
            follow_links=asked.follow_links,
        )
    return Plan(
        spec=spec,
        base_id=base_id,
        run_dir=str(run_dir).rstrip("/"),
        host_dirs={node: f"{records[node].workspace}/jobs/{spec_id}" for node in [*nodes, *spares, *others]},
        script="" if gate or asked.project else str(script_path or ""),
        workdir="" if gate else project_dir,
        resume_checkpoint=checkpoint,
        resume_skipped=[] if gate else asked.skipped_checkpoints,
        cluster=inventory.cluster,
        rank_table=rank_table,
        ping=ping,
        bindings={node: records[node].cpu_binding for node in [*nodes, *spares, *others]},
        packed=packed,
        preflight=kind == "train" and asked.preflight,
        collect_timeout=int(str(request["collect_timeout"])),
        detach=asked.detach and not gate,
        wait_for_nodes=asked.wait_for_nodes,
        skipped=skipped,
        drain_unknown=[node for node in inventory.drain_unknown if node in inventory.nodes],
        slurm=slurm,
    )
