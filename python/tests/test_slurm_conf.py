"""Slurm's configuration from the compiled cluster (ddp_cluster.inventory.slurm): slurm.conf and gres.conf for
cpu, gpu and npu clusters, the same text for the same cluster, the settings of a large cluster, and a clear
refusal of what Slurm cannot take."""

from __future__ import annotations

import pytest

from ddp_cluster.inventory import slurm
from ddp_cluster.inventory.slurm import SlurmCluster, SlurmConfigError, SlurmNode


def nodes(count: int, devices: int = 0) -> list[SlurmNode]:
    return [SlurmNode(f"node{index}", f"10.0.{index // 250}.{index % 250 + 1}", 16, 64000, devices)
            for index in range(count)]  # fmt: skip


def conf(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def test_a_cpu_cluster_is_whole_nodes_on_linuxproc_with_accounting() -> None:
    cluster = SlurmCluster("demo", nodes(3), ["node0"], "node0")
    text = slurm.slurm_conf(cluster)
    found = conf(text)
    assert found["ClusterName"] == ["demo"] and found["SlurmctldHost"] == ["node0(10.0.0.1)"]
    assert found["ProctrackType"] == ["proctrack/linuxproc"] and found["TaskPlugin"] == ["task/none"]
    assert found["SelectType"] == ["select/cons_tres"] and "GresTypes" not in found
    assert found["AccountingStorageHost"] == ["node0"] and found["AccountingStoreFlags"] == ["job_comment"]
    assert found["NodeName"] == [
        "node0 NodeAddr=10.0.0.1 CPUs=16 RealMemory=64000 State=UNKNOWN",
        "node1 NodeAddr=10.0.0.2 CPUs=16 RealMemory=64000 State=UNKNOWN",
        "node2 NodeAddr=10.0.0.3 CPUs=16 RealMemory=64000 State=UNKNOWN",
    ]
    partition = "ddp Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE"
    assert found["PartitionName"] == [partition]
    assert slurm.slurm_conf(cluster) == text  # the same on every node, run after run
    assert slurm.gres_conf(cluster).count("\n") == 1  # the header alone


@pytest.mark.parametrize(
    ("accelerator", "files"), [("npu", "/dev/davinci[0-7]"), ("gpu", "/dev/nvidia[0-7]")]
)
def test_an_accelerator_cluster_has_its_devices_as_a_gres(accelerator: str, files: str) -> None:
    cluster = SlurmCluster("ascend", nodes(2, devices=8), ["node0", "node1"], "node1", accelerator)
    found = conf(slurm.slurm_conf(cluster))
    assert found["GresTypes"] == [accelerator]
    assert found["SlurmctldHost"] == ["node0(10.0.0.1)", "node1(10.0.0.2)"]  # the second a backup
    assert all(f"Gres={accelerator}:8" in line for line in found["NodeName"])
    assert slurm.gres_conf(cluster).splitlines()[1:] == [
        f"NodeName=node0 Name={accelerator} File={files}",
        f"NodeName=node1 Name={accelerator} File={files}",
    ]
    single = SlurmCluster("one", [SlurmNode("a", "10.0.0.1", 4, 0, 1)], ["a"], "a", accelerator)
    assert slurm.gres_conf(single).splitlines()[1].endswith(files.replace("[0-7]", "0"))
    assert "RealMemory" not in slurm.slurm_conf(single)  # not known: Slurm's own default


def test_a_large_cluster_gets_the_big_system_settings() -> None:
    big = SlurmCluster("big", nodes(1152, 8), ["node0", "node1"], "node2", "npu")
    found = conf(slurm.slurm_conf(big))
    assert found["SlurmctldPort"] == ["6817-6820"] and found["MessageTimeout"] == ["30"]
    assert (
        found["SlurmdTimeout"] == ["300"] and found["TreeWidth"] == ["50"] and len(found["NodeName"]) == 1152
    )
    assert slurm.tree_width(20000) == 50 and slurm.tree_width(200000) == 59
    small = conf(slurm.slurm_conf(SlurmCluster("small", nodes(2), ["node0"], "node0")))
    assert small["SlurmctldPort"] == ["6817"] and small["MessageTimeout"] == ["10"]


def test_what_slurm_cannot_take_is_refused_naming_each_fix() -> None:
    bad = SlurmCluster(
        "Not-A-Name", [*nodes(2), SlurmNode("node1", "", 0), SlurmNode("bad name", "10.1.1.1", 4)],
        ["node9"], "node0", "tpu",
    )  # fmt: skip
    with pytest.raises(SlurmConfigError) as raised:
        slurm.slurm_conf(bad)
    said = str(raised.value)
    for part in ("'Not-A-Name' is not a Slurm cluster name", "node name 'bad name'",
                 "nodes named twice: node1",
                 "node9 (slurm_controllers or slurm_dbd_host) is not a node", "cluster_accelerator 'tpu'",
                 "CPUs 0"):  # fmt: skip
        assert part in said, part


def test_nodes_on_a_bridge_network_are_reached_by_name_and_accounting_can_be_off() -> None:
    named = SlurmCluster(
        "local", [SlurmNode("node0", "", 1), SlurmNode("node1", "", 1)], ["node0"], "node0", accounting=False
    )
    text = conf(slurm.slurm_conf(named))
    assert text["SlurmctldHost"] == ["node0"]
    assert text["NodeName"] == ["node0 CPUs=1 State=UNKNOWN", "node1 CPUs=1 State=UNKNOWN"]
    assert (
        text["AccountingStorageType"] == ["accounting_storage/none"] and "AccountingStorageHost" not in text
    )


def test_an_inventorys_cluster_name_becomes_a_slurm_cluster_name() -> None:
    assert slurm.cluster_name("local") == "local"
    assert slurm.cluster_name("My-Cluster.prod") == "my_cluster_prod"
    assert slurm.cluster_name("910b-pod") == "c_910b_pod"
    assert len(slurm.cluster_name("x" * 80)) == 40
