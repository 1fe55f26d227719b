"""The job, as one typed object from the plan to the results: :class:`JobSpec`.

The plan (:func:`ddp_cluster.job.plan.make_plan`, called once by ``train.yml`` and ``check.yml`` on the
controller) makes it from what the user asked and what site.yml recorded of the nodes (each node's cluster
network), and ships it as ``JOB/job.json`` to every node. Everything else
comes from the spec: the launcher's command line (:meth:`JobSpec.launch_argv`), the hostfile, the program
every rank runs, whether mpirun's processes are ranks or torchrun agents, the logs' paths
(:mod:`ddp_cluster.job.results`), and the supervisor's bounds (``python -m ddp_cluster.supervise --job-dir
JOB``). Checked in one place (:meth:`JobSpec.from_dict`): an error names the field and what it must
be.

Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ddp_cluster.accelerators import ACCELERATORS, DEVICE_BACKEND
from ddp_cluster.errors import DdpClusterError
from ddp_cluster.job import node_jobs, results, secrets
from ddp_cluster.runtime.distenv import DEFAULT_MASTER_PORT

# Open MPI's daemon wire-up (launch_argv): ssh sessions mpirun keeps in flight, and the fan-out of each level
# of the daemons' tree.
WIREUP_CONCURRENT = 128
WIREUP_RADIX = 64

LAUNCHERS = ("mpirun", "torchrun", "torch_npu_run")
KINDS = ("train", "check", "preflight")
HCCL_INITS = ("rank_table", "master_addr")
JOB_FILE = "job.json"
# The job's files as the plan ships them (job.json, the script or the project, the rank table), unpacked in
# every node's job directory.
BUNDLE_FILE = "job.tar.gz"
# A job's id, matched whole (\A..\Z: a trailing newline is no part of an id); its length is node_jobs.ID_MAX.
NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
PORTS = re.compile(r"^$|^[0-9]+(-[0-9]+)?$")


class JobSpecError(DdpClusterError, ValueError):
    """A field of the job that cannot be used; the message names it."""


# The longest stop_grace: Slurm's KillWait (inventory.slurm, 30 s) less the supervisor's own sweep after it.
STOP_GRACE_MAX = 25.0


def _bounds(minimum: float, maximum: float | None = None, exclusive: bool = False) -> dict[str, Any]:
    """A number field's range (``exclusive``: above ``minimum``, not at it), as field metadata."""
    return {"bounds": {"minimum": minimum, "maximum": maximum, "exclusive": exclusive}}


