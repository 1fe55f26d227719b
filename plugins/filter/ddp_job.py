"""Filters of the job launcher: argument splitting, the node probe, the launcher's command line, the job's rank
table."""

from __future__ import annotations

import ipaddress
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

try:
    from ddp_cluster import ranktable
except ImportError:  # a checkout without the package installed: use the sources next to this plugin
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "src"))
    from ddp_cluster import ranktable

LAUNCHERS = ("mpirun", "torchrun", "torch_npu_run")
# The torch device of each accelerator, and the collective backend that goes with a device.
ACCELERATOR_DEVICE = {"cpu": "cpu", "gpu": "cuda", "npu": "npu"}
DEVICE_BACKEND = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


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


def ddp_job_probe(text: Any) -> dict[str, Any]:
    """What the node probe printed (``key: value`` lines): the node's interface, its IPv4 addresses on it (CIDR
    form) and whatever listens on the master port."""
    probe: dict[str, Any] = {"interface": "", "addresses": [], "listening": ""}
    for line in str(text or "").splitlines():
        key, _, value = line.partition(": ")
        if key == "interface":
            probe["interface"] = value.strip()
        elif key == "address" and value.strip():
            probe["addresses"].append(value.strip())
        elif key == "listening":
            probe["listening"] = (probe["listening"] + "\n" + value.strip()).strip()
    return probe


def ddp_job_networks(addresses: Sequence[Any]) -> list[str]:
    """The networks (CIDR) of the job's nodes' cluster addresses, in order, each once: what mpirun's
    ``btl_tcp_if_include`` / ``oob_tcp_if_include`` take, so that every node uses its own interface, whatever
    its name."""
    networks: list[str] = []
    for address in addresses:
        try:
            network = str(ipaddress.ip_interface(str(address)).network)
        except ValueError as error:
            raise AnsibleFilterError(f"{address!r} is not an address with a prefix (10.0.0.5/24): {error}") from error
        if network not in networks:
            networks.append(network)
    return networks


def ddp_job_rank_table(
    plan: Mapping[str, Any], nodes: Sequence[str], nproc_per_node: Any, visible: Mapping[str, Any] | None = None
) -> str:
    """The job's own HCCL rank table (JSON text): its nodes in job order, the first as master, and on each the
    first ``nproc_per_node`` visible devices (see :func:`ddp_cluster.ranktable.job_rank_table`)."""
    try:
        table = ranktable.job_rank_table_dict(plan, [str(node) for node in nodes], int(nproc_per_node), visible)
    except (ValueError, TypeError) as error:
        raise AnsibleFilterError(f"the job's rank table cannot be made: {error}") from error
    return ranktable.dumps(table)


def ddp_job_visible_devices(hostvars: Mapping[str, Any], nodes: Sequence[str]) -> dict[str, str]:
    """Each node's ASCEND_RT_VISIBLE_DEVICES from its ``node_container_env`` (empty: every device)."""
    visible: dict[str, str] = {}
    for node in nodes:
        variables = hostvars.get(str(node), {})
        env = variables.get("node_container_env") if hasattr(variables, "get") else None
        value = env.get("ASCEND_RT_VISIBLE_DEVICES", "") if isinstance(env, Mapping) else ""
        visible[str(node)] = str(value or "")
    return visible


