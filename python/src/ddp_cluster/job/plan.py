"""A job's plan, from the request to the :class:`ddp_cluster.job.spec.JobSpec`, its paths and its files,
in one
place.

``train.yml`` and ``check.yml`` call :func:`make_plan` once, on the controller, through the ``ddp_job_plan``
action, with

* the request: the ``ddp_job`` role's variables (train.yml's extra vars: nodes, launcher, script, ...), as
  Ansible resolved them, and the role's argument_specs (the one declaration of their types and choices:
  :func:`check_request` reads them, and names the extra var a user typed);
* the inventory's facts (:class:`Inventory`): the nodes, the cluster's accelerator, and what site.yml
  recorded of each node on the controller (:class:`NodeRecord`,
  ``~/.ddp-cluster/<cluster>/nodes/<node>.json``: its cluster interface, address, CPU binding and workspace),
  so that a job probes nothing that does not change between jobs.

It returns a :class:`Plan` (the spec, where the job's files are on the controller and on each node, what each
node checks before the start, the lines that say what will run) or raises :class:`PlanError` naming every
variable that is wrong and how to fix it. :func:`write_files` then writes the job's files:
``runs/<id>/plan.json`` (read by ``ddp-cluster report``) and ``job.tar.gz`` (job.json, the script or the
project, the rank table), which the first node unpacks and its supervisor gives every other node.

Standard library only.
"""

from __future__ import annotations

import dataclasses
import io
import ipaddress
import json
import random
import re
import shlex
import string
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddp_cluster.ascend import ranktable
from ddp_cluster.files import add_file, write_atomic
from ddp_cluster.job import spec as job
from ddp_cluster.job import workdir

PLAN_FILE = "plan.json"
BUNDLE = job.BUNDLE_FILE
WORKDIR_ARCHIVE = "workdir.tar.gz"
RECORDS_DIR = "nodes"  # under the cluster's controller directory: one NODE.json per node
# The extra var a user types for each of the role's variables (ddp_job_<name>); the others are named in full.
USER_NAMES = {
    "nodes": "nodes",
    "launcher": "launcher",
    "device": "device",
    "script": "script",
    "workdir": "workdir",
    "script_args": "script_args",
    "resume": "resume",
    "resume_from": "resume_from",
    "timeout": "job_timeout",
    "id": "job_id",
    "preflight": "preflight",
    "hccl_init": "cluster_hccl_init",
    "nproc_per_node": "cluster_nproc_per_node",
    "master_port": "cluster_master_port",
    "launcher_ports": "cluster_launcher_ports",
    "max_restarts": "max_restarts",
    "min_nodes": "min_nodes",
    "detach": "detach",
    "attach": "attach",
    "wait_for_nodes": "wait",
}
PREFIX = "ddp_job_"
FLAGS = ("true", "false", "yes", "no", "1", "0")
NUMBER = re.compile(r"^[0-9]+([.][0-9]+)?$")
WHOLE = re.compile(r"^[0-9]+$")
HEALTH_SETTINGS = (
    "fraction",
    "floor_gbps",
    "min_bytes",
    "max_bytes",
    "factor",
    "seconds_per_size",
    "timeout",
)


class PlanError(ValueError):
    """What is wrong with the request, every problem named; nothing was started or written."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = [str(problem).rstrip(".") for problem in problems]
        super().__init__("; ".join(self.problems) + ".")


def user_name(name: str) -> str:
    """The name a user sets for the role's variable ``name`` (without ddp_job_): the extra var, or the
    variable."""
    return USER_NAMES.get(name, PREFIX + name)


def _choices(values: Sequence[Any]) -> str:
    shown = [str(value) for value in values]
    return ", ".join(shown[:-1]) + " or " + shown[-1] if len(shown) > 1 else shown[0]


def check_request(request: Mapping[str, Any], options: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The request's values against the role's argument_specs options (``ddp_job_<name>``: type, choices):
    one problem per value that does not fit, naming what the user sets. ``raw`` options are checked by the
    plan."""
    problems = []
    for option, spec in options.items():
        name = option.removeprefix(PREFIX)
        if name not in request:
            continue
        value, kind, shown = request[name], spec.get("type", "str"), user_name(name)
        if spec.get("choices") and value not in spec["choices"]:
            problems.append(f"{shown}={value} must be {_choices(spec['choices'])}")
        elif kind == "list" and (isinstance(value, str) or not isinstance(value, Sequence)):
            problems.append(f"{shown} must be a list, not {value!r}")
        elif kind == "dict" and not isinstance(value, Mapping):
            problems.append(f"{shown} must be a mapping of names to values, not {value!r}")
        elif kind in ("int", "float") and not NUMBER.match(str(value).strip()):
            problems.append(f"{shown}={value} must be a {'whole ' if kind == 'int' else ''}number")
        elif kind == "int" and not WHOLE.match(str(value).strip()):
            problems.append(f"{shown}={value} must be a whole number")
        elif kind in ("str", "path") and not isinstance(value, str | int | float):
            problems.append(f"{shown} must be a string, not {value!r}")
    return problems


