"""How the golden data here was made, from the roles' per-host expressions before they read the compiled
cluster: the filters of plugins/filter/ddp_cluster.py and ssh_mesh's known_hosts template (kept here as
known_hosts.j2). Run from the repository's root: python python/tests/data/compiled/make_golden.py"""

import base64
import importlib.util
import json
import sys
from pathlib import Path

import jinja2

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "python" / "src"))

spec = importlib.util.spec_from_file_location("f", REPO / "plugins" / "filter" / "ddp_cluster.py")
f = importlib.util.module_from_spec(spec)
spec.loader.exec_module(f)
OUT = Path(__file__).resolve().parent


def key(node):  # a stable fake ed25519 key per node
    import hashlib

    return "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI" + base64.b64encode(
        hashlib.sha256(node.encode()).digest()
    ).decode().rstrip("=")


def cases():
    yield "contiguous2", {f"n{i}": {"ansible_host": f"10.0.0.{i + 1}"} for i in range(2)}, 22
    scattered = {
        "a0": {"ansible_host": "10.1.0.5"},
        "a1": {"ansible_host": "10.1.0.9", "node_container_address": "192.168.7.4"},
        "a2": {"ansible_host": "172.16.3.1"},
        "a3": {"ansible_host": "fd00::12"},
        "a4": {"ansible_host": "fd00::13"},
        "a5": {"ansible_host": "localhost"},
        "a6": {"ansible_host": "10.1.0.6"},
        "a7": {"ansible_host": "10.1.0.4"},
    }
    yield "scattered8", scattered, 12345
    yield "contiguous64", {f"s{i}": {"ansible_host": f"10.64.0.{i}"} for i in range(64)}, 12345
    yield "local3", {f"node{i}": {"ansible_connection": "local"} for i in range(3)}, 12345


env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
env.filters["b64decode"] = lambda s: base64.b64decode(s).decode()
template = env.from_string((OUT / "known_hosts.j2").read_text())
for name, hostvars, port in cases():
    nodes = list(hostvars)
    fake = {}
    for i, node in enumerate(nodes):
        v = dict(hostvars[node])
        if i % 3 == 1:  # read by the slurp, as a mesh run without the container stage does
            v["__ssh_mesh_host_key"] = {
                "content": base64.b64encode((key(node) + " root@x\n").encode()).decode()
            }
        else:
            v["ddp_node_host_keys"] = {"ed25519": key(node), "rsa": "ssh-rsa AAAA"}
        fake[node] = v
    known = template.render(
        ssh_mesh_nodes=nodes, hostvars=fake, ssh_mesh_port=port, ssh_mesh_host_key_type="ed25519"
    )
    addresses = f.node_addresses(hostvars, nodes)
    data = {
        "nodes": nodes,
        "inventory": hostvars,
        "ssh_port": port,
        "host_keys": {n: key(n) for n in nodes},
        "addresses": addresses,
        "known_hosts": known,
    }
    (OUT / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")

# npu: 8 servers of the manual's layout (seeds, one given by address list), and the settings of each.
SERVER0 = [f"192.168.{100 + d % 4}.{101 - d // 4}" for d in range(8)]
inv = {"ai-server0": {"ansible_host": "10.10.0.10", "npu_device_ips": SERVER0}}
for i in range(1, 8):
    inv[f"ai-server{i}"] = {
        "ansible_host": f"10.10.0.{10 + i}",
        "npu_device_ip_seed": f"192.168.100.{101 + 10 * i}",
    }
nodes = list(inv)
plan = f.npu_plan(inv, nodes, "atlas-training", "255.255.255.0")
settings = {h: f.hccn_device_settings(plan, h, [], []) for h in nodes}
tls = {
    h: [
        str(d)
        for d in range(
            len(f.npu_plan(inv, [h], "atlas-training", "255.255.255.0")["servers"][0]["device_ips"])
        )
    ]
    for h in nodes
}
check = f.npu_plan_check(inv, nodes, "atlas-training", "255.255.255.0")
bad = dict(inv)
bad["ai-server3"] = {"ansible_host": "10.10.0.13"}
bad_check = f.npu_plan_check(bad, nodes, "atlas-training", "255.255.255.0")
(OUT / "npu8.json").write_text(
    json.dumps(
        {
            "nodes": nodes,
            "inventory": inv,
            "product": "atlas-training",
            "netmask": "255.255.255.0",
            "settings": settings,
            "tls_devices": tls,
            "violations": check,
            "broken": {"inventory": bad, "violations": bad_check},
        },
        indent=1,
        sort_keys=True,
    )
    + "\n"
)
print("ok", len(check), len(bad_check))
