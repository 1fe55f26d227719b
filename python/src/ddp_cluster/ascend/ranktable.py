"""HCCL rank tables (version 1.0) from a device-IP plan.

The layout is the one the vendor's ``hccl_tools.py`` writes (the MindOCR distributed training manual)::

    {
        "version": "1.0",
        "server_count": "1",
        "server_list": [
            {
                "server_id": "127.0.0.1",
                "device": [{"device_id": "0", "device_ip": "192.168.100.101", "rank_id": "0"}, ...],
                "host_nic_ip": "reserve"
            }
        ],
        "status": "completed"
    }

Every value is a string. The container training manual's two-host table has the same keys less
``host_nic_ip`` and says "主节点的device信息需配置在第一个device中 ... rank_id需要一直升序": the master server
comes first and rank ids ascend through the servers in that order. ``device_id`` is the device's position
in the plan (what ``hccn_tool -i`` and ``DEVICE_ID`` take), ``server_id`` the server's host address.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddp_cluster.ascend.ipplan import (
    IpPlan,
    Server,
    Violation,
    check_plan,
    errors,
    plan_from_dict,
    read_plan_or_report,
)
from ddp_cluster.errors import DdpClusterError

RANK_TABLE_VERSION = "1.0"
HOST_NIC_IP_RESERVED = "reserve"  # what hccl_tools.py writes (the MindOCR distributed training manual)


# A ValueError too, as IpPlanError: the job's planner takes either for a bad value.
class RankTableError(DdpClusterError, ValueError):
    """The rank table cannot be made: an invalid plan or an unknown master."""

    def __init__(self, message: str, violations: list[Violation] | None = None) -> None:
        super().__init__(message)
        self.violations = violations or []


def order_servers(plan: IpPlan, master: str | None = None) -> list[Server]:
    """The plan's servers with the master first, the others in plan order. master: host_ip or host name."""
    servers = list(plan.servers)
    if master is None:
        return servers
    for index, server in enumerate(servers):
        if master in (server.host_ip, server.host):
            return [servers[index], *servers[:index], *servers[index + 1 :]]
    known = ", ".join(
        server.host_ip if not server.host else f"{server.host} ({server.host_ip})" for server in servers
    )
    raise RankTableError(f"master {master!r} is not a server of the plan; servers: {known}")


def rank_table(
    plan: IpPlan, master: str | None = None, host_nic_ip: str | None = HOST_NIC_IP_RESERVED
) -> dict[str, Any]:
    """The version 1.0 rank table of a valid plan; RankTableError (with .violations) for an invalid one.

    master names the server whose devices take ranks 0..n-1 (default: the plan's first server).
    host_nic_ip is written per server as hccl_tools.py does; None leaves the key out (the container training
    manual's form).
    """
    _check(plan)
    servers = order_servers(plan, master)
    return _table([(server, range(len(server.device_ips))) for server in servers], host_nic_ip)


def _check(plan: IpPlan) -> None:
    """RankTableError (with .violations) when the plan breaks a rule that blocks it."""
    blocking = errors(check_plan(plan))
    if blocking:
        lines = "\n".join(f"  {violation}" for violation in blocking)
        raise RankTableError(f"the plan breaks {len(blocking)} rule(s):\n{lines}", blocking)


def _table(placed: Sequence[tuple[Server, Sequence[int]]], host_nic_ip: str | None) -> dict[str, Any]:
    """The version 1.0 table of servers in rank order, each with the devices its ranks use (ranks ascending
    across servers, as hccl_tools.py numbers them)."""
    server_list: list[dict[str, Any]] = []
    rank = 0
    for server, devices in placed:
        entries = []
        for device in devices:
            entries.append(
                {"device_id": str(device), "device_ip": server.device_ips[device], "rank_id": str(rank)}
            )
            rank += 1
        entry: dict[str, Any] = {"server_id": server.host_ip, "device": entries}
        if host_nic_ip is not None:
            entry["host_nic_ip"] = host_nic_ip
        server_list.append(entry)
    return {
        "version": RANK_TABLE_VERSION,
        "server_count": str(len(server_list)),
        "server_list": server_list,
        "status": "completed",
    }


