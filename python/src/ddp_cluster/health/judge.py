"""The health gate's judgement and report: ``ddp-cluster health RUN_DIR``.

The gate itself (:mod:`ddp_cluster.health.gate`) runs on every rank of a job, under the job's launcher,
environment
and backend, and measures; this module holds what needs no torch: which environment values differ from the
majority, the all-reduce figures as nccl-tests reports them (busbw = algbw x 2(n-1)/n), the ring of node pairs
and the phases that measure it, the verdict, and the table printed on the controller. ``health.json`` carries
the measurements, the thresholds they were judged by and the verdict.

Exit status of ``ddp-cluster health``: 0 when the gate passed, 1 when it failed (the report names the node or
the variable), 2 when there is no readable health.json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_cluster.health import fabric

HEALTH_FILE = "health.json"
# The variables that steer collectives, compared across ranks (with the versions and the device count).
STEERING = re.compile(
    r"^(?:[A-Z0-9_]*_SOCKET_IFNAME|HCCL_[A-Z0-9_]+|NCCL_[A-Z0-9_]+|MASTER_[A-Z0-9_]+|LD_LIBRARY_PATH)$"
)
# Values that are each node's own by design: an interface variable that names the node's cluster interface,
# an HCCL_IF_IP that is one of the node's addresses. They are compared as what they stand for, so that servers
# whose interfaces have different names agree, and a variable pointing elsewhere still stands out.
OWN_INTERFACE = "<the node's cluster interface>"
OWN_ADDRESS = "<an address of the node>"
UNSET = None


def steering_variables(
    environ: Mapping[str, str], interface: str = "", addresses: Sequence[str] = ()
) -> dict[str, str]:
    """The variables of ``environ`` that steer collectives, those naming the node's own interface or address
    replaced by what they stand for (see OWN_INTERFACE, OWN_ADDRESS)."""
    found: dict[str, str] = {}
    for name, value in environ.items():
        if not STEERING.match(name):
            continue
        if name.endswith("_SOCKET_IFNAME") and interface and value == interface:
            value = OWN_INTERFACE
        elif name == "HCCL_IF_IP" and value in addresses:
            value = OWN_ADDRESS
        found[name] = value
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class Difference:
    """One setting that not every rank has the same: the majority's value when more ranks hold it than any
    other value (None: unset), and the ranks that differ from it, each as (node, rank, value); with no
    majority, every rank."""

    name: str
    has_majority: bool
    majority: str | None
    others: tuple[tuple[str, int, str | None], ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "has_majority": self.has_majority,
            "majority": self.majority,
            "others": [{"node": node, "rank": rank, "value": value} for node, rank, value in self.others],
        }


def flatten_report(report: Mapping[str, Any]) -> dict[str, str | None]:
    """A rank's report as the settings compared: its versions and device count, then its variables."""
    flat: dict[str, str | None] = {}
    for name, value in (report.get("versions") or {}).items():
        flat[name] = None if value is None else str(value)
    if report.get("devices") is not None:
        flat["devices"] = str(report["devices"])
    for name, value in (report.get("variables") or {}).items():
        flat[name] = str(value)
    return flat


def parity(reports: Sequence[Mapping[str, Any]], ignore: Sequence[str] = ()) -> list[Difference]:
    """What differs between ranks: for every setting (a version, the device count, a steering variable, unset
    counting as a value), the ranks whose value is not the majority's. With no majority (two nodes that
    disagree) every value is named. ``ignore``: settings whose differences are accepted."""
    flats = [flatten_report(report) for report in reports]
    names = sorted({name for flat in flats for name in flat} - set(ignore))
    differences: list[Difference] = []
    for name in names:
        values = [flat.get(name, UNSET) for flat in flats]
        counts = Counter(values).most_common()
        if len(counts) == 1:
            continue
        top, top_count = counts[0]
        has_majority = top_count > counts[1][1]
        majority = top if has_majority else None
        others = tuple(
            (str(report.get("node", "?")), int(report.get("rank", index)), value)
            for index, (report, value) in enumerate(zip(reports, values, strict=True))
            if not has_majority or value != top
        )
        differences.append(Difference(name, has_majority, majority, others))
    return differences


