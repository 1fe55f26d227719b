"""Which servers a warm site.yml takes through the roles: those whose state drifted or whose inputs changed.

Each node has a state file, ``<controller dir>/nodes/<node>.state.json``, written when it last converged:

    {"wanted": {stage: sha256}, "actual": {component: sha256}, "converged": bool, "reason": str,
     "at": ISO-8601 UTC}

``wanted`` is :func:`wanted`: per stage (hosts, image, containers, mesh), a digest of the node's inventory
inputs, the code's digest and the stage's cluster-wide inputs (the compiled ``ddp_cluster`` fact).
``actual`` is what the probe (:mod:`ddp_cluster.server.state`, run through
:mod:`ddp_cluster.inventory.fanout`) read on the server right after it converged. A server is in sync when
its state file says it converged, its wanted digests are today's, and the probe reads the same actual
state; anything else converges it (:func:`decide`), a probe that failed included (an unreachable server then
goes through preflight, which names it). The files are the controller's cache, like the node records:
written only when their content differs, never in check mode.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ddp_cluster.files import write_atomic
from ddp_cluster.inventory import fanout

STAGES = ("hosts", "image", "containers", "mesh")
STATE_SUFFIX = ".state.json"


@dataclass(frozen=True)
class Probe:
    """What the probe read on one server: component digests and a short word on some, or why it failed."""

    digests: Mapping[str, str] = field(default_factory=dict)
    words: Mapping[str, str] = field(default_factory=dict)
    error: str = ""


@dataclass(frozen=True)
class Decision:
    node: str
    converge: bool
    reasons: tuple[str, ...]

    def line(self) -> str:
        """One line for a person: the node and why it converges (check mode prints these)."""
        return f"{self.node}: {'; '.join(self.reasons) or 'in sync'}"


def digest(value: Any) -> str:
    """sha256 of VALUE's canonical JSON."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def stage_inputs(fact: Mapping[str, Any]) -> dict[str, Any]:
    """Each stage's cluster-wide inputs in the compiled ``ddp_cluster`` fact: what, when it changes, must take
    every server through that stage again (a new peer opens every firewall; a new hosts file or host key is
    written on every node)."""
    return {
        "hosts": {"peers": fact.get("peers"), "somaxconn": fact.get("somaxconn"), "npu": fact.get("npu")},
        "image": {},
        "containers": {"hosts": fact.get("hosts_sha256")},
        "mesh": {
            "known_hosts": fact.get("known_hosts_sha256"),
            "missing": fact.get("known_hosts_missing"),
            # slurm.conf and gres.conf, the same on every node: a change takes every node through again.
            "slurm": (fact.get("slurm") or {}).get("conf_sha256"),
        },
    }


def wanted(inputs: str, fact: Mapping[str, Any]) -> dict[str, str]:
    """Per stage, the digest of the node's inventory INPUTS (its compiled entry's ``inputs``), the code
    (``fact['code']``) and the stage's cluster-wide inputs."""
    code = fact.get("code")
    return {
        stage: digest({"inputs": inputs, "code": code, "stage": stage, "of": given})
        for stage, given in stage_inputs(fact).items()
    }


def node_inputs(entry: Mapping[str, Any]) -> str:
    """A node's own inputs for :func:`wanted`: its inventory inputs' digest, and on npu its compiled device
    settings too, which depend on other servers (a device's netdetect address is the next server's device
    IP): a neighbour's change must take this server through again though its own variables did not change."""
    inputs = str(entry.get("inputs", ""))
    npu = entry.get("npu")
    return inputs if npu is None else digest({"inputs": inputs, "npu": npu})


def decide(
    node: str,
    state: Mapping[str, Any] | None,
    want: Mapping[str, str],
    probe: Probe,
    *,
    meaning: Mapping[str, str] | None = None,
    force: bool = False,
) -> Decision:
    """Whether NODE must converge, and why (every reason found, in this order): forced, no state recorded,
    the last run did not converge it, its inputs or the code changed, the probe failed, its state drifted."""
    reasons: list[str] = []
    if force:
        reasons.append("converge=all")
    if state is None:
        reasons.append("no state recorded (first run)")
    else:
        if not state.get("converged"):
            reasons.append(f"the last run did not converge it ({state.get('reason') or 'no reason given'})")
        recorded = state.get("wanted") or {}
        changed = [stage for stage in STAGES if recorded.get(stage) != want.get(stage)]
        if changed:
            reasons.append("input or code changed: " + ", ".join(changed))
    if probe.error:
        reasons.append(f"probe failed: {probe.error}")
    elif state is not None:
        reasons += drifted(state.get("actual") or {}, probe, meaning or {})
    return Decision(node, bool(reasons), tuple(reasons))


