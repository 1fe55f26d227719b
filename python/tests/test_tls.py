"""TLS switches of the device NICs: parsed from hccn_tool's documented output, compared across the cluster."""

from __future__ import annotations

from ddp_cluster.ascend.tls import tls_switch, tls_verdict


def out(switch: int, preconfigured: bool = True) -> str:
    preset = ", tls preconfigured[1](0:non-preset, 1:preset)" if preconfigured else ""
    return (
        f"dev_id:0, tls switch[{switch}](0:disable, 1:enable){preset}, tls alarm time threshold[60]days\n"
        "dev_id:0, [pub cert] info:\n"
        "         issuer[/C=CN/ST=GD/O=HUAWEI/OU=2012/CN=2_1thCA]\n"
    )


def test_switch_is_read_from_both_output_forms() -> None:
    assert tls_switch(out(0)) == 0
    assert tls_switch(out(1, preconfigured=False)) == 1
    assert tls_switch("hccn_tool is busy, please try again") is None


def test_one_odd_device_is_named_against_the_majority() -> None:
    verdict = tls_verdict(
        {"s0": {0: out(0), 1: out(0)}, "s1": {"0": out(0), "1": out(1)}},
    )
    assert not verdict.ok and verdict.majority == 0
    assert verdict.odd == [("s1", 1, 1)]
    assert verdict.lines() == ["s1 device 1: tls switch 1 (enabled)"]


def test_uniform_cluster_passes_and_a_required_value_is_enforced() -> None:
    uniform = {"s0": {0: out(1)}, "s1": {0: out(1)}}
    assert tls_verdict(uniform).ok
    required = tls_verdict(uniform, required=0)
    assert [line for line in required.lines()] == [
        "s0 device 0: tls switch 1 (enabled)",
        "s1 device 0: tls switch 1 (enabled)",
    ]


def test_unreadable_output_is_named() -> None:
    verdict = tls_verdict({"s0": {0: out(0), 1: "error"}})
    assert verdict.lines() == ["s0 device 1: tls switch unreadable"]
