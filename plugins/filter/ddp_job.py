"""Filters of the job launcher: shell-style argument splitting and the launcher's command line."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError


def ddp_split_args(value: Any) -> list[str]:
    """A script's arguments as a list: a list stays, a string is split the way a shell would."""
    if value is None or value == "":
        return []
    if isinstance(value, (list, tuple)):
        return [str(part) for part in value]
    try:
        return shlex.split(str(value))
    except ValueError as error:
        raise AnsibleFilterError(f"script_args={value!r} cannot be split like a shell would: {error}") from error


def ddp_launch_argv(
    plan: Mapping[str, Any],
    job_dir: str,
    interface: str,
    env: Mapping[str, Any] | None = None,
    mpirun_args: Sequence[str] = (),
    launcher_ports: str = "",
) -> list[str]:
    """The launcher's argv, started on the first node. Every rank's command line holds ``job_dir/``.

    mpirun starts one process per slot. torchrun is fanned out by mpirun too, one agent per node, so that a
    failing node's agent makes mpirun stop the agents of every other node (orte_abort_on_non_zero_status).
    Per-node settings (interfaces, HCCL_IF_IP) come from each node's own environment file, not from here.
    ``launcher_ports`` (a range such as 29510-29519) pins the ports mpirun's daemons listen on, so that a
    firewall can let exactly those through.
    """
    nodes = [str(node) for node in plan["nodes"]]
    nproc = int(plan["nproc_per_node"])
    master_port = str(plan["master_port"])
    script = str(plan.get("script") or "")
    args = [str(arg) for arg in plan.get("script_args") or []]
    variables = {
        "MASTER_ADDR": nodes[0],
        "MASTER_PORT": master_port,
        "PYTHONUNBUFFERED": "1",
        "DDP_JOB_ID": str(plan["id"]),
        "DDP_JOB_DIR": job_dir,
    } | {str(name): str(value) for name, value in (env or {}).items()}

    argv = ["mpirun", "--hostfile", f"{job_dir}/hostfile", "--bind-to", "none"]
    argv += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", interface]
    argv += ["--mca", "oob_tcp_if_include", interface, "--mca", "orte_abort_on_non_zero_status", "1"]
    if launcher_ports:
        argv += ["--mca", "oob_tcp_static_ipv4_ports", str(launcher_ports)]
    argv += ["--output-filename", f"{job_dir}/logs", "--merge-stderr-to-stdout", "--wdir", job_dir]
    argv += ["-x", "PATH", "-x", "OMPI_ALLOW_RUN_AS_ROOT", "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"]
    for name, value in sorted(variables.items()):
        argv += ["-x", f"{name}={value}"]

    if script:
        program = [f"{job_dir}/{script.rsplit('/', 1)[-1]}", *args]
    else:
        resume = ["--resume"] if plan.get("resume_checkpoint") else []
        program = ["-m", "ddp_cluster.train", "--output-dir", f"{job_dir}/output", *resume, *args]

    if plan["launcher"] == "mpirun":
        argv += ["-np", str(len(nodes) * nproc), "--map-by", "slot", *mpirun_args, "python"]
        return argv + (["-m", "ddp_cluster.run", *program] if script else program)
    if plan["launcher"] == "torchrun":
        argv += ["-np", str(len(nodes)), "--map-by", "ppr:1:node", *mpirun_args]
        argv += ["python", "-m", "ddp_cluster.torchrun_agent", "--nnodes", str(len(nodes))]
        argv += ["--nproc-per-node", str(nproc), "--master-addr", nodes[0], "--master-port", master_port]
        argv += ["--log-dir", f"{job_dir}/logs/torchrun", "--tee", "3"]
        return argv + program
    raise AnsibleFilterError(f"launcher={plan['launcher']!r} is unknown: use mpirun or torchrun")


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"ddp_split_args": ddp_split_args, "ddp_launch_argv": ddp_launch_argv}
