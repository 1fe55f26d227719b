"""``ddp-cluster plot DIR [-o OUT.png]``: draw the loss curve of a training run from DIR/output/metrics.jsonl
(DIR: runs/<job-id>/; or a directory holding metrics.jsonl, or the file itself).

Step records (``"kind": "step"``) give the training loss every few steps; epoch records add the epoch's mean
loss and, on a second axis, the test accuracy. :func:`plot_telemetry` draws a run's telemetry
(runs/<id>/telemetry/NODE.jsonl, :mod:`ddp_cluster.accelerators.telemetry`'s records) per node over time:
the job's CPU use, and on GPU and NPU nodes the devices' utilisation, memory and temperature, a device's
problem marked where it was seen. Needs matplotlib (the ``plot`` extra), not torch.

Both files are the job's to write, as long as it likes: they are read a line at a time (a line longer than
:data:`MAX_LINE` is no record), and what is kept is thinned evenly to at most :data:`MAX_POINTS` points a
curve (:class:`Thinned`: every k-th record, k doubling as the file goes on, the last one always), so a
multi-gigabyte file costs the reader a few megabytes, however long the run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from ddp_cluster import text
from ddp_cluster.errors import DdpClusterError
from ddp_cluster.job import results
from ddp_cluster.text import plain

METRICS_FILE = "metrics.jsonl"
# The most points one curve is drawn with (a plot 800 pixels wide shows no more), and the longest line a
# record may be (the entrypoint's are a few hundred bytes; a telemetry record of 16 devices a few KiB).
MAX_POINTS = 4000
MAX_LINE = 1024 * 1024
# The fields of a metrics record the loss curve draws: the rest of each is not kept.
PLOTTED = ("kind", "epoch", "step", "loss", "test_accuracy")
# The most device problems named per node (each its first sighting); a node with more says how many more.
MAX_PROBLEMS = 50

T = TypeVar("T")


class PlotError(DdpClusterError):
    pass


class NoPlotter(PlotError):
    """matplotlib is not installed: no fault of the input (exit 1, not 2)."""


def metrics_file(run: Path) -> Path:
    """metrics.jsonl of ``run``: a run directory as train.yml lays it out (its output/), a directory holding
    the file, or the file itself."""
    if not run.is_dir():
        return run
    laid_out = run / results.OUTPUT / METRICS_FILE
    return laid_out if laid_out.is_file() else run / METRICS_FILE


class Thinned(Generic[T]):
    """At most about ``limit`` items of a stream of any length, evenly spread: every ``stride``-th is kept,
    and when more than ``limit`` are kept every other one is dropped and the stride doubles; the stream's
    last item is always among :meth:`items`."""

    def __init__(self, limit: int = MAX_POINTS) -> None:
        self.limit = max(2, limit)
        self.kept: list[T] = []
        self.stride = 1
        self.seen = 0
        self._last: tuple[T] | None = None

    def add(self, item: T) -> None:
        if self.seen % self.stride == 0:
            self.kept.append(item)
            if len(self.kept) > self.limit:
                self.kept = self.kept[::2]
                self.stride *= 2
        self.seen += 1
        self._last = (item,)

    def items(self) -> list[T]:
        if self._last is None or (self.kept and self.kept[-1] is self._last[0]):
            return list(self.kept)
        return [*self.kept, self._last[0]]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class _Record:
    """One line of a JSON-lines file that is not blank: its number, its JSON (None: ``wrong`` says why it
    has none), whether it ended with a newline (a torn last line does not)."""

    number: int
    value: Any
    wrong: str = ""
    ended: bool = True


def _records(handle: Any) -> Iterator[_Record]:
    """Each line of an open JSON-lines file that is not blank, read a line at a time."""
    for line in text.lines(handle, MAX_LINE):
        number, ended = line.number, line.ended
        if line.cut:
            yield _Record(number, None, f"is longer than {MAX_LINE // 1024} KiB, which no record is", ended)
            continue
        try:
            said = line.data.decode("utf-8")
        except UnicodeDecodeError as error:
            wrong = f"is not UTF-8 (byte 0x{line.data[error.start]:02x} at {error.start})"
            yield _Record(number, None, wrong, ended)
            continue
        if not said.strip():
            continue
        try:
            yield _Record(number, json.loads(said), "", ended)
        except json.JSONDecodeError as error:
            yield _Record(number, None, f"is not JSON: {error.msg}", ended)
        except (ValueError, RecursionError) as error:
            yield _Record(number, None, f"is not JSON: {str(error)[:100] or type(error).__name__}", ended)


def read_metrics(path: Path, limit: int = MAX_POINTS) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file that the curve draws (:data:`PLOTTED` fields, a loss or accuracy
    that is no number left out), read a line at a time and thinned to about ``limit`` of each kind (see the
    module's text). A torn last line (a killed run) is skipped; any other bad line is an error naming the
    file and line."""
    steps: Thinned[tuple[int, dict[str, Any]]] = Thinned(limit)
    epochs: Thinned[tuple[int, dict[str, Any]]] = Thinned(limit)
    order = 0
    pending = ""  # a line that is no record: an error, unless it is the file's last
    try:
        with open(path, "rb") as handle:
            for line in _records(handle):
                if pending:
                    raise PlotError(pending)
                number, record = line.number, line.value
                if line.wrong:
                    pending = f"{path} line {number} {line.wrong}"
                    continue
                if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                    raise PlotError(
                        f"{path} line {number} is not a metrics record (an object with an integer 'step')"
                    )
                kept = {key: record[key] for key in PLOTTED if key in record}
                for key in ("loss", "test_accuracy"):
                    if key in kept and kept[key] is not None and not _number(kept[key]):
                        del kept[key]
                order += 1
                (epochs if kept.get("kind") == "epoch" else steps).add((order, kept))
    except OSError as error:
        raise PlotError(f"cannot read {path}: {error}") from error
    if pending:
        print(f"ddp-cluster plot: skipping the incomplete last line of {path}", file=sys.stderr)
    return [record for _, record in sorted([*steps.items(), *epochs.items()], key=lambda pair: pair[0])]


