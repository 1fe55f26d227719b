"""Which servers converge (ddp_cluster.inventory.drift): every branch of the decision, the state files."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ddp_cluster.inventory import drift

FACT = {
    "dir": "/tmp/x/compiled",
    "peers": ["10.0.0.0/30"],
    "somaxconn": 4096,
    "hosts_sha256": "h1",
    "known_hosts_sha256": "k1",
    "known_hosts_missing": [],
    "npu": None,
    "nodes": 4,
    "code": "c1",
}
ACTUAL = {"container": "a", "sshd": "b", "mesh": "c", "files": "d"}
MEANING = {"container": "node container", "mesh": "ssh mesh files"}


def in_sync(inputs: str = "i1", fact: dict[str, object] = FACT) -> dict[str, object]:
    return drift.converged_state(drift.wanted(inputs, fact), drift.Probe(ACTUAL))


def decide(state: dict[str, object] | None, probe: drift.Probe, **kwargs: object) -> drift.Decision:
    return drift.decide("n1", state, drift.wanted("i1", FACT), probe, meaning=MEANING, **kwargs)  # type: ignore[arg-type]


def test_a_node_in_sync_does_not_converge() -> None:
    decision = decide(in_sync(), drift.Probe(ACTUAL))
    assert not decision.converge
    assert decision.line() == "n1: in sync"


def test_no_state_is_a_first_run() -> None:
    decision = decide(None, drift.Probe(ACTUAL))
    assert decision.converge and decision.reasons == ("no state recorded (first run)",)


def test_a_node_that_did_not_converge_last_time_converges() -> None:
    state = {**in_sync(), "converged": False, "reason": "unreachable in hosts"}
    assert decide(state, drift.Probe(ACTUAL)).reasons == (
        "the last run did not converge it (unreachable in hosts)",
    )


@pytest.mark.parametrize(
    ("change", "stages"),
    [
        ({"code": "c2"}, "hosts, image, containers, mesh"),
        ({"peers": ["10.0.0.0/29"]}, "hosts"),
        ({"hosts_sha256": "h2"}, "containers"),
        ({"known_hosts_sha256": "k2"}, "mesh"),
    ],
)
def test_changed_inputs_name_their_stages(change: dict[str, object], stages: str) -> None:
    state = in_sync(fact={**FACT, **change})
    assert decide(state, drift.Probe(ACTUAL)).reasons == (f"input or code changed: {stages}",)


def test_the_nodes_own_inputs_change_every_stage() -> None:
    assert decide(in_sync("i0"), drift.Probe(ACTUAL)).reasons == (
        "input or code changed: hosts, image, containers, mesh",
    )


def test_a_drifted_component_is_named_with_the_probes_word() -> None:
    probe = drift.Probe({**ACTUAL, "container": "x", "mesh": "y"}, {"container": "not running"})
    decision = decide(in_sync(), probe)
    assert decision.reasons == ("node container: not running", "ssh mesh files differs")
    assert decision.line() == "n1: node container: not running; ssh mesh files differs"
    # A component the probe no longer reads, or one it reads now and did not then.
    assert decide(in_sync(), drift.Probe({"container": "a"})).converge
    assert decide(in_sync(), drift.Probe({**ACTUAL, "hccn": "z"})).reasons == ("hccn differs",)


def test_a_failed_probe_converges_the_node_and_says_why() -> None:
    decision = decide(in_sync(), drift.Probe(error="rc 255: Connection refused"))
    assert decision.reasons == ("probe failed: rc 255: Connection refused",)


def test_force_converges_every_node() -> None:
    assert decide(in_sync(), drift.Probe(ACTUAL), force=True).reasons == ("converge=all",)


def test_probe_all_reads_each_answer() -> None:
    answers = {"a": (0, "out-a", ""), "b": (255, "", "ssh: connect refused\n"), "c": (0, "cut", "")}
    probes = drift.probe_all(
        ["a", "b", "c", "d"],
        lambda nodes: answers,
        lambda out: (out != "cut", {"x": out}, {}),
    )
    assert probes["a"] == drift.Probe({"x": "out-a"}, {})
    assert probes["b"].error == "rc 255: ssh: connect refused"
    assert probes["c"].error == "rc 0: cut"
    assert probes["d"].error == "rc -1: not run"


def test_state_files_are_written_when_their_content_differs(tmp_path: Path) -> None:
    then = datetime(2026, 1, 1, tzinfo=timezone.utc)
    state = drift.converged_state({"hosts": "h"}, drift.Probe(ACTUAL), now=then)
    assert state["at"] == "2026-01-01T00:00:00Z"
    assert drift.write_state(tmp_path, "n1", state)
    assert drift.read_state(tmp_path, "n1") == state
    # The same state later: not written again (a warm run leaves the file as it is).
    assert not drift.write_state(tmp_path, "n1", drift.converged_state({"hosts": "h"}, drift.Probe(ACTUAL)))
    assert drift.read_state(tmp_path, "missing") is None
    (tmp_path / "bad.state.json").write_text("{")
    assert drift.read_state(tmp_path, "bad") is None


def test_record_writes_converged_and_failed_nodes(tmp_path: Path) -> None:
    fact = {**FACT, "dir": str(tmp_path / "compiled")}
    records = drift.records_dir(fact)
    drift.write_state(records, "n3", in_sync())
    probes = {"n1": drift.Probe(ACTUAL), "n2": drift.Probe(error="rc 255: gone")}
    found = drift.survey(["n1", "n2"], {"n1": {"inputs": "i1"}}, fact, {}, probes)
    written = drift.record(records, found, {}, ["n3"], "unreachable in containers")
    assert written == ["n1", "n2", "n3"]
    n1 = json.loads((records / "n1.state.json").read_text())
    assert n1["converged"] and n1["actual"] == ACTUAL and n1["wanted"] == drift.wanted("i1", fact)
    n2 = drift.read_state(records, "n2")
    assert n2 is not None and not n2["converged"] and "rc 255: gone" in n2["reason"]
    n3 = drift.read_state(records, "n3")
    assert n3 is not None and n3["reason"] == "unreachable in containers"
    assert n3["actual"] == ACTUAL  # what was recorded before stays, marked not converged


def test_survey_lines_and_diff() -> None:
    states = {"n1": in_sync(), "n2": in_sync()}
    probes = {
        "n1": drift.Probe(ACTUAL),
        "n2": drift.Probe({**ACTUAL, "sshd": "z"}, {"sshd": "not listening"}),
    }
    entries = {"n1": {"inputs": "i1"}, "n2": {"inputs": "i1"}}
    found = drift.survey(["n1", "n2"], entries, FACT, states, probes, meaning={"sshd": "sshd"})
    assert found.converge == ["n2"]
    assert found.lines() == ["n2: sshd: not listening"]
    diff = found.diff(states)
    assert json.loads(diff["before"]) == {"n2": ACTUAL}
    assert json.loads(diff["after"])["n2"]["sshd"] == "z"


def test_probe_spec_takes_the_roles_defaults() -> None:
    spec = drift.probe_spec("node0", {"ansible_connection": "local", "cluster_network_mode": "bridge"}, {})
    assert spec == {
        "container": "node0",
        "port": 12345,
        "etc_dir": "/var/lib/ddp-cluster/node0/etc",
        "cluster": "local",
        "host": False,
        "npu_tool": "/usr/local/Ascend/driver/tools/hccn_tool",
        "npu_devices": [],
    }
    npu = {"npu": {"settings": [{"device": 0}, {"device": 1}], "tls_devices": ["0", "1"]}}
    remote = drift.probe_spec("s1", {"cluster_ssh_port": 2222, "cluster_state_dir": "/srv/"}, npu)
    assert (remote["port"], remote["etc_dir"], remote["host"], remote["npu_devices"]) == (
        2222,
        "/srv/s1/etc",
        True,
        [0, 1],
    )


def test_probe_nodes_runs_each_nodes_script_where_it_says() -> None:
    variables = {"a": {"ansible_connection": "local"}, "b": {"ansible_connection": "local"}}

    def script(spec: dict[str, object]) -> str:
        return "exit 3\n" if spec["container"] == "b" else f"echo {spec['container']}\n"

    probes = drift.probe_nodes(
        ["a", "b"],
        variables,
        {"a": {}, "b": {}},
        script,  # type: ignore[arg-type]
        lambda out: (bool(out), {"out": out.strip()}, {}),
        ssh_args="",
        control_path_dir="/",
    )
    assert probes["a"] == drift.Probe({"out": "a"}, {})
    assert probes["b"].error == "rc 3: no output"


def test_a_neighbours_npu_change_takes_a_server_through_though_its_own_variables_did_not_change() -> None:
    # On npu a device's netdetect address is the next server's device IP: the compiled settings change while
    # this server's inventory inputs do not.
    before = {"inputs": "i1", "npu": {"settings": [{"device": 0, "netdetect": "192.168.100.111"}]}}
    after = {"inputs": "i1", "npu": {"settings": [{"device": 0, "netdetect": "192.168.100.115"}]}}
    recorded = drift.converged_state(drift.wanted(drift.node_inputs(before), FACT), drift.Probe(ACTUAL))
    found = drift.survey(["n1"], {"n1": after}, FACT, {"n1": recorded}, {"n1": drift.Probe(ACTUAL)})
    assert found.converge == ["n1"]
    assert "input or code changed" in found.decisions["n1"].line()
    same = drift.survey(["n1"], {"n1": before}, FACT, {"n1": recorded}, {"n1": drift.Probe(ACTUAL)})
    assert same.converge == []
    # Off npu the node's inputs are its inventory inputs alone (the digests recorded before stay valid).
    assert drift.node_inputs({"inputs": "i1", "npu": None}) == "i1"