def busbw_factor(ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor, 2(n-1)/n: what each rank's links carry, comparable across
    rank counts (1 for 2 ranks)."""
    return 2.0 * (ranks - 1) / ranks if ranks > 1 else 0.0


def allreduce_row(nbytes: int, seconds: float, ranks: int, iterations: int) -> dict[str, Any]:
    """One size of the sweep: time per operation (µs), algbw = size / time and busbw = algbw x 2(n-1)/n, GB/s
    (1e9 bytes) as nccl-tests reports them."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return {
        "bytes": nbytes,
        "count": nbytes // 4,
        "iterations": iterations,
        "time_us": round(seconds * 1e6, 1),
        "algbw_gbps": float(f"{algbw:.6g}"),
        "busbw_gbps": float(f"{algbw * busbw_factor(ranks):.6g}"),
    }


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """Message sizes from ``min_bytes`` to ``max_bytes``, each ``factor`` times the last (nccl-tests' -b -e
    -f); each a whole number of float32 elements."""
    if min_bytes < 4 or max_bytes < min_bytes or factor < 2:
        raise ValueError(
            f"sizes {min_bytes}..{max_bytes} x{factor}: need 4 <= min <= max bytes and a factor of 2 or more"
        )
    sizes: list[int] = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size - size % 4)
        size *= factor
    return sizes


def ring_pairs(nodes: int) -> list[tuple[int, int]]:
    """The pairs of neighbours on a ring of ``nodes`` nodes (node i with node i+1, the last with the first):
    every node is in two pairs, so one slow node makes both of its pairs slow and a slow link only one."""
    if nodes < 2:
        return []
    if nodes == 2:
        return [(0, 1)]
    return [(index, (index + 1) % nodes) for index in range(nodes)]


def ring_phases(nodes: int) -> list[list[int]]:
    """The ring's pairs (their indices in :func:`ring_pairs`) in phases where no node is in two pairs at once,
    so that a phase measures all its pairs together: two phases for an even ring, three for an odd one (the
    pair closing the ring alone). The gate's time does not grow with the node count."""
    pairs = ring_pairs(nodes)
    if len(pairs) <= 1:
        return [list(range(len(pairs)))] if pairs else []
    phases: list[list[int]] = [[], []]
    for index in range(len(pairs)):
        if nodes % 2 and index == len(pairs) - 1:
            phases.append([index])
        else:
            phases[index % 2].append(index)
    return phases


def pair_rounds(nodes: int, devices: Sequence[int], together: bool) -> list[list[tuple[int, int]]]:
    """What the gate measures at once: rounds of (pair index in :func:`ring_pairs`, device), phase by phase
    (:func:`ring_phases`). ``together``: every device of a phase in one round, where each device's traffic has
    a NIC and an engine of its own (nccl, hccl). Otherwise one device a round: where the host's cores carry
    every byte (gloo), two devices' pairs at once share them, and a device whose partner is slow leaves the
    cores to the other device's pair of its phase, so that figures measured at once would not be comparable
    (a healthy device judged by a figure taken at half the cores against its siblings' taken alone)."""
    rounds: list[list[tuple[int, int]]] = []
    for phase in ring_phases(nodes):
        batches = [list(devices)] if together else [[device] for device in devices]
        rounds += [[(index, device) for index in phase for device in batch] for batch in batches if batch]
    return rounds


@dataclass(frozen=True)
class Thresholds:
    """When a node or a link fails the gate: below ``fraction`` of the median of its peers, or below the
    absolute ``floor_gbps`` (0: no floor)."""

    fraction: float = 0.5
    floor_gbps: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction={self.fraction} must be above 0 and at most 1 (0.5: half the median)")
        if self.floor_gbps < 0:
            raise ValueError(f"floor_gbps={self.floor_gbps} must be 0 (no floor) or more")


def _device(pair: Mapping[str, Any]) -> int:
    return int(pair.get("device", 0))


def _unit_name(unit: tuple[str, int], devices: int) -> str:
    """A node's device as the report names it: ``node X device 5``, or ``node X`` with one device per node."""
    return f"node {unit[0]}" + (f" device {unit[1]}" if devices > 1 else "")


def _units_link(ends: tuple[tuple[str, int], tuple[str, int]], devices: int) -> str:
    """A link as the report names it: ``a device 5 <-> b device 5``; ``a <-> b`` with one device a node."""
    a, b = ends
    if devices > 1:
        return f"{a[0]} device {a[1]} <-> {b[0]} device {b[1]}"
    return f"{a[0]} <-> {b[0]}"


def _pair_name(pair: Mapping[str, Any], devices: int) -> str:
    return _units_link(((str(pair["a"]), _device(pair)), (str(pair["b"]), _device(pair))), devices)