def plot_metrics(records: list[dict[str, Any]], out: Path, title: str) -> None:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise NoPlotter("ddp-cluster plot needs matplotlib: pip install 'ddp-cluster[plot]'") from None
    matplotlib.use("Agg")  # files only: no display on a controller or in a container
    pyplot = importlib.import_module("matplotlib.pyplot")

    steps = [r for r in records if r.get("kind", "step") == "step" and "loss" in r]
    epochs = [r for r in records if r.get("kind") == "epoch" and "loss" in r]
    if not steps and not epochs:
        raise PlotError("no loss values to plot: the metrics hold no step or epoch record with a 'loss'")
    figure, loss_axis = pyplot.subplots(figsize=(8, 4.5))
    if steps:
        loss_axis.plot([r["step"] for r in steps], [r["loss"] for r in steps], label="training loss", lw=1)
    if epochs:
        loss_axis.plot(
            [r["step"] for r in epochs], [r["loss"] for r in epochs], "o-", label="epoch mean loss", lw=1.5
        )
    loss_axis.set_xlabel("optimizer step")
    loss_axis.set_ylabel("cross-entropy loss")
    loss_axis.grid(alpha=0.3)
    handles, labels = loss_axis.get_legend_handles_labels()
    accuracy = [r for r in epochs if r.get("test_accuracy") is not None]
    if accuracy:
        accuracy_axis = loss_axis.twinx()
        accuracy_axis.plot(
            [r["step"] for r in accuracy], [r["test_accuracy"] for r in accuracy], "s--", color="tab:green",
            label="test accuracy",
        )  # fmt: skip
        accuracy_axis.set_ylabel("test accuracy")
        accuracy_axis.set_ylim(0, 1)
        more_handles, more_labels = accuracy_axis.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    loss_axis.legend(handles, labels, loc="upper right")
    loss_axis.set_title(title)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    pyplot.close(figure)