def job_devices(visible: str | Sequence[int] | None, nproc_per_node: int, planned: int) -> list[int]:
    """The devices a job's processes use on one server: the first ``nproc_per_node`` of the visible ones.

    ``visible`` is ASCEND_RT_VISIBLE_DEVICES (``"4,5,6,7"``) or a list; empty or None: every planned device.
    Local rank i uses the i-th visible device, so that is what the table lists for it (physical device ids, as
    hccl_tools.py's ``--visible_devices`` writes them). Atlas training servers keep 2 or 4 devices inside one
    group of four (0-3 or 4-7; the Ascend multi-node checklist); :func:`job_rank_table` checks that rule.
    """
    if visible is None or (isinstance(visible, str) and not visible.strip()):
        ids = list(range(planned))
    elif isinstance(visible, str):
        try:
            ids = [int(part) for part in visible.split(",") if part.strip()]
        except ValueError:
            raise RankTableError(
                f"visible devices {visible!r} are not a comma-separated list of device ids"
            ) from None
    else:
        ids = [int(part) for part in visible]
    if len(set(ids)) != len(ids):
        raise RankTableError(f"visible devices {ids} name a device twice")
    beyond = [device for device in ids if not 0 <= device < planned]
    if beyond:
        raise RankTableError(
            f"visible devices {beyond} are not among the {planned} planned device(s) 0-{planned - 1}"
        )
    if nproc_per_node < 1 or nproc_per_node > len(ids):
        raise RankTableError(
            f"{nproc_per_node} process(es) per node but {len(ids)} visible device(s) {ids}: "
            "one process per NPU"
        )
    return ids[:nproc_per_node]


def job_rank_table(
    plan: IpPlan,
    nodes: Sequence[str],
    nproc_per_node: int,
    visible: Mapping[str, str | Sequence[int] | None] | None = None,
    host_nic_ip: str | None = HOST_NIC_IP_RESERVED,
) -> dict[str, Any]:
    """The rank table of one job: its own servers in job order (the first is the master, rank 0), and on
    each the devices its processes use (:func:`job_devices`), ranks ascending.

    ``nodes`` are host names or addresses of the plan; ``visible`` maps a node to its
    ASCEND_RT_VISIBLE_DEVICES. The whole plan is checked first (device addresses of servers outside the job
    still must not clash); RankTableError names what does not fit.
    """
    _check(plan)
    if not nodes:
        raise RankTableError("the job has no nodes")
    if len(set(nodes)) != len(nodes):
        raise RankTableError(f"the job names a node twice: {', '.join(nodes)}")
    by_name = {name: server for server in plan.servers for name in (server.host, server.host_ip) if name}
    placed: list[tuple[Server, Sequence[int]]] = []
    for node in nodes:
        server = by_name.get(node)
        if server is None:
            raise RankTableError(
                f"node {node!r} of the job is not a server of the plan ({', '.join(by_name)})"
            )
        try:
            devices = job_devices((visible or {}).get(node), nproc_per_node, len(server.device_ips))
        except RankTableError as error:
            raise RankTableError(f"node {node}: {error}") from None
        if plan.product == "atlas-training" and len(devices) in (2, 4):
            groups = {device // 4 for device in devices}
            if len(groups) > 1:
                raise RankTableError(
                    f"node {node}: devices {devices} span both groups of four (0-3 and 4-7); Atlas training "
                    "servers run 2 or 4 processes inside one group: set ASCEND_RT_VISIBLE_DEVICES accordingly"
                )
        placed.append((server, devices))
    return _table(placed, host_nic_ip)


def job_rank_table_dict(
    data: Any, nodes: Sequence[str], nproc_per_node: int, visible: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """job_rank_table for plain plan data, as an Ansible filter plugin calls it."""
    return job_rank_table(plan_from_dict(data), list(nodes), int(nproc_per_node), visible)


def dumps(table: dict[str, Any]) -> str:
    """The JSON text, indented like hccl_tools.py's output, with a final newline."""
    return json.dumps(table, indent=4) + "\n"


def _write_atomically(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddp-cluster rank-table",
        description="Print the HCCL rank table (version 1.0) of a device-IP plan. "
        "Exit 1 if the plan breaks a rule, 2 on bad input.",
    )
    parser.add_argument("plan", metavar="PLAN.yml")
    parser.add_argument(
        "--master", help="host_ip or host name of the server that takes rank 0 (default: the first)"
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write the table to FILE instead of stdout")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    prog = "ddp-cluster rank-table"
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    plan = read_plan_or_report(args.plan, prog)
    if plan is None:
        return 2
    try:
        table = rank_table(plan, master=args.master)
    except RankTableError as exc:
        print(f"{prog}: {args.plan}: {exc}", file=sys.stderr)
        return 1 if exc.violations else 2
    text = dumps(table)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        _write_atomically(Path(args.output), text)
    except OSError as exc:
        print(f"{prog}: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    ranks = sum(len(server["device"]) for server in table["server_list"])
    print(f"{prog}: wrote {args.output} ({table['server_count']} server(s), {ranks} ranks)", file=sys.stderr)
    return 0