@dataclass(frozen=True)
class NodeRecord:
    """What site.yml recorded of a node (the containers stage), read by every job's plan."""

    interface: str  # the node's cluster interface (cluster_network_interface)
    address: str  # its IPv4 address there, with the prefix (10.0.0.5/24)
    workspace: str  # the node's workspace directory on its server (the container's /workspace)
    container_workspace: str = "/workspace"
    cpu_binding: str = ""  # DDP_CPU_BINDING (device=CPUs;...), empty: unbound

    @classmethod
    def from_dict(cls, node: str, data: Any) -> NodeRecord:
        if not isinstance(data, Mapping):
            raise PlanError([f"the record of node {node} is not a mapping"])
        missing = [name for name in ("interface", "address", "workspace") if not data.get(name)]
        if missing:
            detail = (
                f"its cluster interface {data.get('interface', '?')} had no IPv4 address in the node"
                if "address" in missing
                else f"it lacks {', '.join(missing)}"
            )
            raise PlanError(
                [
                    f"{node}: {detail} when site.yml recorded it: set cluster_network_interface for this host"
                    " to the interface that carries its cluster address, run site.yml, then train.yml again"
                ]
            )
        try:
            ipaddress.ip_interface(str(data["address"]))
        except ValueError as error:
            raise PlanError(
                [f"{node}: its recorded address {data['address']!r} is not an address: {error}"]
            ) from None
        return cls(
            interface=str(data["interface"]),
            address=str(data["address"]),
            workspace=str(data["workspace"]),
            container_workspace=str(data.get("container_workspace") or "/workspace"),
            cpu_binding=str(data.get("cpu_binding") or ""),
        )

    @property
    def network(self) -> str:
        return str(ipaddress.ip_interface(self.address).network)


@dataclass(frozen=True)
class Inventory:
    """What the plan needs of the inventory and of this playbook run."""

    nodes: Sequence[str]  # group nodes, in inventory order
    accelerator: str  # cluster_accelerator
    records: Mapping[str, Any]  # nodes.json: node -> NodeRecord fields
    records_dir: str = ""  # where they were read (for messages)
    visible: Mapping[str, str] = field(default_factory=dict)  # node -> ASCEND_RT_VISIBLE_DEVICES
    npu_plan: Mapping[str, Any] = field(default_factory=dict)  # the device-IP plan (npu)
    cwd: str = "."  # where relative paths of the request are resolved (the playbook's working directory)
    previous: Mapping[str, Any] = field(default_factory=dict)  # the plan made before, in this run (a gate's)
    gate_passed: str = ""  # the id of the health gate that passed in this run
    now: float | None = None  # for the job's id (default: time.time())


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
            f"{self.label} {spec.id}: {spec.launcher} on {', '.join(spec.nodes)},"
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
        if spec.max_restarts:
            fewer = f"down to min_nodes={spec.min_nodes}" if spec.min_nodes else "never with fewer nodes"
            spares = ", ".join(spec.spares) or "none in the inventory"
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
            lines=self.lines(),
        )
        return data


def _whole(value: Any, name: str, minimum: int = 1) -> tuple[int | None, str]:
    text = str(value).strip()
    if isinstance(value, bool) or not WHOLE.match(text) or int(text) < minimum:
        return (
            None,
            f"{user_name(name)}={value} must be a whole number{' of seconds above 0' if minimum else ''}",
        )
    return int(text), ""