@dataclass
class NodeTelemetry:
    """One node's telemetry file, read a line at a time: its records thinned to about :data:`MAX_POINTS`
    (in time order), how many there were, the earliest time, each device problem's first sighting (device
    index, what -> time; at most :data:`MAX_PROBLEMS`, ``more_problems`` the others), the lines that were no
    record."""

    records: list[dict[str, Any]] = field(default_factory=list)
    samples: int = 0
    start: float = math.inf
    problems: dict[tuple[str, str], float] = field(default_factory=dict)
    more_problems: int = 0
    skipped: int = 0


def scan_telemetry(folder: Path, limit: int = MAX_POINTS) -> dict[str, NodeTelemetry]:
    """Node -> its telemetry (:class:`NodeTelemetry`), from folder/NODE.jsonl (a line that is no record, a
    torn last one among them, is skipped and counted: the files are written while the job runs); a file
    that is a link, or that holds no record, is left out."""
    found: dict[str, NodeTelemetry] = {}
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() and not folder.is_symlink() else []:
        if path.is_symlink() or not path.is_file():
            continue
        node = NodeTelemetry()
        kept: Thinned[dict[str, Any]] = Thinned(limit)
        name = ""
        try:
            with open(path, "rb") as handle:
                for line in _records(handle):
                    record = line.value
                    at = record.get("time") if isinstance(record, dict) else None
                    if not isinstance(at, int | float) or isinstance(at, bool) or not math.isfinite(at):
                        node.skipped += line.ended  # a torn last line is the file being written
                        continue
                    name = name or (record["node"] if isinstance(record.get("node"), str) else "")
                    node.samples += 1
                    node.start = min(node.start, float(at))
                    _note_problems(node, record, float(at))
                    kept.add(record)
        except OSError:
            continue
        if node.samples:
            node.records = sorted(kept.items(), key=lambda item: float(item["time"]))
            found[name or path.stem] = node
    return found


def _note_problems(node: NodeTelemetry, record: dict[str, Any], at: float) -> None:
    for device in _list(record.get("devices")):
        said = device.get("problem") if isinstance(device, dict) else None
        if not said:
            continue
        key = (str(device.get("index")), str(said)[:200])
        if key in node.problems:
            node.problems[key] = min(node.problems[key], at)
        elif len(node.problems) < MAX_PROBLEMS:
            node.problems[key] = at
        else:
            node.more_problems += 1


def read_telemetry(folder: Path, limit: int = MAX_POINTS) -> dict[str, list[dict[str, Any]]]:
    """Node -> its telemetry records, in time order, thinned to about ``limit`` (:func:`scan_telemetry`)."""
    return {node: found.records for node, found in scan_telemetry(folder, limit).items()}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _devices(record: dict[str, Any], key: str) -> list[float]:
    devices = _list(record.get("devices"))
    return [
        float(item[key])
        for item in devices
        if isinstance(item, dict) and isinstance(item.get(key), int | float)
    ]


def telemetry_series(records: list[dict[str, Any]], start: float) -> dict[str, list[tuple[float, float]]]:
    """One node's series, (minutes since ``start``, value): cpu (% of one core, the job's processes), rss
    (MiB), utilization (the devices' mean, %), memory (the devices' sum, MB), temperature (the hottest
    device, C), problems (the times a device had one, at its utilisation)."""
    series: dict[str, list[tuple[float, float]]] = {
        name: [] for name in ("cpu", "rss", "utilization", "memory", "temperature", "problems")
    }
    for record in records:
        minute = (float(record["time"]) - start) / 60
        found = record.get("processes")
        processes: dict[str, Any] = found if isinstance(found, dict) else {}
        for name, key in (("cpu", "cpu_percent"), ("rss", "rss_mb")):
            if isinstance(processes.get(key), int | float):
                series[name].append((minute, float(processes[key])))
        utilization = _devices(record, "utilization_percent")
        if utilization:
            series["utilization"].append((minute, sum(utilization) / len(utilization)))
        if memory := _devices(record, "memory_used_mb"):
            series["memory"].append((minute, sum(memory)))
        if temperature := _devices(record, "temperature_c"):
            series["temperature"].append((minute, max(temperature)))
        devices = _list(record.get("devices"))
        if any(isinstance(item, dict) and item.get("problem") for item in devices):
            series["problems"].append((minute, sum(utilization) / len(utilization) if utilization else 0.0))
    return series