@dataclass(frozen=True)
class JobSpec:
    """One job: where it runs, what it runs, and its bounds.

    Each field is declared once, here: :meth:`from_dict` checks it by its type (a string, a whole number or a
    number within its ``_bounds``, true or false, a list of strings, a mapping), defaults it to the default
    written here, and requires the fields that have none."""

    id: str
    job_dir: str  # the job's directory in the nodes' containers (/workspace/jobs/<id>)
    nodes: tuple[str, ...] = field(metadata={"non_empty": True})
    nproc_per_node: int = field(metadata=_bounds(1))
    launcher: str
    device: str
    networks: tuple[str, ...]  # the nodes' cluster networks (CIDR): mpirun keeps to them
    timeout: float = field(metadata=_bounds(0, exclusive=True))
    kind: str = "train"
    accelerator: str = "cpu"
    hccl_init: str = "rank_table"
    script: str = ""  # a user's script (its file name is what the nodes have; with a workdir, a path in it)
    workdir: bool = False  # the project directory, unpacked in JOB/workdir, is the ranks' working directory
    script_args: tuple[str, ...] = ()
    resume: bool = False
    master_port: int = field(default=DEFAULT_MASTER_PORT, metadata=_bounds(1, 65535))
    launcher_ports: str = ""
    env: Mapping[str, str] = field(default_factory=dict)  # variable name -> value
    # Variables whose values are secret: names only here; the values reach the ranks through JOB/secrets.json
    # (ddp_cluster.job.secrets).
    secret_env: tuple[str, ...] = ()
    mpirun_args: tuple[str, ...] = ()
    poll: float = field(default=0.5, metadata=_bounds(0, exclusive=True))
    # Recovery (the supervisor's, on the cluster): restarts after a curable failure, the fewest nodes to go on
    # with, the inventory's nodes beyond the job's to take one from, and what an npu rank table is made from.
    max_restarts: int = field(default=0, metadata=_bounds(0))
    # 0: every node of the job (a lost node must be replaced by a spare)
    min_nodes: int = field(default=0, metadata=_bounds(0))
    spares: tuple[str, ...] = ()
    recovery: Mapping[str, Any] = field(default_factory=dict)  # npu: {"npu_plan": ..., "visible": {...}}
    # this attempt's number (0: the first start), set by the supervisor
    restart: int = field(default=0, metadata=_bounds(0))
    resume_from: str = ""  # the checkpoint this attempt resumes from, in the job's directory
    # Trust (the supervisor's): every checkpoint rank 0 completes is copied, checked, to the next
    # ``checkpoint_replicas`` nodes of the job and to ``checkpoint_dir`` (a mount every node has; empty: none)
    # before an older copy is pruned; a node unheard for ``liveness_timeout`` seconds is lost; a job with no
    # progress for ``stall_timeout`` seconds (0: never; ``stall_start_timeout`` before its first) is stopped.
    checkpoint_replicas: int = field(default=1, metadata=_bounds(0))
    checkpoint_dir: str = ""
    liveness_timeout: float = field(default=25.0, metadata=_bounds(6))
    stall_timeout: float = field(default=0.0, metadata=_bounds(0))
    stall_start_timeout: float = field(default=600.0, metadata=_bounds(0, exclusive=True))
    # Watching: the supervisor samples every node (the job's processes, its devices) every
    # ``telemetry_interval`` seconds into JOB/telemetry/NODE.jsonl (0: never).
    telemetry_interval: float = field(default=15.0, metadata=_bounds(0))
    # At most ``results_max_gb`` GiB of the job's files come back to the controller (its output, the newest
    # complete checkpoint, logs); what is over is left on the node and named in the report.
    results_max_gb: float = field(default=256.0, metadata=_bounds(0, exclusive=True))
    # A stop (jobs.yml -e stop, Ctrl-C, scancel) gives every rank SIGTERM, then ``stop_grace`` seconds to end
    # (a script's own handler writes its checkpoint) before the launcher is stopped: at most STOP_GRACE_MAX,
    # which Slurm's KillWait (30 s) bounds for a job scancel stops.
    stop_grace: float = field(default=10.0, metadata=_bounds(1, STOP_GRACE_MAX))
    # This start's own mark (the plan's): the controller accepts only a status that carries it.
    start_id: str = ""

    # --- checking ----------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """The spec of ``data`` (job.json, or the playbook's plan and what the probe found); JobSpecError
        naming the first field that is missing or wrong."""
        if not isinstance(data, Mapping):
            raise JobSpecError(f"a job is a mapping of fields, not {type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise JobSpecError(f"unknown field(s) {', '.join(unknown)}: a job has {', '.join(sorted(known))}")
        for item in fields(cls):
            if item.name not in data and MISSING is item.default is item.default_factory:
                raise JobSpecError(f"{item.name} is missing")
        spec = cls(**{item.name: _read(data, item) for item in fields(cls)})
        spec.check()
        return spec

    def check(self) -> None:
        """The rules between fields; JobSpecError naming the field."""
        if problem := node_jobs.id_problem(self.id, "id"):
            raise JobSpecError(problem)
        if not self.job_dir.startswith("/"):
            raise JobSpecError(f"job_dir={self.job_dir!r} must be an absolute path in the node")
        if len(set(self.nodes)) != len(self.nodes):
            raise JobSpecError(f"nodes={list(self.nodes)} names a node twice")
        if self.launcher not in LAUNCHERS:
            raise JobSpecError(f"launcher={self.launcher!r} is unknown: use {', '.join(LAUNCHERS)}")
        if self.device not in DEVICE_BACKEND:
            raise JobSpecError(f"device={self.device!r} is unknown: use cpu, cuda or npu")
        if self.kind not in KINDS:
            raise JobSpecError(f"kind={self.kind!r} is unknown: use {', '.join(KINDS)}")
        if self.accelerator not in ACCELERATORS:
            raise JobSpecError(f"accelerator={self.accelerator!r} is unknown: use {', '.join(ACCELERATORS)}")
        if self.hccl_init not in HCCL_INITS:
            raise JobSpecError(f"hccl_init={self.hccl_init!r} must be rank_table or master_addr")
        if self.launcher == "torch_npu_run" and self.accelerator != "npu":
            raise JobSpecError("launcher=torch_npu_run needs torch_npu: it is for npu clusters")
        if not PORTS.match(self.launcher_ports):
            raise JobSpecError(
                f"launcher_ports={self.launcher_ports!r} must be a port or a range (29510-29519)"
            )
        if self.workdir and not self.script:
            raise JobSpecError("workdir is set but script is empty: name the script inside the project")
        if self.min_nodes > len(self.nodes):
            raise JobSpecError(
                f"min_nodes={self.min_nodes} is more than the job's {len(self.nodes)} node(s): a job goes on"
                " with fewer nodes, never more"
            )
        if self.checkpoint_dir and not self.checkpoint_dir.startswith("/"):
            raise JobSpecError(
                f"checkpoint_dir={self.checkpoint_dir!r} must be an absolute path inside the node containers"
                " (a mount every node has)"
            )
        if overlap := sorted(set(self.spares) & set(self.nodes)):
            raise JobSpecError(f"spares={list(self.spares)} names the job's own node(s) {', '.join(overlap)}")
        owned = set(self.variables()) - set(self.env)
        if problems := secrets.name_problems(self.secret_env, self.env, owned):
            raise JobSpecError(problems[0])

    # --- what it implies ---------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.nproc_per_node

    @property
    def agents(self) -> bool:
        """True when mpirun's processes are the nodes' torchrun (or torch_npu_run) agents, one per node."""
        return self.launcher != "mpirun"

    @property
    def processes_per_node(self) -> int:
        """mpirun's processes on each node: the ranks, or one agent."""
        return 1 if self.agents else self.nproc_per_node

    def node_of_process(self, process: int) -> str | None:
        """The node mpirun's process ``process`` runs on (mpirun maps by slot, node by node)."""
        index = process // self.processes_per_node
        return self.nodes[index] if 0 <= index < len(self.nodes) else None

    def mpirun_log(self, process: int) -> Path:
        """Where mpirun's process ``process`` writes its output, on its node."""
        return results.mpirun_log(self.job_dir, process)

    def hostfile(self) -> str:
        lines = [f"# job {self.id}, {self.nproc_per_node} slot(s) per node"]
        return "\n".join([*lines, *(f"{node} slots={self.nproc_per_node}" for node in self.nodes)]) + "\n"

    def variables(self) -> dict[str, str]:
        """What every rank gets from the launcher (``-x``), the user's ``env`` last."""
        variables = {
            "MASTER_ADDR": self.nodes[0],
            "MASTER_PORT": str(self.master_port),
            "PYTHONUNBUFFERED": "1",
            "DDP_JOB_ID": self.id,
            "DDP_JOB_DIR": self.job_dir,
            "DDP_DEVICE": self.device,
            "DDP_BACKEND": DEVICE_BACKEND[self.device],
            "DDP_LAUNCHER": self.launcher,
            # How many times the supervisor restarted the job (0 at the first start), and the checkpoint it
            # resumes from (empty: none); a user's script reads them to resume.
            "DDP_RESTART_COUNT": str(self.restart),
            "DDP_MAX_RESTARTS": str(self.max_restarts),
            "DDP_RESUME_FROM": self.resume_from,
            # Where TensorBoard's event files go (the entrypoint writes there; a user's script is pointed
            # there): under the job's output, so the collect and jobs.yml -e sync=ID bring them in.
            "DDP_TENSORBOARD_DIR": f"{self.job_dir}/output/tensorboard",
        }
        if self.accelerator == "npu":
            # CANN's and HCCL's logs (plog, device logs) go into the job directory, so they come back with the
            # job.
            variables["ASCEND_PROCESS_LOG_PATH"] = f"{self.job_dir}/ascend"
            if self.hccl_init == "rank_table":
                variables["RANK_TABLE_FILE"] = f"{self.job_dir}/rank_table.json"
        return variables | {str(name): str(value) for name, value in self.env.items()}

    def working_directory(self) -> str:
        """The ranks' working directory: the project's (workdir), else the job's."""
        return f"{self.job_dir}/workdir" if self.workdir else self.job_dir

    def program(self) -> list[str]:
        """What each rank runs, after ``python`` (``-m MODULE ARGS``): the health gate, a user's script
        through ``ddp_cluster.runtime.run`` (torchrun-style variables under mpirun, and the device check),
        or the
        entrypoint."""
        args = list(self.script_args)
        if self.kind != "train":
            return ["-m", "ddp_cluster.gate", "--output-dir", f"{self.job_dir}/output", *args]
        if self.script:
            name = self.script if self.workdir else self.script.rsplit("/", 1)[-1]
            return ["-m", "ddp_cluster.run", f"{self.working_directory()}/{name}", *args]
        resume = ["--resume"] if self.resume else []
        return ["-m", "ddp_cluster.train", "--output-dir", f"{self.job_dir}/output", *resume, *args]

    def launch_argv(self) -> list[str]:
        """The launcher's argv, started on the first node. Every rank's command line holds ``job_dir/``.

        mpirun starts one process per slot. torchrun (and torch_npu_run) is fanned out by mpirun too, one
        agent per node, so that a failing node's agent makes mpirun stop the agents of every other node
        (orte_abort_on_non_zero_status). ``networks`` keep mpirun's traffic on the cluster network, each node
        on its own interface; ``launcher_ports`` pins the ports mpirun's daemons listen on, so that a firewall
        can let exactly those through. Per-node settings (interfaces, HCCL_IF_IP) come from each node's own
        environment file. The ranks' variables (:meth:`variables`, ``env`` among them) are named here, ``-x
        NAME``, their values in mpirun's own environment (the supervisor's launch): a value on a command
        line is anyone's to read in ``ps``."""
        if not self.networks:
            raise JobSpecError("no cluster network: the nodes' probe found no address on their interface")
        included = ",".join(self.networks)
        argv = ["mpirun", "--hostfile", f"{self.job_dir}/hostfile", "--bind-to", "none"]
        argv += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", included]
        argv += ["--mca", "oob_tcp_if_include", included, "--mca", "orte_abort_on_non_zero_status", "1"]
        if self.launcher_ports:
            argv += ["--mca", "oob_tcp_static_ipv4_ports", self.launcher_ports]
        # The daemons' wire-up, as Open MPI 4.1 does it by default, pinned against a site's
        # openmpi-mca-params.conf: mpirun starts its direct children over ssh, WIREUP_CONCURRENT at a time,
        # and each daemon starts its own children (tree spawn; every node may ssh to every other: the mesh),
        # WIREUP_RADIX per level, so 1152 nodes are two levels deep (docs/scale.md).
        argv += [
            "--mca",
            "plm_rsh_no_tree_spawn",
            "0",
            "--mca",
            "plm_rsh_num_concurrent",
            str(WIREUP_CONCURRENT),
        ]
        argv += ["--mca", "routed_radix", str(WIREUP_RADIX)]
        # Each rank's output in a file on its own node, not also sent to mpirun on the first node (":nocopy"),
        # which would carry every rank's lines over its daemons' connections and into launcher.log: failures
        # are read from mpirun's own lines there and from the failing rank's file, on its node.
        argv += ["--output-filename", f"{self.job_dir}/{results.LOGS}:nocopy", "--merge-stderr-to-stdout"]
        argv += ["--wdir", self.working_directory()]
        argv += ["-x", "PATH", "-x", "OMPI_ALLOW_RUN_AS_ROOT", "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"]
        for name in sorted(self.variables()):
            argv += ["-x", name]
        if not self.agents:
            argv += ["-np", str(self.world_size), "--map-by", "slot", *self.mpirun_args, "python"]
            return argv + self.program()
        argv += ["-np", str(len(self.nodes)), "--map-by", "ppr:1:node", *self.mpirun_args]
        argv += ["python", "-m", "ddp_cluster.supervisor.agent", "--runner", self.launcher]
        argv += ["--nnodes", str(len(self.nodes)), "--nproc-per-node", str(self.nproc_per_node)]
        argv += ["--master-addr", self.nodes[0], "--master-port", str(self.master_port)]
        argv += ["--log-dir", f"{self.job_dir}/{results.LOGS}/torchrun", "--tee", "3"]
        return argv + self.program()  # "-m MODULE ...": torchrun's own -m, as python's

    # --- the file ----------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["env"] = dict(self.env)
        data["recovery"] = dict(self.recovery)
        return data

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