def judge_pairs(
    nodes: Sequence[str], pairs: Sequence[Mapping[str, Any]], thresholds: Thresholds
) -> tuple[list[dict[str, Any]], list[str]]:
    """Each node device's figure (the busbw of its best pair: a slow device has no good pair, the device next
    to it on the ring still has one) and the problems. A pair joins the same device (local rank) of two
    neighbouring nodes, so every device's own link is measured; with one process per node a unit is a node.

    A unit below ``fraction`` x the median of every unit's figure, or below the floor, is a candidate. It is
    named slow when one of its partners is not a candidate: that partner reached a good figure elsewhere, so
    their slow pair is this unit's doing. A node whose every device is slow is named as a slow node. A
    candidate whose partners are all candidates too (a healthy unit between two slow ones) cannot be told
    from them: it is named as undetermined, never as slow; on a ring of two nodes, where each unit has one
    partner, that pair is named as a slow link. Every unit below the floor is one problem of the whole
    fabric. Then the pairs below ``fraction`` x the median pair, or below the floor, that no candidate
    explains are named as slow links. With two nodes and one device each there is one pair and no peer to
    compare with: only the floor can fail it, as a link. The comparison with the median needs most units
    healthy; the floor does not."""
    devices = len({_device(pair) for pair in pairs}) or 1
    figures: dict[tuple[str, int], float] = {}
    partners: dict[tuple[str, int], set[tuple[str, int]]] = {}
    for pair in pairs:
        device = _device(pair)
        a, b = (str(pair["a"]), device), (str(pair["b"]), device)
        for unit, other in ((a, b), (b, a)):
            figures[unit] = max(figures.get(unit, 0.0), float(pair["busbw_gbps"]))
            partners.setdefault(unit, set()).add(other)
    problems: list[str] = []
    if not figures:
        return [], problems
    median = statistics.median(figures.values())
    unit_kind = "device" if devices > 1 else "node"
    reasons: dict[tuple[str, int], list[str]] = {}
    for unit, figure in figures.items():
        found = []
        if len(figures) > 2 and figure < thresholds.fraction * median:
            found.append(f"{thresholds.fraction:g} x the median {unit_kind} ({median:.3f} GB/s)")
        if len(figures) > 2 and thresholds.floor_gbps and figure < thresholds.floor_gbps:
            found.append(f"the floor of {thresholds.floor_gbps:g} GB/s")
        if found:
            reasons[unit] = found
    candidates = set(reasons)
    order = sorted(
        figures, key=lambda unit: (nodes.index(unit[0]) if unit[0] in nodes else len(nodes), unit[1])
    )
    if candidates and candidates == set(figures):
        # Every unit is below the floor: the fabric itself, or every node, is slow; no node to single out.
        best = max(figures.values())
        problems.append(
            f"every pair is below the floor of {thresholds.floor_gbps:g} GB/s (the best reached"
            f" {best:.3f} GB/s busbw): the fabric, or every node, is slower than the inventory expects"
        )
        rows = [_figure_row(unit, figures[unit], "slow") for unit in order]
        return rows, problems
    verdicts: dict[tuple[str, int], str] = {}
    for unit in order:
        if unit in candidates:
            verdicts[unit] = "slow" if partners[unit] - candidates else "undetermined"
        else:
            verdicts[unit] = "ok"
    explained: set[tuple[tuple[str, int], tuple[str, int]]] = set()
    for node in dict.fromkeys(unit[0] for unit in order):
        units = [unit for unit in order if unit[0] == node]
        if all(verdicts[unit] == "slow" for unit in units):
            best = max(figures[unit] for unit in units)
            every = " on every device" if devices > 1 else ""
            problems.append(
                f"node {node} is slow{every}: its best pair reached {best:.3f} GB/s busbw,"
                f" below {' and '.join(reasons[max(units, key=lambda unit: figures[unit])])}"
            )
            continue
        for unit in units:
            if verdicts[unit] == "slow":
                problems.append(
                    f"{_unit_name(unit, devices)} is slow: its best pair reached {figures[unit]:.3f} GB/s"
                    f" busbw, below {' and '.join(reasons[unit])}"
                )
            elif verdicts[unit] == "undetermined":
                others = sorted(partners[unit])
                if len(others) == 1 and partners.get(others[0]) == {unit}:
                    # Two nodes: this unit's one pair is slow, and either end may be the cause.
                    ends = (min(unit, others[0]), max(unit, others[0]))
                    if ends not in explained:
                        explained.add(ends)
                        problems.append(
                            f"the link {_units_link(ends, devices)} is slow: {figures[unit]:.3f} GB/s busbw,"
                            f" below {' and '.join(reasons[unit])}"
                        )
                    continue
                named = ", ".join(_unit_name(other, devices).removeprefix("node ") for other in others)
                problems.append(
                    f"{_unit_name(unit, devices)} could not be judged: its partners ({named}) are slow too,"
                    f" and its best pair reached {figures[unit]:.3f} GB/s busbw"
                )
    rows = [_figure_row(unit, figures[unit], verdicts[unit]) for unit in order]
    pair_median = statistics.median(float(pair["busbw_gbps"]) for pair in pairs)
    for pair in pairs:
        figure = float(pair["busbw_gbps"])
        pair_ends = {(str(pair["a"]), _device(pair)), (str(pair["b"]), _device(pair))}
        found = []
        if len(pairs) > 2 and figure < thresholds.fraction * pair_median:
            found.append(f"{thresholds.fraction:g} x the median pair ({pair_median:.3f} GB/s)")
        if thresholds.floor_gbps and figure < thresholds.floor_gbps:
            found.append(f"the floor of {thresholds.floor_gbps:g} GB/s")
        if found and not pair_ends & candidates:
            problems.append(
                f"the link {_pair_name(pair, devices)} is slow: {figure:.3f} GB/s busbw,"
                f" below {' and '.join(found)}"
            )
    return rows, problems