def plot_telemetry(telemetry: dict[str, list[dict[str, Any]]], out: Path, title: str) -> None:
    """Draw ``telemetry`` (:func:`read_telemetry`) into ``out``: one panel per figure, one line per node."""
    if not telemetry:
        raise PlotError("no telemetry to plot: no node's records")
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise NoPlotter("ddp-cluster plot needs matplotlib: pip install 'ddp-cluster[plot]'") from None
    matplotlib.use("Agg")
    pyplot = importlib.import_module("matplotlib.pyplot")
    start = min(records[0]["time"] for records in telemetry.values())
    series = {node: telemetry_series(records, start) for node, records in sorted(telemetry.items())}
    devices = any(found["utilization"] or found["memory"] for found in series.values())
    panels = (
        [
            ("cpu", "job CPU (% of a core)"),
            ("utilization", "device utilisation (%)"),
            ("memory", "device memory (MB)"),
            ("temperature", "hottest device (C)"),
        ]
        if devices
        else [("cpu", "job CPU (% of a core)"), ("rss", "job memory (MiB)")]
    )
    figure, axes = pyplot.subplots(len(panels), 1, figsize=(8, 2.2 * len(panels) + 0.8), sharex=True)
    for axis, (name, label) in zip(axes, panels, strict=True):
        for node, found in series.items():
            if found[name]:
                line = axis.plot(*zip(*found[name], strict=True), label=node, lw=1)
                if name == "utilization" and found["problems"]:
                    axis.plot(
                        *zip(*found["problems"], strict=True), "x", color=line[0].get_color(), ms=8,
                        label=f"{node}: device problem",
                    )  # fmt: skip
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize="small")
    if devices:
        axes[1].legend(loc="upper right", fontsize="small")
    axes[-1].set_xlabel("minutes since the first sample")
    axes[0].set_title(title)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    pyplot.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ddp-cluster plot",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "run", type=Path, help="a run directory (runs/<id>/: its output/metrics.jsonl), or the file itself"
    )
    parser.add_argument(
        "-o", "--output", type=Path, help="the PNG to write (default: loss.png beside metrics.jsonl)"
    )
    args = parser.parse_args(argv)
    metrics = metrics_file(args.run)
    out = args.output or metrics.parent / "loss.png"
    if not out.suffix and not out.is_dir():  # what matplotlib writes for a name without one
        out = out.with_name(f"{out.name}.png")
    try:
        if not metrics.is_file():
            raise PlotError(
                f"{metrics} not found: give a run directory (with {METRICS_FILE}) or the file itself"
            )
        if out.is_dir():
            raise PlotError(f"-o {out} is a directory: give the PNG file to write (e.g. {out / 'loss.png'})")
        records = read_metrics(metrics)
        if not records:
            raise PlotError(f"{metrics} holds no records: the run logged nothing yet")
        try:
            plot_metrics(records, out, title=f"{metrics.parent.name}: loss")
        except OSError as error:
            raise PlotError(
                f"{out} cannot be written ({error.strerror or error}): give -o a path you can write"
            ) from None
    except PlotError as error:
        print(f"ddp-cluster plot: error: {error}", file=sys.stderr)
        return 1 if isinstance(error, NoPlotter) else 2
    print(f"wrote {out} ({len(records)} records from {metrics})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