def load(path: Path) -> JobSpec:
    """The spec in ``path`` (job.json); JobSpecError naming the file and what is wrong."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise JobSpecError(f"cannot read the job from {path}: {error}") from error
    try:
        return JobSpec.from_dict(data)
    except JobSpecError as error:
        raise JobSpecError(f"{path}: {error}") from error


def _read(data: Mapping[str, Any], item: Field[Any]) -> Any:
    """The value of field ``item`` in ``data``, checked by the field's type (its default when absent)."""
    default = None if item.default is MISSING else item.default
    if item.type == "str":
        return _text(data, item.name, default)
    if item.type in ("int", "float"):
        kind = int if item.type == "int" else float
        return _number(data, item.name, kind, default=default, **item.metadata["bounds"])
    if item.type == "bool":
        return _flag(data, item.name)
    if item.type == "tuple[str, ...]":
        return _texts(data, item.name, allow_empty=not item.metadata.get("non_empty"))
    if item.type == "Mapping[str, str]":
        return _env(data, item.name)
    if item.type == "Mapping[str, Any]":
        return _mapping(data, item.name)
    raise TypeError(f"JobSpec.{item.name}: no check for a field of type {item.type}")


def _text(data: Mapping[str, Any], name: str, default: str | None = None) -> str:
    value = data.get(name, default)
    if not isinstance(value, str) or (default is None and not value):
        raise JobSpecError(
            f"{name}={value!r} must be a non-empty string"
            if default is None
            else f"{name}={value!r} must be a string"
        )
    return value