def _figure_row(unit: tuple[str, int], figure: float, verdict: str) -> dict[str, Any]:
    return {
        "node": unit[0],
        "device": unit[1],
        "best_pair_busbw_gbps": figure,
        "slow": verdict == "slow",
        "verdict": verdict,
    }


def fabric_problems(found: Sequence[Mapping[str, Any]]) -> list[str]:
    """Nodes whose NCCL fell back to sockets though they have InfiniBand/RoCE adapters with active ports."""
    problems = []
    for node in found:
        problem = fabric.fabric_problem(
            str(node.get("node", "?")),
            fabric.Transport.from_dict(node.get("transport") or {}),
            [fabric.Hca.from_dict(hca) for hca in node.get("hcas") or []],
            node.get("rdma_devices"),
        )
        if problem:
            problems.append(problem)
    return problems


def parity_problems(differences: Sequence[Difference]) -> list[str]:
    problems = []
    for difference in differences:
        others = "; ".join(
            f"node {node} (rank {rank}) has {_shown(value)}" for node, rank, value in difference.others
        )
        if difference.has_majority:
            where = f"the others have {_shown(difference.majority)}"
        else:
            where = "no value is held by a majority"
        problems.append(f"{difference.name} differs: {others}; {where}")
    return problems


def _shown(value: str | None) -> str:
    return "it unset" if value is None else repr(value)


def verdict(health: Mapping[str, Any]) -> dict[str, Any]:
    """The gate's verdict from the measurements in ``health`` (its ``reports``, ``pairs``, ``thresholds``,
    ``ignore``, ``check``): problems in the order a user fixes them (environment, a broken collective, slow
    nodes and links)."""
    thresholds = Thresholds(**health.get("thresholds", {}))
    differences = parity(health.get("reports", []), health.get("ignore", []))
    problems = parity_problems(differences)
    check = health.get("check") or {}
    if check and not check.get("ok", False):
        problems.append(
            f"all-reduce gave wrong sums: expected {check.get('expected')},"
            f" rank(s) {check.get('wrong_ranks')} got {check.get('got')}: the collective itself is broken"
        )
    nodes = [str(node) for node in health.get("nodes", [])]
    node_rows, pair_problems = judge_pairs(nodes, health.get("pairs", []), thresholds)
    problems += pair_problems
    problems += fabric_problems(health.get("fabric") or [])
    return {
        "passed": not problems,
        "problems": problems,
        "differences": [difference.as_dict() for difference in differences],
        "node_figures": node_rows,
    }