def _flag(value: Any, name: str, problems: list[str]) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() not in FLAGS:
        problems.append(f"{user_name(name)}={value} must be true or false")
        return False
    return str(value).strip().lower() in ("true", "yes", "1")


def split_args(value: Any) -> list[str]:
    """A script's arguments as a list: a list stays, a string is split the way a shell would."""
    if value is None or value == "":
        return []
    if isinstance(value, list | tuple):
        return [str(part) for part in value]
    try:
        return shlex.split(str(value))
    except ValueError as error:
        raise PlanError([f"script_args={value!r} cannot be split like a shell would: {error}"]) from None


def health_args(request: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The gate's arguments from the ddp_job_health_* settings, and the problems with their ranges (their
    types are argument_specs', checked by :func:`check_request`)."""
    text = {name: str(request.get(f"health_{name}", "")).strip() for name in HEALTH_SETTINGS}
    value = {name: float(shown) for name, shown in text.items() if NUMBER.match(shown)}
    rules = {
        "fraction": (
            0 < value.get("fraction", 1) <= 1,
            "a number above 0 and at most 1 (0.5: half the median)",
        ),
        "min_bytes": (value.get("min_bytes", 4) >= 4, "a whole number of bytes, 4 or more"),
        "max_bytes": (
            value.get("max_bytes", 4) >= value.get("min_bytes", 4),
            f"at least ddp_job_health_min_bytes={text['min_bytes']}",
        ),
        "factor": (value.get("factor", 2) >= 2, "a whole number of 2 or more"),
        "seconds_per_size": (value.get("seconds_per_size", 1) > 0, "a number of seconds above 0"),
        "timeout": (value.get("timeout", 1) > 0, "a whole number of seconds above 0"),
    }
    problems = [
        f"ddp_job_health_{name}={text[name]} must be {rule}" for name, (ok, rule) in rules.items() if not ok
    ]
    ignore = request.get("health_ignore") or []
    args = ["--min-bytes", text["min_bytes"], "--max-bytes", text["max_bytes"], "--factor", text["factor"]]
    args += ["--seconds-per-size", text["seconds_per_size"], "--fraction", text["fraction"]]
    args += ["--floor-gbps", text["floor_gbps"]]
    if ignore and isinstance(ignore, list | tuple):
        args += ["--ignore", ",".join(str(item) for item in ignore)]
    return args, problems


def find_checkpoint(runs_dir: Path, resume_from: str) -> str:
    """The newest checkpoint fetched under ``runs_dir`` (of run ``resume_from`` when given), or ''."""
    found = [
        path
        for path in runs_dir.glob("**/checkpoints/epoch-*.ckpt")
        if re.fullmatch(r"epoch-[0-9]+([.]step-[0-9]+)?[.]ckpt", path.name)
        and (not resume_from or path.parent.parent.name == resume_from)
    ]
    return str(max(found, key=lambda path: path.stat().st_mtime)) if found else ""


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


def make_plan(
    request: Mapping[str, Any],
    options: Mapping[str, Mapping[str, Any]],
    inventory: Inventory,
    pack: bool = True,
) -> Plan:
    """The plan of ``request`` (the role's variables without ddp_job_), checked against ``options`` (its
    argument_specs) and ``inventory``; PlanError naming what is wrong. With ``pack``, a project directory
    (workdir) is checked and packed into runs/<id>/workdir.tar.gz (once for a gate and the job after it)."""
    problems = check_request(request, options)
    kind = str(request.get("kind", "train"))
    gate = kind != "train"

    nodes_asked = request.get("nodes", "")
    count = 0
    if str(nodes_asked).strip() == "":
        problems.insert(0, "nodes is required: run train.yml -e nodes=N")
    elif (
        isinstance(nodes_asked, bool)
        or not WHOLE.match(str(nodes_asked).strip())
        or int(str(nodes_asked)) < 1
    ):
        problems.insert(0, f"nodes={nodes_asked} is not a whole number of 1 or more")
    elif int(str(nodes_asked)) > len(inventory.nodes):
        problems.insert(
            0,
            f"nodes={nodes_asked} is more than the {len(inventory.nodes)} nodes of the inventory (nodes:"
            f" {', '.join(inventory.nodes)}). Bring up more with site.yml, or ask for fewer",
        )
    else:
        count = int(str(nodes_asked))
    if request.get("launcher") == "torch_npu_run" and inventory.accelerator != "npu":
        problems.append(
            "launcher=torch_npu_run needs torch_npu: it is for npu clusters"
            f" (this one is {inventory.accelerator})"
        )
    timeout, problem = _whole(request.get("timeout", ""), "timeout")
    problems += [problem] if problem and not gate else []
    max_restarts, problem = _whole(request.get("max_restarts", 0), "max_restarts", minimum=0)
    problems += [f"{problem} (0: no restart)"] if problem else []
    min_nodes, problem = _whole(request.get("min_nodes", 0), "min_nodes", minimum=0)
    problems += [f"{problem} (0: every node of the job)"] if problem else []
    if count and min_nodes and min_nodes > count:
        problems.append(
            f"min_nodes={min_nodes} is more than nodes={count}: a job that lost a node goes on with fewer,"
            " never more; ask for min_nodes of at most nodes"
        )
    job_id = request.get("id") or ""
    if job_id and not job.NAME.match(str(job_id)):
        problems.append(f"job_id={job_id} may hold only letters, digits, _ . and -")
    resume = _flag(request.get("resume", False), "resume", problems)
    preflight = _flag(request.get("preflight", False), "preflight", problems)
    detach = _flag(request.get("detach", False), "detach", problems)
    wait_for_nodes = _flag(request.get("wait_for_nodes", False), "wait_for_nodes", problems)
    gate_args, gate_problems = health_args(request)
    problems += gate_problems
    script = str(request.get("script") or "")
    project = str(request.get("workdir") or "")
    max_mb = str(request.get("workdir_max_mb", workdir.DEFAULT_MAX_MB)).strip()
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
    runs_dir = (cwd / str(request.get("runs_dir") or "runs")).resolve()
    resume_from = str(request.get("resume_from") or "")
    checkpoint = find_checkpoint(runs_dir, resume_from) if resume and not problems else ""
    if resume and not problems and not checkpoint:
        problems.append(
            f"resume=true but {'run ' + resume_from if resume_from else 'no earlier run'} under {runs_dir}"
            " has a checkpoint: run train.yml without resume first"
            + ("" if resume_from else ", or name a run with -e resume_from=JOB_ID")
        )
    if problems:
        raise PlanError(problems)

    base_id = _job_id(request, inventory)
    if kind == "train" and preflight and inventory.gate_passed != f"{base_id}-preflight":
        raise PlanError(
            [
                f"preflight={request.get('preflight')} but no health gate ran for job {base_id}: pass it on"
                " the command line (ansible-playbook train.yml -e preflight=true), not in the inventory;"
                " nothing was started"
            ]
        )
    nodes = list(inventory.nodes[:count])
    records = {node: NodeRecord.from_dict(node, _record(inventory, node)) for node in nodes}
    # The spares a restart may take: the inventory's nodes beyond the job's that site.yml recorded.
    spares = [
        node for node in inventory.nodes[count:] if node in inventory.records and not gate and max_restarts
    ]
    for node in spares:
        records[node] = NodeRecord.from_dict(node, inventory.records[node])
    spec_id = base_id + ("-preflight" if kind == "preflight" else "")
    run_dir = runs_dir / base_id / ("preflight" if kind == "preflight" else "")
    networks: list[str] = []
    for record in records.values():
        if record.network not in networks:
            networks.append(record.network)
    try:
        spec = job.JobSpec.from_dict(
            {
                "id": spec_id,
                "job_dir": f"{records[nodes[0]].container_workspace}/jobs/{spec_id}",
                "nodes": nodes,
                "nproc_per_node": request.get("nproc_per_node", 1),
                "launcher": request.get("launcher", "mpirun"),
                "device": request.get("device", "cpu"),
                "networks": networks,
                "timeout": float(str(request.get("health_timeout"))) if gate else timeout,
                "kind": kind,
                "accelerator": inventory.accelerator,
                "hccl_init": request.get("hccl_init", "rank_table"),
                "script": "" if gate else (script if project else script_path.name if script_path else ""),
                "workdir": bool(project) and not gate,
                "script_args": gate_args if gate else split_args(request.get("script_args")),
                "resume": bool(checkpoint) and not gate,
                "master_port": request.get("master_port", 29501),
                "launcher_ports": str(request.get("launcher_ports") or ""),
                "env": request.get("env") or {},
                "mpirun_args": list(request.get("mpirun_args") or []),
                "poll": request.get("poll", 0.5),
                "max_restarts": 0 if gate else max_restarts,
                "min_nodes": 0 if gate else min_nodes,
                "spares": spares,
                "resume_from": (
                    f"{records[nodes[0]].container_workspace}/jobs/{spec_id}/output/checkpoints/"
                    f"{Path(checkpoint).name}"
                    if checkpoint and not gate
                    else ""
                ),
            }
        )
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
            if spares:  # a restart makes the table of its nodes on the cluster
                visible.update({node: str(inventory.visible.get(node) or "") for node in spares})
                spec = dataclasses.replace(
                    spec, recovery={"npu_plan": dict(inventory.npu_plan), "visible": visible}
                )
        if gate:
            ping = ping_targets(inventory.npu_plan, nodes, nproc, visible)
    packed: dict[str, Any] = {}
    project_dir = str((cwd / project).resolve()) if project else ""
    if project and kind != "check":
        packed = _pack(
            project_dir, script, runs_dir / base_id, float(max_mb), base_id, inventory.previous, pack
        )
    return Plan(
        spec=spec,
        base_id=base_id,
        run_dir=str(run_dir).rstrip("/"),
        host_dirs={node: f"{records[node].workspace}/jobs/{spec_id}" for node in [*nodes, *spares]},
        script="" if gate or project else str(script_path or ""),
        workdir="" if gate else project_dir,
        resume_checkpoint="" if gate else checkpoint,
        rank_table=rank_table,
        ping=ping,
        bindings={node: records[node].cpu_binding for node in nodes},
        packed=packed,
        preflight=kind == "train" and preflight,
        collect_timeout=int(str(request.get("collect_timeout", 10))),
        detach=detach and not gate,
        wait_for_nodes=wait_for_nodes,
    )


def _record(inventory: Inventory, node: str) -> Any:
    if node not in inventory.records:
        where = f"{inventory.records_dir or RECORDS_DIR}/{node}.json"
        raise PlanError(
            [
                f"{node}: site.yml has not recorded this node ({where} does not exist): bring the cluster up"
                " with `ansible-playbook site.yml`, then run train.yml again"
            ]
        )
    return inventory.records[node]


def _pack(
    project: str,
    script: str,
    job_runs: Path,
    max_mb: float,
    base_id: str,
    previous: Mapping[str, Any],
    pack: bool,
) -> dict[str, Any]:
    archive = job_runs / WORKDIR_ARCHIVE
    before = previous.get("packed") or {}
    if (
        previous.get("base_id") == base_id
        and before.get("workdir") == project
        and before.get("script") == script
        and archive.is_file()
    ):
        return {**before, "reused": True}
    if not pack:
        return {"files": 0, "bytes": 0, "script": script, "workdir": project, "reused": False}
    try:
        summary = workdir.pack(Path(project), script, archive, int(max_mb * 2**20))
    except workdir.WorkdirError as error:
        raise PlanError([f"{error}; nothing was started"]) from None
    return {**summary, "workdir": project, "reused": False}


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


def read_records(directory: Path) -> dict[str, Any]:
    """The node records site.yml wrote (one NODE.json each); {} when there are none yet."""
    records: dict[str, Any] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            records[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise PlanError(
                [f"{path} cannot be read ({error}): run site.yml to record the node again"]
            ) from None
    return records


def load(run_dir: Path) -> dict[str, Any]:
    """A run's plan.json (as :meth:`Plan.to_dict` wrote it)."""
    data = json.loads((run_dir / PLAN_FILE).read_text(encoding="utf-8"))
    return dict(data) if isinstance(data, Mapping) else {}
