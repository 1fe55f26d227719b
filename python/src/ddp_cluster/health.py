"""The health gate's judgement and report: ``ddp-cluster health RUN_DIR``.

The gate itself (:mod:`ddp_cluster.gate`) runs on every rank of a job, under the job's launcher, environment
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


def judge_pairs(
    nodes: Sequence[str], pairs: Sequence[Mapping[str, Any]], thresholds: Thresholds
) -> tuple[list[dict[str, Any]], list[str]]:
    """Each node's figure (the busbw of its best pair: a slow node has no good pair, a node next to it still
    has one) and the problems.

    A node below ``fraction`` x the median of the nodes' figures, or below the floor, is a candidate. It is
    named slow when one of its partners is not a candidate: that partner reached a good figure elsewhere, so
    their slow pair is this node's doing. A candidate whose partners are all candidates too (a healthy node
    between two slow ones) cannot be told from them: it is named as undetermined, never as slow. Every node
    below the floor is one problem of the whole fabric. Then the pairs below ``fraction`` x the median pair,
    or below the floor, that no candidate explains are named as slow links. With two nodes there is one pair
    and no peer to compare with: only the floor can fail it, as a link. The comparison with the median needs
    most nodes healthy; the floor does not."""
    figures: dict[str, float] = {}
    partners: dict[str, set[str]] = {}
    for pair in pairs:
        for node, other in ((pair["a"], pair["b"]), (pair["b"], pair["a"])):
            figures[node] = max(figures.get(node, 0.0), float(pair["busbw_gbps"]))
            partners.setdefault(node, set()).add(other)
    problems: list[str] = []
    if not figures:
        return [], problems
    median = statistics.median(figures.values())
    reasons: dict[str, list[str]] = {}
    for node, figure in figures.items():
        found = []
        if len(figures) > 2 and figure < thresholds.fraction * median:
            found.append(f"{thresholds.fraction:g} x the median node ({median:.3f} GB/s)")
        if len(figures) > 2 and thresholds.floor_gbps and figure < thresholds.floor_gbps:
            found.append(f"the floor of {thresholds.floor_gbps:g} GB/s")
        if found:
            reasons[node] = found
    candidates = set(reasons)
    if candidates and candidates == set(figures):
        # Every node is below the floor: the fabric itself, or every node, is slow; no node to single out.
        best = max(figures.values())
        problems.append(
            f"every pair is below the floor of {thresholds.floor_gbps:g} GB/s (the best reached"
            f" {best:.3f} GB/s busbw): the fabric, or every node, is slower than the inventory expects"
        )
        rows = [
            {"node": node, "best_pair_busbw_gbps": figures[node], "slow": True, "verdict": "slow"}
            for node in nodes
            if node in figures
        ]
        return rows, problems
    node_rows: list[dict[str, Any]] = []
    for node in nodes:
        if node not in figures:
            continue
        verdict = "ok"
        if node in candidates:
            verdict = "slow" if partners[node] - candidates else "undetermined"
            if verdict == "slow":
                problems.append(
                    f"node {node} is slow: its best pair reached {figures[node]:.3f} GB/s busbw,"
                    f" below {' and '.join(reasons[node])}"
                )
            else:
                problems.append(
                    f"node {node} could not be judged: its partners ({', '.join(sorted(partners[node]))}) are"
                    f" slow too, and its best pair reached {figures[node]:.3f} GB/s busbw"
                )
        node_rows.append(
            {
                "node": node,
                "best_pair_busbw_gbps": figures[node],
                "slow": verdict == "slow",
                "verdict": verdict,
            }
        )
    pair_median = statistics.median(float(pair["busbw_gbps"]) for pair in pairs)
    for pair in pairs:
        figure = float(pair["busbw_gbps"])
        found = []
        if len(pairs) > 2 and figure < thresholds.fraction * pair_median:
            found.append(f"{thresholds.fraction:g} x the median pair ({pair_median:.3f} GB/s)")
        if thresholds.floor_gbps and figure < thresholds.floor_gbps:
            found.append(f"the floor of {thresholds.floor_gbps:g} GB/s")
        if found and not {pair["a"], pair["b"]} & candidates:
            problems.append(
                f"the link {pair['a']} <-> {pair['b']} is slow: {figure:.3f} GB/s busbw,"
                f" below {' and '.join(found)}"
            )
    return node_rows, problems


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
    pairs = health.get("pairs") or []
    if pairs:
        thresholds = health.get("thresholds", {})
        lines.append(
            f"ring pairs (all-reduce of {pairs[0]['bytes']} B between two nodes' first ranks; fails below"
            f" {float(thresholds.get('fraction', 0.5)):g} x the median"
            + (f" or {float(thresholds['floor_gbps']):g} GB/s" if thresholds.get("floor_gbps") else "")
            + "):"
        )
        for pair in pairs:
            lines.append(
                f"  {pair['a'] + ' <-> ' + pair['b']:<40} {pair['time_us']:>12.1f} us"
                f" {pair['busbw_gbps']:>10.3f} GB/s"
            )
    elif len(health.get("nodes", [])) < 2:
        lines.append("ring pairs: none (one node)")
    return "\n".join(lines)


def load(path: Path) -> dict[str, Any]:
    """health.json of a run directory (or the file itself); ValueError naming what is wrong."""
    file = path / HEALTH_FILE if path.is_dir() else path
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError as error:
        raise ValueError(f"{file} does not exist: the gate wrote no results (see the run's logs)") from error
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{file} cannot be read as JSON: {error}") from error
    if not isinstance(data, dict) or "verdict" not in data:
        raise ValueError(f"{file} is not a health gate's results (no verdict)")
    return data


def cli(argv: Sequence[str]) -> int:
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
