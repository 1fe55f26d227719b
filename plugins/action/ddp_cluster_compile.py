"""Action ``ddp_cluster_compile``: the cluster compiled once on the controller
(:func:`ddp_cluster.inventory.compiled.compile_cluster`), run_once, delegated to localhost. Reads each node's
variables once (``hostvars.raw_get``), writes ~/.ddp-cluster/<cluster>/compiled/ where its content differs (a
controller cache, check mode too) and returns the fact ``ddp_cluster``; never reports a change.

    - ddp_cluster_compile: {}  # nodes: groups['nodes']; the rest from the inventory (cluster_name, ...)
      run_once: true
      delegate_to: localhost

Args (each optional): nodes, cluster, controller_dir, ssh_port, host_key_type, npu ({product, netmask,
detect_ips, gateways}; default on npu clusters: npu_product, npu_device_netmask, npu_device_detect_ips,
npu_device_gateways; null elsewhere).
"""

from __future__ import annotations

import site
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.image.tree import tree_hash
from ddp_cluster.inventory import compiled

REPO = Path(__file__).resolve().parents[2]
# What a change of code must converge again: the image tag's inputs and everything that runs the roles.
CODE = (
    "roles", "plugins", "playbooks", "python/src", "python/pyproject.toml", "python/README.md", "docker",
    ".dockerignore", "site.yml",
)  # fmt: skip


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("nodes", "cluster", "controller_dir", "ssh_port", "host_key_type", "npu"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        variables, args = task_vars or {}, self._task.args

        def value(name: str, default: Any = None) -> Any:
            return self._templar.template(variables[name]) if name in variables else default

        cluster = str(args.get("cluster") or value("cluster_name"))
        root = Path(
            args.get("controller_dir")
            or value("cluster_controller_dir")
            or Path.home() / ".ddp-cluster" / cluster
        )
        nodes = [str(node) for node in args.get("nodes") or variables["groups"]["nodes"]]
        npu = args.get("npu", {} if value("cluster_accelerator") == "npu" else None)
        settings = compiled.NpuSettings.of(npu, value)
        hostvars = variables["hostvars"]
        manager = hostvars._variable_manager  # what this run set on a node is not the inventory's say

        def run_set(node: str) -> set[str]:
            try:
                facts = manager._fact_cache.get(node)
            except KeyError:
                facts = {}
            return {
                *manager._nonpersistent_fact_cache.get(node, {}),
                *facts,
                *(f"ansible_{k}" for k in facts),
            }

        raw = compiled.read_nodes(nodes, hostvars.raw_get, lambda node, name: hostvars[node][name], run_set)
        try:
            done = compiled.compile_cluster(
                raw,
                nodes,
                cluster=cluster,
                records_dir=root / "nodes",
                npu_settings=settings,
                slurm_settings=compiled.SlurmSettings.of(value),
                code=tree_hash(str(REPO), [term for term in CODE if (REPO / term).exists()]),
                ssh_port=int(args.get("ssh_port") or value("cluster_ssh_port", 22)),
                host_key_type=str(args.get("host_key_type") or value("ssh_mesh_host_key_type", "ed25519")),
            )
            done.write()
        except DdpClusterError as error:
            return {**result, "failed": True, "msg": str(error)}
        return {**result, "changed": False, "ansible_facts": {"ddp_cluster": done.fact()}}
