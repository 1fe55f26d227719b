"""The compiled cluster (ddp_cluster.inventory.compiled): the same peers, known_hosts and NPU settings as the
roles' per-host expressions gave (golden data made from them: data/compiled/, the known_hosts template as it
was kept beside it), each node's variables read once whatever the node count."""

from __future__ import annotations

import base64
import ipaddress
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jinja2
import pytest

from ddp_cluster.inventory import compiled

DATA = Path(__file__).parent / "data" / "compiled"
CASES = ["contiguous2", "scattered8", "contiguous64", "local3"]


def golden(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return data


def records(folder: Path, keys: Mapping[str, str], network: str = "") -> Path:
    """Node records as the containers stage writes them, with their host keys."""
    folder.mkdir(parents=True, exist_ok=True)
    for node, key in keys.items():
        record = {"address": "", "network": network, "host_keys": {"ed25519": key, "rsa": "ssh-rsa AAAA"}}
        (folder / f"{node}.json").write_text(json.dumps(record))
    return folder


class Counting(Mapping[str, Mapping[str, Any]]):
    """Each node's variables, counting the reads (HostVars.raw_get per node, in the action)."""

    def __init__(self, data: Mapping[str, Mapping[str, Any]]) -> None:
        self.data, self.reads = data, {node: 0 for node in data}

    def __getitem__(self, node: str) -> Mapping[str, Any]:
        self.reads[node] += 1
        return self.data[node]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


@pytest.mark.parametrize("case", CASES)
def test_the_same_addresses_and_known_hosts_as_the_roles_expressions(case: str, tmp_path: Path) -> None:
    data = golden(case)
    nodes = data["nodes"]
    result = compiled.compile_cluster(
        data["inventory"],
        nodes,
        cluster="c",
        records_dir=records(tmp_path / "nodes", data["host_keys"]),
        ssh_port=data["ssh_port"],
    )
    assert result.addresses == data["addresses"]
    assert result.known_hosts == data["known_hosts"]
    assert result.known_hosts_missing == []
    # The collapsed peers hold exactly the nodes' addresses, no other.
    covered = {str(address) for peer in result.peers for address in ipaddress.ip_network(peer)}
    assert covered == set(data["addresses"].values())
    assert result.hosts.splitlines()[1:] == [f"{data['addresses'][n]} {n}" for n in nodes]
    assert [entry["address"] for entry in result.nodes.values()] == [data["addresses"][n] for n in nodes]


def test_the_golden_known_hosts_is_what_the_kept_template_renders() -> None:
    """The golden text is the template's (rendered as Ansible's template lookup does: trim_blocks)."""
    data = golden("scattered8")
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["b64decode"] = lambda text: base64.b64decode(text).decode()
    nodes = data["nodes"]
    fake = {
        node: {
            "__ssh_mesh_host_key": {"content": base64.b64encode(data["host_keys"][node].encode()).decode()}
        }
        for node in nodes
    }
    text = env.from_string((DATA / "known_hosts.j2").read_text()).render(
        ssh_mesh_nodes=nodes, hostvars=fake, ssh_mesh_port=12345, ssh_mesh_host_key_type="ed25519"
    )
    assert text == data["known_hosts"]


def test_contiguous_addresses_collapse_to_one_network() -> None:
    data = golden("contiguous64")
    result = compiled.compile_cluster(
        data["inventory"], data["nodes"], cluster="c", records_dir=Path("/nonexistent")
    )
    assert result.peers == ["10.64.0.0/26"]
    assert compiled.collapse(["10.0.0.1", "fd00::1", "10.0.0.0", "10.0.0.3"]) == [
        "10.0.0.0/31",
        "10.0.0.3/32",
        "fd00::1/128",
    ]


def test_a_node_without_a_recorded_host_key_is_named_and_left_out(tmp_path: Path) -> None:
    data = golden("contiguous2")
    keys = dict(data["host_keys"])
    del keys["n1"]
    result = compiled.compile_cluster(
        data["inventory"], ["n0", "n1"], cluster="c", records_dir=records(tmp_path, keys, "10.0.0.0/24")
    )
    assert result.known_hosts_missing == ["n1"]
    assert result.known_hosts.splitlines() == data["known_hosts"].splitlines()[:2]
    assert result.networks == ["10.0.0.0/24"]


def test_an_address_that_does_not_resolve_is_named_not_raised() -> None:
    inventory = {"good": {"ansible_host": "10.0.0.1"}, "bad": {"ansible_host": "no-such-host.invalid"}}
    result = compiled.compile_cluster(
        inventory, ["good", "bad"], cluster="c", records_dir=Path("/nonexistent")
    )
    assert result.peers == ["10.0.0.1/32"]
    [error] = result.address_errors
    assert error.startswith("bad: its address 'no-such-host.invalid'")
    assert result.nodes["bad"]["address"] is None


def test_the_npu_plan_and_each_nodes_settings_as_the_roles_computed_them(tmp_path: Path) -> None:
    data = golden("npu8")
    nodes = data["nodes"]
    settings = compiled.NpuSettings(data["product"], data["netmask"], [], [])
    result = compiled.compile_cluster(
        data["inventory"], nodes, cluster="c", records_dir=tmp_path, npu_settings=settings
    )
    assert result.npu is not None
    assert result.npu["errors"] == [] and result.npu["warnings"] == []
    for node in nodes:
        entry = result.nodes[node]["npu"]
        assert entry["settings"] == data["settings"][node]
        assert entry["tls_devices"] == data["tls_devices"][node]
    broken = data["broken"]
    result = compiled.compile_cluster(
        broken["inventory"], nodes, cluster="c", records_dir=tmp_path, npu_settings=settings
    )
    assert result.npu is not None
    assert result.npu["errors"] == [v for v in broken["violations"] if v["severity"] == "error"]
    assert result.fact()["npu"] == {"errors": result.npu["errors"], "warnings": []}
    assert "ai-server3: no device addresses" in result.nodes["ai-server0"]["npu"]["error"]


def test_no_npu_plan_on_other_clusters() -> None:
    data = golden("contiguous2")
    result = compiled.compile_cluster(data["inventory"], ["n0", "n1"], cluster="c", records_dir=Path("/none"))
    assert result.npu is None and result.fact()["npu"] is None
    assert all(entry["npu"] is None for entry in result.nodes.values())


@pytest.mark.parametrize("count", [1, 8, 300])
def test_each_nodes_variables_are_read_once_whatever_the_count(count: int, tmp_path: Path) -> None:
    inventory = {
        f"s{i}": {"ansible_host": f"10.64.{i // 256}.{i % 256}", "npu_device_ip_seed": f"192.168.{i}.1"}
        for i in range(count)
    }
    counting = Counting(inventory)
    settings = compiled.NpuSettings("atlas-training", "255.255.255.0")
    compiled.compile_cluster(
        counting, list(inventory), cluster="c", records_dir=tmp_path, npu_settings=settings
    )
    assert set(counting.reads.values()) == {1}


def test_read_nodes_reads_once_and_templates_only_what_holds_a_template() -> None:
    calls: list[tuple[str, str]] = []
    variables = {"ansible_host": "{{ base }}.1", "groups": {"all": ["n0"]}, "_private": 1, "force": True}
    variables |= {
        "ddp_node_changed": True,
        "registered": {"rc": 0},
        "cluster_name": "c",
        "group_names": ["nodes", "ddp_converge_mesh"],
    }
    raw = {"n0": variables}
    counting = Counting(raw)

    def templated(node: str, name: str) -> str:
        calls.append((node, name))
        return "10.0.0.1"

    found = compiled.read_nodes(["n0"], counting.__getitem__, templated, lambda node: {"registered"})
    assert counting.reads == {"n0": 1}
    assert calls == [("n0", "ansible_host")]
    assert found == {"n0": {"ansible_host": "10.0.0.1", "cluster_name": "c", "group_names": ["nodes"]}}


def test_the_inputs_digest_follows_the_nodes_own_variables_only() -> None:
    one = compiled.compile_cluster(
        {"n": {"ansible_host": "10.0.0.1", "x": 1}}, ["n"], cluster="c", records_dir=Path("/none")
    )
    same = compiled.compile_cluster(
        {"n": {"x": 1, "ansible_host": "10.0.0.1"}}, ["n"], cluster="c", records_dir=Path("/none")
    )
    other = compiled.compile_cluster(
        {"n": {"ansible_host": "10.0.0.1", "x": 2}}, ["n"], cluster="c", records_dir=Path("/none")
    )
    assert one.nodes["n"]["inputs"] == same.nodes["n"]["inputs"] != other.nodes["n"]["inputs"]


def test_somaxconn_grows_with_the_ranks_within_linuxs_range() -> None:
    assert compiled.somaxconn(2, 8) == 4096
    assert compiled.somaxconn(1152, 8) == 18432
    assert compiled.somaxconn(9000, 8) == 65535
    inventory = {
        f"n{i}": {"ansible_host": f"10.1.{i // 250}.{i % 250}", "cluster_nproc_per_node": 4}
        for i in range(1000)
    }
    result = compiled.compile_cluster(inventory, list(inventory), cluster="c", records_dir=Path("/none"))
    assert result.somaxconn == 8000
    inventory = {f"n{i}": {"ansible_host": f"10.0.{i // 250}.{i % 250}"} for i in range(1000)}
    result = compiled.compile_cluster(inventory, list(inventory), cluster="c", records_dir=Path("/none"))
    assert result.somaxconn == 16000  # no count given: 8 per node


def test_the_files_are_written_only_when_they_differ(tmp_path: Path) -> None:
    data = golden("contiguous2")
    keys = records(tmp_path / "c" / "nodes", data["host_keys"])
    result = compiled.compile_cluster(
        data["inventory"], ["n0", "n1"], cluster="c", records_dir=keys, code="abc"
    )
    assert result.directory == tmp_path / "c" / "compiled"
    (result.directory / "nodes").mkdir(parents=True)
    (result.directory / "nodes" / "gone.json").write_text("{}")
    assert result.write() is True
    assert result.write() is False
    assert not (result.directory / "nodes" / "gone.json").exists()
    assert (result.directory / "known_hosts").read_text() == data["known_hosts"]
    cluster = json.loads((result.directory / "cluster.json").read_text())
    assert cluster["addresses"] == data["addresses"] and cluster["code"] == "abc"
    assert json.loads((result.directory / "nodes" / "n1.json").read_text())["index"] == 1
    fact = result.fact()
    assert set(fact) == {
        "dir", "peers", "somaxconn", "hosts_sha256", "known_hosts_sha256", "known_hosts_missing",
        "address_errors", "networks", "npu", "nodes", "code",
    }  # fmt: skip
    assert fact["nodes"] == 2 and fact["dir"] == str(result.directory)
    assert fact["known_hosts_sha256"] == compiled.sha256(data["known_hosts"])


def test_slurm_conf_is_compiled_with_each_nodes_address_cpus_and_devices(tmp_path: Path) -> None:
    inventory = {
        "n0": {"ansible_host": "10.0.0.1", "cluster_nproc_per_node": 8, "npu_device_count": 8},
        "n1": {"ansible_host": "10.0.0.2", "cluster_nproc_per_node": 8, "slurm_node_cpus": 192,
               "slurm_node_memory_mb": 1500000, "npu_device_count": 8},
    }  # fmt: skip
    settings = compiled.SlurmSettings(controllers=["n1", "n0"], accelerator="npu", network_mode="host")
    result = compiled.compile_cluster(
        inventory, ["n0", "n1"], cluster="Pod-A", records_dir=tmp_path / "nodes", slurm_settings=settings
    )
    assert result.slurm is not None and result.slurm["errors"] == []
    conf = result.slurm["conf"]
    assert "ClusterName=pod_a\n" in conf
    assert "SlurmctldHost=n1(10.0.0.2)\nSlurmctldHost=n0(10.0.0.1)\n" in conf
    assert "NodeName=n0 NodeAddr=10.0.0.1 CPUs=8 Gres=npu:8 State=UNKNOWN\n" in conf
    assert "NodeName=n1 NodeAddr=10.0.0.2 CPUs=192 RealMemory=1500000 Gres=npu:8 State=UNKNOWN\n" in conf
    assert "NodeName=n0 Name=npu File=/dev/davinci[0-7]" in result.slurm["gres"]
    result.write(tmp_path / "compiled")
    assert (tmp_path / "compiled" / "slurm.conf").read_text() == conf
    fact = result.fact()["slurm"]
    assert fact["controllers"] == ["n1", "n0"] and len(fact["conf_sha256"]) == 64
    # The same cluster compiled again: the same text (every node gets the same bytes, a warm run no change).
    again = compiled.compile_cluster(
        inventory, ["n0", "n1"], cluster="Pod-A", records_dir=tmp_path / "nodes", slurm_settings=settings
    )
    assert again.fact()["slurm"] == fact


def test_a_cluster_slurm_cannot_take_keeps_no_slurm_conf_and_names_the_fix(tmp_path: Path) -> None:
    good = compiled.compile_cluster(
        {"n0": {}, "n1": {}}, ["n0", "n1"], cluster="c", records_dir=tmp_path / "nodes",
        slurm_settings=compiled.SlurmSettings(network_mode="bridge"),
    )  # fmt: skip
    good.write(tmp_path / "compiled")
    assert "SlurmctldHost=n0\n" in (tmp_path / "compiled" / "slurm.conf").read_text()
    bad = compiled.compile_cluster(
        {"n0": {}, "n1": {"slurm_node_cpus": "many"}}, ["n0", "n1"], cluster="c",
        records_dir=tmp_path / "nodes",
        slurm_settings=compiled.SlurmSettings(controllers=["head"], network_mode="bridge"),
    )  # fmt: skip
    assert bad.slurm is not None
    assert bad.slurm["errors"] == [
        "n1: slurm_node_cpus, cluster_nproc_per_node and slurm_node_memory_mb must be numbers",
        "head (slurm_controllers or slurm_dbd_host) is not a node of the inventory",
    ]
    bad.write(tmp_path / "compiled")
    assert not (tmp_path / "compiled" / "slurm.conf").exists()