def ddp_launch_argv(
    plan: Mapping[str, Any],
    job_dir: str,
    networks: Sequence[str],
    env: Mapping[str, Any] | None = None,
    mpirun_args: Sequence[str] = (),
    launcher_ports: str = "",
) -> list[str]:
    """The launcher's argv, started on the first node. Every rank's command line holds ``job_dir/``.

    mpirun starts one process per slot. torchrun (and torch_npu_run) is fanned out by mpirun too, one agent per
    node, so that a failing node's agent makes mpirun stop the agents of every other node
    (orte_abort_on_non_zero_status). ``networks`` (CIDR) keep mpirun's traffic on the cluster network, each node
    on its own interface. Per-node settings (interfaces, HCCL_IF_IP) come from each node's own environment file.
    ``launcher_ports`` (a range such as 29510-29519) pins the ports mpirun's daemons listen on, so that a
    firewall can let exactly those through.

    Every rank gets the job's device (``DDP_DEVICE``: cpu, cuda or npu, and ``DDP_BACKEND``), ``DDP_LAUNCHER``,
    and on npu ``ASCEND_PROCESS_LOG_PATH`` in the job directory and, in rank-table mode, the job's own
    ``RANK_TABLE_FILE``. A user's script runs through ``ddp_cluster.run``, which checks the device first.
    """
    nodes = [str(node) for node in plan["nodes"]]
    nproc = int(plan["nproc_per_node"])
    master_port = str(plan["master_port"])
    launcher = str(plan["launcher"])
    if launcher not in LAUNCHERS:
        raise AnsibleFilterError(f"launcher={launcher!r} is unknown: use {', '.join(LAUNCHERS)}")
    device = str(plan.get("device") or "cpu")
    if device not in DEVICE_BACKEND:
        raise AnsibleFilterError(f"device={device!r} is unknown: use cpu, cuda or npu")
    if not networks:
        raise AnsibleFilterError("no cluster network: the nodes' probe found no address on their interface")
    script = str(plan.get("script") or "")
    args = [str(arg) for arg in plan.get("script_args") or []]
    variables = {
        "MASTER_ADDR": nodes[0],
        "MASTER_PORT": master_port,
        "PYTHONUNBUFFERED": "1",
        "DDP_JOB_ID": str(plan["id"]),
        "DDP_JOB_DIR": job_dir,
        "DDP_DEVICE": device,
        "DDP_BACKEND": DEVICE_BACKEND[device],
        "DDP_LAUNCHER": launcher,
    }
    if plan.get("accelerator") == "npu":
        # CANN's and HCCL's logs (plog, device logs) go into the job directory, so they come back with the job.
        variables["ASCEND_PROCESS_LOG_PATH"] = f"{job_dir}/ascend"
        if plan.get("hccl_init", "rank_table") == "rank_table":
            variables["RANK_TABLE_FILE"] = f"{job_dir}/rank_table.json"
    variables |= {str(name): str(value) for name, value in (env or {}).items()}
    included = ",".join(str(network) for network in networks)

    argv = ["mpirun", "--hostfile", f"{job_dir}/hostfile", "--bind-to", "none"]
    argv += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", included]
    argv += ["--mca", "oob_tcp_if_include", included, "--mca", "orte_abort_on_non_zero_status", "1"]
    if launcher_ports:
        argv += ["--mca", "oob_tcp_static_ipv4_ports", str(launcher_ports)]
    # A project directory (workdir) is the ranks' working directory, as it is the user's on their own machine.
    workdir = f"{job_dir}/workdir" if plan.get("workdir") else ""
    argv += ["--output-filename", f"{job_dir}/logs", "--merge-stderr-to-stdout", "--wdir", workdir or job_dir]
    argv += ["-x", "PATH", "-x", "OMPI_ALLOW_RUN_AS_ROOT", "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"]
    for name, value in sorted(variables.items()):
        argv += ["-x", f"{name}={value}"]

    if plan.get("kind", "train") != "train":
        # The health gate (check.yml, preflight): the same launcher, environment and backend as a job.
        program = ["-m", "ddp_cluster.gate", "--output-dir", f"{job_dir}/output", *args]
    elif script:
        # Through ddp_cluster.run: torchrun-style variables under mpirun, and the device check under every launcher.
        path = f"{workdir}/{script}" if workdir else f"{job_dir}/{script.rsplit('/', 1)[-1]}"
        program = ["-m", "ddp_cluster.run", path, *args]
    else:
        resume = ["--resume"] if plan.get("resume_checkpoint") else []
        program = ["-m", "ddp_cluster.train", "--output-dir", f"{job_dir}/output", *resume, *args]

    if launcher == "mpirun":
        argv += ["-np", str(len(nodes) * nproc), "--map-by", "slot", *mpirun_args, "python"]
        return argv + program
    argv += ["-np", str(len(nodes)), "--map-by", "ppr:1:node", *mpirun_args]
    argv += ["python", "-m", "ddp_cluster.torchrun_agent", "--runner", launcher, "--nnodes", str(len(nodes))]
    argv += ["--nproc-per-node", str(nproc), "--master-addr", nodes[0], "--master-port", master_port]
    argv += ["--log-dir", f"{job_dir}/logs/torchrun", "--tee", "3"]
    return argv + program  # "-m MODULE ...": torchrun's own -m, as python's


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def ddp_report_text(lines: Sequence[object]) -> str:
    """Lines joined for a message that the YAML callback prints as a block, each line as it is: a tab, a control
    character or a trailing space anywhere makes it fall back to one quoted, folded line with \\n escapes."""
    return "\n".join(CONTROL.sub("", str(line).expandtabs(4)).rstrip() for line in lines)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "ddp_split_args": ddp_split_args,
            "ddp_report_text": ddp_report_text,
            "ddp_job_probe": ddp_job_probe,
            "ddp_job_networks": ddp_job_networks,
            "ddp_job_rank_table": ddp_job_rank_table,
            "ddp_job_visible_devices": ddp_job_visible_devices,
            "ddp_launch_argv": ddp_launch_argv,
        }