def _texts(data: Mapping[str, Any], name: str, allow_empty: bool = False) -> tuple[str, ...]:
    value = data.get(name, [])
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise JobSpecError(f"{name}={value!r} must be a list of strings")
    items = tuple(str(item) for item in value)
    if not allow_empty and (not items or not all(items)):
        raise JobSpecError(f"{name}={list(value)!r} must list at least one non-empty name")
    return items


def _number(
    data: Mapping[str, Any],
    name: str,
    kind: type[int] | type[float],
    minimum: float,
    maximum: float | None = None,
    exclusive: bool = False,
    default: float | None = None,
) -> Any:
    value = data.get(name, default)
    try:
        number = kind(value)
        if kind is int and float(value) != number:
            raise ValueError
    except (TypeError, ValueError) as error:
        raise JobSpecError(f"{name}={value!r} must be a {'whole ' if kind is int else ''}number") from error
    low = number <= minimum if exclusive else number < minimum
    if low or (maximum is not None and number > maximum):
        bound = f"above {minimum:g}" if exclusive else f"at least {minimum:g}"
        raise JobSpecError(
            f"{name}={value!r} must be {bound}" + (f" and at most {maximum:g}" if maximum else "")
        )
    return number


def _flag(data: Mapping[str, Any], name: str) -> bool:
    value = data.get(name, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0", ""):
        return value.lower() in ("true", "yes", "1")
    raise JobSpecError(f"{name}={value!r} must be true or false")


def _mapping(data: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name) or {}
    if not isinstance(value, Mapping):
        raise JobSpecError(f"{name}={value!r} must be a mapping")
    return dict(value)


def _env(data: Mapping[str, Any], name: str) -> dict[str, str]:
    value = data.get(name) or {}
    if not isinstance(value, Mapping):
        raise JobSpecError(f"{name}={value!r} must map variable names to values")
    for variable in value:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(variable)):
            raise JobSpecError(f"{name}: {variable!r} is not a variable name")
    return {str(variable): str(item) for variable, item in value.items()}