def drifted(recorded: Mapping[str, str], probe: Probe, meaning: Mapping[str, str]) -> list[str]:
    """A reason per component whose digest differs from the one recorded (a word on it where the probe has
    one: 'node container: not running')."""
    reasons = []
    for name in sorted(set(recorded) | set(probe.digests)):
        if recorded.get(name) == probe.digests.get(name):
            continue
        what = meaning.get(name, name)
        word = probe.words.get(name)
        if name not in probe.digests:
            reasons.append(f"{what}: not read")
        else:
            reasons.append(f"{what}: {word}" if word else f"{what} differs")
    return reasons


def state_path(records_dir: Path, node: str) -> Path:
    return records_dir / f"{node}{STATE_SUFFIX}"


def read_state(records_dir: Path, node: str) -> dict[str, Any] | None:
    """NODE's state file, or None when there is none or it cannot be read (a node to converge)."""
    try:
        loaded = json.loads(state_path(records_dir, node).read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def write_state(records_dir: Path, node: str, state: Mapping[str, Any]) -> bool:
    """Write NODE's state file when its content (the time aside) differs; whether it was written."""
    before = read_state(records_dir, node)
    if before is not None and {**before, "at": ""} == {**state, "at": ""}:
        return False
    write_atomic(state_path(records_dir, node), (json.dumps(state, sort_keys=True, indent=1) + "\n").encode())
    return True


def converged_state(want: Mapping[str, str], probe: Probe, now: datetime | None = None) -> dict[str, Any]:
    """The state file of a node that converged, its actual state as PROBE read it right after."""
    return {
        "wanted": dict(want),
        "actual": dict(probe.digests),
        "converged": True,
        "reason": "",
        "at": _at(now),
    }


def failed_state(
    before: Mapping[str, Any] | None, reason: str, now: datetime | None = None
) -> dict[str, Any]:
    """The state file of a node that did not converge: what was recorded before, marked so, with REASON."""
    return {
        "wanted": dict((before or {}).get("wanted") or {}),
        "actual": dict((before or {}).get("actual") or {}),
        "converged": False,
        "reason": reason,
        "at": _at(now),
    }


def _at(now: datetime | None) -> str:
    return (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")


def probe_all(
    nodes: Iterable[str],
    run: Callable[[Sequence[str]], Mapping[str, tuple[int, str, str]]],
    parse: Callable[[str], tuple[bool, dict[str, str], dict[str, str]]],
) -> dict[str, Probe]:
    """Probe NODES: RUN(nodes) gives each node's (rc, stdout, stderr); PARSE(stdout) gives (complete,
    digests, words). A node whose command failed or whose output stopped short gets a Probe with the error."""
    names = list(nodes)
    answers = run(names)
    probes = {}
    for node in names:
        rc, out, err = answers.get(node, (-1, "", "not run"))
        complete, digests, words = parse(out)
        if rc != 0 or not complete:
            said = (err.strip() or out.strip()).splitlines()
            probes[node] = Probe(error=f"rc {rc}: {said[-1][:200] if said else 'no output'}")
        else:
            probes[node] = Probe(digests, words)
    return probes


# The variables the probe reads of a node (each from the inventory; a template is templated by the action).
PROBE_NAMES = (
    "ansible_connection",
    "ansible_host",
    "ansible_ssh_host",
    "ansible_port",
    "ansible_ssh_port",
    "ansible_user",
    "ansible_ssh_user",
    "ansible_remote_user",
    "ansible_ssh_private_key_file",
    "ansible_private_key_file",
    "ansible_ssh_common_args",
    "ansible_ssh_extra_args",
    "ansible_ssh_executable",
    "ansible_become",
    "cluster_name",
    "cluster_state_dir",
    "cluster_ssh_port",
    "cluster_network_mode",
    "node_container_name",
    "node_container_ssh_port",
    "hccn_network_tool",
)


def probe_spec(node: str, variables: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`ddp_cluster.server.state.script` probes on NODE, from its inventory VARIABLES (with the
    roles' defaults where unset) and its compiled ENTRY (the planned NPU devices)."""

    def var(name: str, default: Any) -> Any:
        value = variables.get(name)
        return default if value in (None, "") else value

    state_dir = str(var("cluster_state_dir", "/var/lib/ddp-cluster")).rstrip("/")
    connection = str(var("ansible_connection", "ssh"))
    npu = entry.get("npu") or {}
    settings = npu.get("settings") if isinstance(npu, Mapping) else None
    return {
        "container": str(var("node_container_name", node)),
        "port": int(var("node_container_ssh_port", var("cluster_ssh_port", 12345))),
        "etc_dir": f"{state_dir}/{node}/etc",
        "cluster": str(var("cluster_name", "local")),
        # hosts.yml's condition for cluster_host: every server but the local inventory's bridged nodes.
        "host": connection != "local" or var("cluster_network_mode", "host") == "host",
        "npu_tool": str(var("hccn_network_tool", "/usr/local/Ascend/driver/tools/hccn_tool")),
        "npu_devices": [int(item["device"]) for item in settings or [] if isinstance(item, Mapping)],
    }


@dataclass(frozen=True)
class Survey:
    """The probe's verdict on every node asked: who converges and why, and what each one wanted."""

    decisions: dict[str, Decision]
    wanted: dict[str, dict[str, str]]
    probes: dict[str, Probe]

    @property
    def converge(self) -> list[str]:
        return [node for node, decision in self.decisions.items() if decision.converge]

    def lines(self) -> list[str]:
        return [decision.line() for decision in self.decisions.values() if decision.converge]

    def diff(self, states: Mapping[str, Mapping[str, Any] | None]) -> dict[str, str]:
        """Ansible's diff of the drifted nodes: the recorded state before, the probed one after."""
        before = {node: (states.get(node) or {}).get("actual") for node in self.converge}
        after = {node: dict(self.probes[node].digests) or self.probes[node].error for node in self.converge}
        return {
            "before": json.dumps(before, indent=1, sort_keys=True) + "\n",
            "after": json.dumps(after, indent=1, sort_keys=True) + "\n",
        }


def survey(
    nodes: Sequence[str],
    entries: Mapping[str, Mapping[str, Any]],
    fact: Mapping[str, Any],
    states: Mapping[str, Mapping[str, Any] | None],
    probes: Mapping[str, Probe],
    *,
    meaning: Mapping[str, str] | None = None,
    force: bool = False,
) -> Survey:
    """Decide every node of NODES from its compiled ENTRY, the fact, its recorded state and its probe."""
    wants = {node: wanted(node_inputs(entries.get(node, {})), fact) for node in nodes}
    decisions = {
        node: decide(
            node,
            states.get(node),
            wants[node],
            probes.get(node, Probe(error="not probed")),
            meaning=meaning,
            force=force,
        )
        for node in nodes
    }
    return Survey(decisions, wants, dict(probes))


def read_entry(fact: Mapping[str, Any], node: str) -> dict[str, Any]:
    """NODE's compiled entry (``<fact dir>/nodes/<node>.json``); {} when it cannot be read (the node then
    converges: its inputs read as '')."""
    try:
        loaded = json.loads((Path(str(fact["dir"])) / "nodes" / f"{node}.json").read_text())
    except (OSError, ValueError, KeyError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def records_dir(fact: Mapping[str, Any]) -> Path:
    """Where the state files are: beside the compiled directory, with the node records."""
    return Path(str(fact["dir"])).parent / "nodes"


def record(
    directory: Path,
    found: Survey,
    states: Mapping[str, Mapping[str, Any] | None],
    failed: Iterable[str],
    reason: str,
) -> list[str]:
    """Write the state files after the stages: each node FOUND probed (the ones that converged) with its
    wanted and probed state (a node whose probe failed now is marked not converged), each FAILED node marked
    not converged with REASON. The nodes whose file was written."""
    written = []
    for node, probe in found.probes.items():
        if probe.error:
            wrote = write_state(
                directory,
                node,
                failed_state(
                    states.get(node), f"its state could not be read after it converged: {probe.error}"
                ),
            )
        else:
            wrote = write_state(directory, node, converged_state(found.wanted[node], probe))
        if wrote:
            written.append(node)
    for node in failed:
        if write_state(directory, node, failed_state(read_state(directory, node), reason)):
            written.append(node)
    return written


def probe_nodes(
    nodes: Sequence[str],
    variables: Mapping[str, Mapping[str, Any]],
    entries: Mapping[str, Mapping[str, Any]],
    script: Callable[[Mapping[str, Any]], str],
    parse: Callable[[str], tuple[bool, dict[str, str], dict[str, str]]],
    **ssh: Any,
) -> dict[str, Probe]:
    """Probe NODES at once (:mod:`ddp_cluster.inventory.fanout`): each one's SCRIPT(:func:`probe_spec`) run
    through ``/bin/sh -s`` where its VARIABLES say (ssh as Ansible, or here), its output read by PARSE."""
    jobs = [
        fanout.job(
            node,
            variables[node],
            "/bin/sh -s",
            script(probe_spec(node, variables[node], entries[node])),
            **ssh,
        )
        for node in nodes
    ]
    answers = {name: (done.rc, done.stdout, done.stderr) for name, done in fanout.run_all(jobs).items()}
    return probe_all(list(nodes), lambda _: answers, parse)