def render(health: Mapping[str, Any]) -> str:
    """The report as a user reads it: the verdict, what differs, the all-reduce sweep, the ring's pairs."""
    judged = health.get("verdict") or verdict(health)
    ranks = int(health.get("world_size", 0))
    head = (
        f"health gate {'PASSED' if judged['passed'] else 'FAILED'}: {len(health.get('nodes', []))} node(s), "
        f"{ranks} rank(s), {health.get('backend', '?')} on {health.get('device', '?')}, "
        f"{health.get('launcher', '?')}, {float(health.get('seconds', 0.0)):.1f} s"
    )
    lines = [head]
    if judged["problems"]:
        lines.append("problems:")
        lines += [f"  - {problem}" for problem in judged["problems"]]
    reports = health.get("reports") or []
    if reports:
        first = flatten_report(reports[0])
        agreed = [
            f"{name} {value}"
            for name, value in first.items()
            if not name.isupper()
            and value is not None
            and name not in {d["name"] for d in judged["differences"]}
            and name not in set(health.get("ignore") or [])
        ]
        lines.append("environment: " + (", ".join(agreed) or "no versions reported"))
        compared = sorted({name for report in reports for name in flatten_report(report) if name.isupper()})
        lines.append(
            f"  variables compared across the {len(reports)} ranks: {', '.join(compared) or 'none set'}"
        )
    lines.append(
        f"all-reduce (float32, sum) across {ranks} ranks:"
        if ranks > 1
        else "all-reduce (float32, sum) on one rank: nothing crosses a link, the times are the call's cost:"
    )
    lines.append(
        f"  {'size (B)':>12} {'count':>10} {'iters':>6} {'time (us)':>12}"
        f" {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}"
    )
    for row in health.get("sweep") or []:
        lines.append(
            f"  {row['bytes']:>12} {row['count']:>10} {row['iterations']:>6} {row['time_us']:>12.1f}"
            f" {row['algbw_gbps']:>13.3f} {row['busbw_gbps']:>13.3f}"
        )
    for node in health.get("fabric") or []:
        transport = fabric.Transport.from_dict(node.get("transport") or {})
        adapters = ", ".join(hca["name"] for hca in node.get("hcas") or []) or "none"
        lines.append(
            f"network: node {node.get('node')}: NCCL {fabric.render_transport(transport)};"
            f" InfiniBand/RoCE adapters: {adapters}"
        )
    pairs = health.get("pairs") or []
    if pairs:
        thresholds = health.get("thresholds", {})
        devices = len({_device(pair) for pair in pairs}) or 1
        between = "two nodes' first ranks" if devices == 1 else "the same device (local rank) of two nodes"
        lines.append(
            f"ring pairs (all-reduce of {pairs[0]['bytes']} B between {between}; fails below"
            f" {float(thresholds.get('fraction', 0.5)):g} x the median"
            + (f" or {float(thresholds['floor_gbps']):g} GB/s" if thresholds.get("floor_gbps") else "")
            + "):"
        )
        for pair in sorted(pairs, key=_device):
            lines.append(
                f"  {_pair_name(pair, devices):<40} {pair['time_us']:>12.1f} us"
                f" {pair['busbw_gbps']:>10.3f} GB/s"
            )
    elif len(health.get("nodes", [])) < 2:
        lines.append("ring pairs: none (one node)")
    return "\n".join(lines)


# The most of a gate's results that is read (a gate of 1152 servers writes a few MiB).
HEALTH_MAX = 64 * 1024 * 1024


def load(path: Path) -> dict[str, Any]:
    """health.json of a run directory (its output's, or its own in runs laid out before the output had its own
    folder), or the file itself; ValueError naming what is wrong."""
    file = path
    if path.is_dir():
        file = (
            path / "output" / HEALTH_FILE if (path / "output" / HEALTH_FILE).is_file() else path / HEALTH_FILE
        )
    try:
        with open(file, "rb") as handle:
            raw = handle.read(HEALTH_MAX + 1)
    except FileNotFoundError as error:
        if not path.exists():  # a typo, or a run that is not here: no fault of the gate's
            raise ValueError(
                f"{path} does not exist: give a health gate's run directory (runs/<id>/) or its health.json"
            ) from error
        raise ValueError(f"{file} does not exist: the gate wrote no results (see the run's logs)") from error
    except OSError as error:
        raise ValueError(f"{file} cannot be read as JSON: {error}") from error
    # the file is in the job's directory, which a job's code can write: whatever it holds, a named error
    if len(raw) > HEALTH_MAX:
        raise ValueError(f"{file} is larger than {HEALTH_MAX // 2**20} MiB, which no gate's results are")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{file} cannot be read as JSON: it is not UTF-8 (byte 0x{raw[error.start]:02x} at {error.start})"
        ) from None
    except (ValueError, RecursionError) as error:
        raise ValueError(
            f"{file} cannot be read as JSON: {str(error)[:200] or 'nested too deeply'}"
        ) from None
    if not isinstance(data, dict) or "verdict" not in data:
        raise ValueError(f"{file} is not a health gate's results (no verdict)")
    return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ddp-cluster health",
        description="Print a health gate's results (runs/<id>/health.json); exit 1 when the gate failed.",
    )
    parser.add_argument("run_dir", type=Path, help="the gate's results directory, or its health.json")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    args = parser.parse_args(argv)
    try:
        health = load(args.run_dir)
    except ValueError as error:
        print(f"ddp-cluster health: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(health["verdict"], indent=2))
    else:
        print(render(health))
    return 0 if health["verdict"]["passed"] else 1
