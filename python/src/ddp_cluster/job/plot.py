"""``ddp-cluster plot DIR [-o OUT.png]``: draw the loss curve of a training run from DIR/metrics.jsonl.

Step records (``"kind": "step"``) give the training loss every few steps; epoch records add the epoch's mean
loss and, on a second axis, the test accuracy. :func:`plot_telemetry` draws a run's telemetry
(runs/<id>/telemetry/NODE.jsonl, :mod:`ddp_cluster.accelerators.telemetry`'s records) per node over time:
the job's CPU use, and on GPU and NPU nodes the devices' utilisation, memory and temperature, a device's
problem marked where it was seen. Needs matplotlib (the ``plot`` extra), not torch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.job import results

METRICS_FILE = "metrics.jsonl"


class PlotError(DdpClusterError):
    pass


def metrics_file(run: Path) -> Path:
    """metrics.jsonl of ``run``: a run directory as train.yml lays it out (its output/), a directory holding
    the file, or the file itself."""
    if not run.is_dir():
        return run
    laid_out = run / results.OUTPUT / METRICS_FILE
    return laid_out if laid_out.is_file() else run / METRICS_FILE


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file. A torn last line (a killed run) is skipped; any other bad line is
    an error naming the file and line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise PlotError(f"cannot read {path}: {error}") from error
    records: list[dict[str, Any]] = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            if number == len(lines):
                print(f"ddp-cluster plot: skipping the incomplete last line of {path}", file=sys.stderr)
                continue
            raise PlotError(f"{path} line {number} is not JSON: {error.msg}") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise PlotError(
                f"{path} line {number} is not a metrics record (an object with an integer 'step')"
            )
        records.append(record)
    return records


def plot_metrics(records: list[dict[str, Any]], out: Path, title: str) -> None:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise PlotError("ddp-cluster plot needs matplotlib: pip install 'ddp-cluster[plot]'") from None
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


def read_telemetry(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Node -> its telemetry records, in time order, from folder/NODE.jsonl (a line that is no record, a
    torn last one among them, is skipped: the files are written while the job runs)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        if path.is_symlink() or not path.is_file():
            continue
        records = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("time"), int | float):
                records.append(record)
        if records:
            found[str(records[0].get("node") or path.stem)] = sorted(records, key=lambda item: item["time"])
    return found


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
        raise PlotError("ddp-cluster plot needs matplotlib: pip install 'ddp-cluster[plot]'") from None
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
        prog="ddp-cluster plot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
    try:
        if not metrics.is_file():
            raise PlotError(
                f"{metrics} not found: give a run directory (with {METRICS_FILE}) or the file itself"
            )
        records = read_metrics(metrics)
        if not records:
            raise PlotError(f"{metrics} holds no records: the run logged nothing yet")
        plot_metrics(records, out, title=f"{metrics.parent.name}: loss")
    except PlotError as error:
        print(f"ddp-cluster plot: error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({len(records)} records from {metrics})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
