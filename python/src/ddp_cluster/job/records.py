"""What site.yml recorded of each node on the controller, read by every job's plan.

The containers stage writes one ``NODE.json`` per node under the cluster's controller directory
(``~/.ddp-cluster/<cluster>/nodes/``): the node's cluster interface, its address there, its workspace and its
CPU binding, so that a job probes nothing that does not change between jobs. :class:`NodeRecord` is one,
checked; :func:`read_records` reads them all; :func:`node_record` names the fix when a node has none.

Beside each, site.yml's last stage writes ``NODE.state.json``: whether the run converged that node
(``"converged"``) and if not why (``"reason"``, ``"at"``). A server that failed or could not be reached
mid-run is left out and the others converge; :func:`unconverged` names such nodes, so that a job passes over
them until site.yml converges them again.

Standard library only.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_cluster.job.request import PlanError

RECORDS_DIR = "nodes"  # under the cluster's controller directory: one NODE.json per node
STATE_SUFFIX = ".state.json"  # beside it: NODE.state.json, what site.yml's last run did on the node
NOT_CONVERGED = "not converged by the last site.yml"  # how a plan's passed-over node starts its why


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


def node_record(records: Mapping[str, Any], node: str, records_dir: str = "") -> NodeRecord:
    """The record of ``node``; PlanError with the fix when site.yml has not recorded it."""
    if node not in records:
        where = f"{records_dir or RECORDS_DIR}/{node}.json"
        raise PlanError(
            [
                f"{node}: site.yml has not recorded this node ({where} does not exist): bring the cluster up"
                " with `ansible-playbook site.yml`, then run train.yml again"
            ]
        )
    return NodeRecord.from_dict(node, records[node])


def read_records(directory: Path) -> dict[str, Any]:
    """The node records site.yml wrote (one NODE.json each); {} when there are none yet."""
    records: dict[str, Any] = {}
    for path in sorted(directory.glob("*.json")):
        if path.name.endswith(STATE_SUFFIX):
            continue
        try:
            records[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise PlanError(
                [f"{path} cannot be read ({error}): run site.yml to record the node again"]
            ) from None
    return records


def unconverged(directory: Path) -> dict[str, str]:
    """The nodes whose last site.yml did not converge them (their ``NODE.state.json`` says ``"converged":
    false``), node -> why, in name order. A node with no state file (recorded before site.yml wrote them), or
    one that cannot be read, is not passed over: its record and its own check before the start decide."""
    found: dict[str, str] = {}
    for path in sorted(directory.glob(f"*{STATE_SUFFIX}")):
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(state, Mapping) and state.get("converged") is False:
            why = str(state.get("reason") or "").strip() or "no reason recorded"
            at = str(state.get("at") or "").strip()
            found[path.name.removesuffix(STATE_SUFFIX)] = f"{why} (site.yml, {at})" if at else why
    return found


def unconverged_reason(why: str) -> str:
    """How the plan names a node it passed over because site.yml did not converge it."""
    return f"{NOT_CONVERGED}: {why}; run site.yml again for it"
