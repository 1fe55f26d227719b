"""Which transport NCCL chose (its INFO lines, verbatim from real logs), the node's HCAs from a fake sysfs
tree, and the fabric verdict: a socket fallback on a node with an active HCA port fails, nothing else does."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_cluster.health import fabric
from ddp_cluster.health.fabric import Hca, Port, Transport

ROCE_USING = (
    "dgxh100-4:460770:460842 [0] NCCL INFO NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; "
    "OOB enp220s0np0:11.1.128.136<0>"
)
ROCE_NETWORK = "dgxh100-4:460770:460842 [0] NCCL INFO Using network IB"
SOCKET_USING = (
    "user:852750:852802 [0] NCCL INFO NET/Socket : Using [0]ibs85f0:192.168.1.14<0> [1]ib0:192.168.1.15<0>"
)
SOCKET_NETWORK = "user:852750:852802 [0] NCCL INFO Using network Socket"
IB_NONE = "ubuntu1-NF5588M4S:11567:11697 [0] NCCL INFO NET/IB : No device found."
IB_USING = "master_node:20:289 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>"
CHANNEL_SEND = ":22901:22901 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/4"
CHANNEL_RECEIVE = "NCCL INFO Channel 00/0 : 9[1] -> 0[0] [receive] via NET/IB/0/GDRDMA/flush=None"
PLUGIN_MISSING = "gpu3:101:101 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so)."


def log(*lines: str) -> str:
    return "\n".join(lines) + "\n"


# --- parsing ---


def test_roce_with_relaxed_ordering() -> None:
    transport = fabric.parse_nccl_log(log(ROCE_USING, ROCE_NETWORK))
    assert transport.network == "IB"
    assert transport.ib_devices == ("mlx5_10:1/RoCE", "mlx5_11:1/RoCE")
    assert transport.kind == "ib"
    assert fabric.render_transport(transport) == "IB (mlx5_10:1/RoCE, mlx5_11:1/RoCE)"


def test_infiniband_without_relaxed_ordering_and_its_channels() -> None:
    transport = fabric.parse_nccl_log(log(IB_USING, CHANNEL_SEND, CHANNEL_RECEIVE, CHANNEL_SEND))
    assert transport.ib_devices == ("mlx5_0:1/IB",)
    assert transport.channels == ("NET/IB/4", "NET/IB/0/GDRDMA/flush=None")
    assert transport.network is None
    assert transport.kind == "ib"  # from the channels alone


def test_socket_fallback_with_both_using_lines() -> None:
    transport = fabric.parse_nccl_log(log(PLUGIN_MISSING, IB_USING, SOCKET_USING, SOCKET_NETWORK))
    assert transport.kind == "socket"
    assert transport.network == "Socket"
    assert transport.socket_interfaces == ("ibs85f0", "ib0")
    assert transport.ib_devices == ("mlx5_0:1/IB",)
    assert fabric.render_transport(transport) == "Socket (ibs85f0, ib0)"


def test_no_ib_device() -> None:
    transport = fabric.parse_nccl_log(log(IB_NONE, SOCKET_USING, SOCKET_NETWORK))
    assert transport.no_ib_device
    assert transport.kind == "socket"


def test_warn_and_blank_lines_and_other_prefixes_are_tolerated() -> None:
    text = log(
        "",
        "gpu3:1:2 [0] NCCL WARN NET/IB : Using [0]mlx5_9:1/IB ; OOB ib0:10.0.0.1<0>",
        "   ",
        "2025-01-01T00:00:00 rank3 gpu3:1:2 [3] NCCL INFO Using network IB",
        "NCCL version 2.21.5+cuda12.4",
        "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:192.168.11.1<0>",
    )
    transport = fabric.parse_nccl_log(text)
    assert transport.network == "IB"
    assert transport.ib_devices == ("mlx5_0:1/IB", "mlx5_1:1/IB")  # the WARN line's device is not counted


def test_merged_devices_and_rails_are_listed_as_nccl_listed_them() -> None:
    text = log(
        "h:1:2 [0] NCCL INFO NET/IB : Using [0]={[0] mlx5_0:1/RoCE, [1] mlx5_1:1/RoCE} "
        "[1]mlx5_2:1:rail0/IB [RO]; OOB eth0:10.0.0.1<0>"
    )
    transport = fabric.parse_nccl_log(text)
    assert transport.ib_devices == ("mlx5_0:1/RoCE", "mlx5_1:1/RoCE", "mlx5_2:1:rail0/IB")
    assert transport.kind == "unknown"  # devices listed are not the network chosen


@pytest.mark.parametrize(
    ("name", "kind"),
    [("IB", "ib"), ("IBext", "ib"), ("IBext_v8", "ib"), ("Socket", "socket"), ("AWS Libfabric", "other")],
)
def test_network_names(name: str, kind: str) -> None:
    transport = fabric.parse_nccl_log(f"h:1:2 [0] NCCL INFO Using network {name}\n")
    assert transport.network == name
    assert transport.kind == kind


def test_a_plugin_renders_by_its_name() -> None:
    transport = fabric.parse_nccl_log("h:1:2 [0] NCCL INFO Using network AWS Libfabric\n")
    assert fabric.render_transport(transport) == "AWS Libfabric"


def test_one_process_on_sockets_makes_the_node_socket() -> None:
    transport = fabric.parse_nccl_log(log(ROCE_NETWORK, SOCKET_NETWORK, ROCE_NETWORK))
    assert transport.network == "Socket"
    assert transport.networks == ("IB", "Socket")


def test_local_channels_alone_say_nothing() -> None:
    text = log(
        "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
        "h:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct",
    )
    transport = fabric.parse_nccl_log(text)
    assert transport.channels == ()
    assert transport.kind == "unknown"


def test_nothing_seen_is_unknown() -> None:
    transport = fabric.parse_nccl_log("")
    assert transport == Transport()
    assert transport.kind == "unknown"
    assert fabric.render_transport(transport) == "unknown (no NCCL log)"
    assert fabric.render_transport(fabric.parse_nccl_log(log(IB_NONE))) == "unknown (NET/IB: no device)"


def test_as_dict_round_trips() -> None:
    transport = fabric.parse_nccl_log(log(IB_NONE, SOCKET_USING, SOCKET_NETWORK, CHANNEL_SEND))
    data = transport.as_dict()
    assert data["kind"] == "socket"
    assert data["socket_interfaces"] == ["ibs85f0", "ib0"]
    assert Transport.from_dict(data) == transport


def test_read_nccl_logs(tmp_path: Path) -> None:
    (tmp_path / "nccl.gpu3.11.log").write_text(ROCE_USING + "\n")
    (tmp_path / "nccl.gpu3.12.log").write_text(ROCE_NETWORK + "\n")
    (tmp_path / "health.json").write_text("{}")
    assert fabric.parse_nccl_log(fabric.read_nccl_logs(tmp_path)).kind == "ib"
    assert fabric.read_nccl_logs(tmp_path / "missing") == ""


# --- the node's HCAs ---


def hca(root: Path, name: str, *ports: tuple[str, str]) -> None:
    for number, (state, link_layer) in enumerate(ports, start=1):
        port = root / name / "ports" / str(number)
        port.mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "link_layer").write_text(link_layer + "\n")


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "infiniband"
    hca(root, "mlx5_10", ("4: ACTIVE", "Ethernet"))
    hca(root, "mlx5_2", ("1: DOWN", "InfiniBand"), ("4: ACTIVE", "InfiniBand"))
    hca(root, "mlx5_0", ("4: ACTIVE", "InfiniBand"))
    hca(root, "mlx5_1", ("1: DOWN", "InfiniBand"))
    return root


def test_ib_devices_reads_ports_in_natural_order(sysfs: Path) -> None:
    hcas = fabric.ib_devices(sysfs)
    assert [h.name for h in hcas] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_10"]
    assert hcas[0].ports == (Port(1, "ACTIVE", "InfiniBand"),)
    assert hcas[2].ports == (Port(1, "DOWN", "InfiniBand"), Port(2, "ACTIVE", "InfiniBand"))
    assert [h.active for h in hcas] == [True, False, True, True]
    assert [Hca.from_dict(h.as_dict()) for h in hcas] == hcas


def test_ib_devices_without_sysfs_or_readable_state(tmp_path: Path) -> None:
    assert fabric.ib_devices(tmp_path / "absent") == []
    (tmp_path / "mlx5_0" / "ports" / "1").mkdir(parents=True)
    (tmp_path / "irdma0").mkdir()
    assert fabric.ib_devices(tmp_path) == [Hca("irdma0"), Hca("mlx5_0", (Port(1, None, None),))]


def test_has_rdma_devices(tmp_path: Path) -> None:
    assert not fabric.has_rdma_devices(tmp_path / "absent")
    (tmp_path / "rdma_cm").touch()
    assert not fabric.has_rdma_devices(tmp_path)
    (tmp_path / "uverbs0").touch()
    assert fabric.has_rdma_devices(tmp_path)


# --- the verdict ---


def test_socket_fallback_with_an_active_hca_fails(sysfs: Path) -> None:
    transport = fabric.parse_nccl_log(
        log(
            IB_NONE,
            "h:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>",
            "h:1:2 [0] NCCL INFO Using network Socket",
        )
    )
    problem = fabric.fabric_problem("gpu3", transport, fabric.ib_devices(sysfs), rdma_devices=False)
    assert problem is not None
    assert problem.startswith(
        "node gpu3 fell back to NCCL's socket transport (NET/Socket on eth0) though it has InfiniBand/RoCE "
        "devices with active ports (mlx5_0, mlx5_2, mlx5_10); NCCL's IB transport found no device; the "
        "container has no /dev/infiniband/uverbs* device: check that /dev/infiniband is passed"
    )
    for hint in ("rdma-core/libibverbs (training_image_os_packages)", "NCCL_IB_DISABLE", "NCCL_IB_HCA"):
        assert hint in problem
    assert "mlx5_1," not in problem  # its only port is down


def test_down_ports_do_not_count(tmp_path: Path) -> None:
    hca(tmp_path, "mlx5_0", ("1: DOWN", "InfiniBand"))
    hca(tmp_path, "mlx5_1", ("2: INIT", "Ethernet"))
    transport = fabric.parse_nccl_log(log(SOCKET_USING, SOCKET_NETWORK))
    assert fabric.fabric_problem("gpu3", transport, fabric.ib_devices(tmp_path)) is None


def test_sockets_without_hcas_are_fine() -> None:
    transport = fabric.parse_nccl_log(log(IB_NONE, SOCKET_USING, SOCKET_NETWORK))
    assert fabric.fabric_problem("gpu3", transport, []) is None


@pytest.mark.parametrize(
    "text",
    [
        "",  # no log: nothing known, nothing said
        log(IB_NONE),  # NET/IB found nothing but the log never says what NCCL used
        log(ROCE_USING, ROCE_NETWORK),
        "h:1:2 [0] NCCL INFO Using network AWS Libfabric\n",
    ],
)
def test_unknown_ib_and_plugins_say_nothing(sysfs: Path, text: str) -> None:
    assert fabric.fabric_problem("gpu3", fabric.parse_nccl_log(text), fabric.ib_devices(sysfs)) is None
