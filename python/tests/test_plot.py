"""``ddp-cluster plot``: a PNG of the loss curve from metrics.jsonl, and clear errors."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.cli import main as ddp_cluster
from ddp_cluster.job import plot

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_metrics(run: Path, lines: list[str]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))


def sample_records() -> list[str]:
    rows = [{"kind": "step", "epoch": 1, "step": s, "loss": 2.0 / s, "samples": 64} for s in range(2, 20, 2)]
    rows += [{"kind": "epoch", "epoch": 1, "step": 10, "loss": 0.5, "test_accuracy": 0.8, "samples": 640}]
    rows += [{"kind": "epoch", "epoch": 2, "step": 20, "loss": 0.2, "test_accuracy": 0.9, "samples": 640}]
    return [json.dumps(row) for row in rows]


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_metrics(tmp_path / "run", sample_records())
    assert ddp_cluster(["plot", str(tmp_path / "run")]) == 0
    png = tmp_path / "run" / "loss.png"
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000
    assert f"wrote {png} (11 records" in capsys.readouterr().out


def test_plot_of_a_run_directory_reads_its_laid_out_output(tmp_path: Path) -> None:
    """runs/<id>/ as train.yml lays it out: metrics.jsonl is in output/, and loss.png goes beside it."""
    write_metrics(tmp_path / "runs" / "j1" / "output", sample_records())
    assert ddp_cluster(["plot", str(tmp_path / "runs" / "j1")]) == 0
    assert (tmp_path / "runs" / "j1" / "output" / "loss.png").read_bytes()[:8] == PNG_MAGIC


def test_plot_to_a_chosen_file_and_from_the_file_itself(tmp_path: Path) -> None:
    write_metrics(tmp_path / "run", sample_records()[:3])  # step records only
    out = tmp_path / "figures" / "curve.png"
    assert ddp_cluster(["plot", str(tmp_path / "run" / "metrics.jsonl"), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_torn_last_line_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_metrics(tmp_path, [*sample_records(), '{"kind": "step", "ep'])
    assert ddp_cluster(["plot", str(tmp_path)]) == 0
    assert "skipping the incomplete last line" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "holds no records"),
        (["not json", *sample_records()], "line 1 is not JSON"),
        (['{"kind": "step", "loss": 1.0}', *sample_records()], "line 1 is not a metrics record"),
        (['{"kind": "epoch", "step": 3, "test_accuracy": 0.5}'], "no loss values to plot"),
    ],
)
def test_bad_metrics_are_explained(
    tmp_path: Path, lines: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write_metrics(tmp_path, lines)
    assert ddp_cluster(["plot", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "loss.png").exists()


def test_missing_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ddp_cluster(["plot", str(tmp_path)]) == 2
    assert "metrics.jsonl not found" in capsys.readouterr().err


def test_an_output_that_cannot_be_written_is_one_line_and_a_bare_name_gets_its_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_metrics(tmp_path, sample_records())
    assert ddp_cluster(["plot", str(tmp_path), "-o", str(tmp_path)]) == 2
    assert f"-o {tmp_path} is a directory: give the PNG file to write" in capsys.readouterr().err
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert ddp_cluster(["plot", str(tmp_path), "-o", str(blocked / "x.png")]) == 2
    said = capsys.readouterr().err
    assert "cannot be written" in said and "Traceback" not in said
    assert ddp_cluster(["plot", str(tmp_path), "-o", str(tmp_path / "curve")]) == 0
    assert f"wrote {tmp_path / 'curve.png'} " in capsys.readouterr().out
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "curve").exists()


def test_missing_matplotlib_is_explained(tmp_path: Path) -> None:
    write_metrics(tmp_path, sample_records())
    code = "import sys; sys.modules['matplotlib'] = None; from ddp_cluster.cli import main; "
    code += "sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", code, "plot", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "needs matplotlib: pip install 'ddp-cluster[plot]'" in result.stderr


def telemetry_file(folder: Path, node: str, records: list[dict[str, object]], tail: str = "") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{node}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def npu_record(node: str, at: float, utilization: float, problem: str | None = None) -> dict[str, object]:
    device = {"index": 0, "kind": "npu", "utilization_percent": utilization, "memory_used_mb": 3000.0,
              "memory_total_mb": 65536.0, "temperature_c": 40.0, "health": "ok", "ecc_uncorrectable": None,
              "link": "up", "problem": problem}  # fmt: skip
    second = device | {"index": 1, "utilization_percent": 0.0, "temperature_c": 50.0}
    processes = {"count": 2, "cpu_percent": 180.0, "rss_mb": 900.0}
    return {"time": at, "node": node, "processes": processes, "devices": [device, second]}


def test_telemetry_is_read_per_node_skipping_torn_lines_and_links(tmp_path: Path) -> None:
    folder = tmp_path / "telemetry"
    telemetry_file(
        folder, "n0", [npu_record("n0", 20.0, 50.0), npu_record("n0", 5.0, 40.0)], tail='{"time": 3'
    )
    (folder / "n1.jsonl").symlink_to(folder / "n0.jsonl")
    found = plot.read_telemetry(folder)
    assert list(found) == ["n0"] and [record["time"] for record in found["n0"]] == [5.0, 20.0]
    assert plot.read_telemetry(tmp_path / "none") == {}


def test_telemetry_series_take_the_devices_mean_sum_and_hottest(tmp_path: Path) -> None:
    records = [npu_record("n0", 60.0, 80.0), npu_record("n0", 120.0, 60.0, problem="health alarm")]
    series = plot.telemetry_series(records, start=0.0)
    assert series["cpu"] == [(1.0, 180.0), (2.0, 180.0)]
    assert series["utilization"] == [(1.0, 40.0), (2.0, 30.0)]
    assert series["memory"] == [(1.0, 6000.0), (2.0, 6000.0)]
    assert series["temperature"] == [(1.0, 50.0), (2.0, 50.0)]
    assert series["problems"] == [(2.0, 30.0)]


@pytest.mark.parametrize("devices", [True, False])
def test_telemetry_is_drawn(tmp_path: Path, devices: bool) -> None:
    records = [npu_record("n0", float(at), 50.0) for at in range(0, 100, 10)]
    if not devices:
        records = [{**record, "devices": []} for record in records]
    out = tmp_path / "out" / "telemetry.png"
    plot.plot_telemetry({"n0": records, "n1": records}, out, title="j: telemetry")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(plot.PlotError, match="no telemetry"):
        plot.plot_telemetry({}, out, title="x")


# --- read in bounded memory, whatever the job wrote ---------------------------------------------------------
def test_a_thinned_stream_keeps_about_its_limit_evenly_with_its_first_and_last() -> None:
    thinned: plot.Thinned[int] = plot.Thinned(100)
    for item in range(100_003):
        thinned.add(item)
    kept = thinned.items()
    assert kept[0] == 0 and kept[-1] == 100_002 and 50 <= len(kept) <= 102
    gaps = {b - a for a, b in itertools.pairwise(kept[:-1])}
    assert gaps == {thinned.stride}  # evenly spread (the last is the stream's, wherever it falls)
    few: plot.Thinned[int] = plot.Thinned(100)
    for item in range(7):
        few.add(item)
    assert few.items() == list(range(7))


def peak_of(call: Any) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_long_metrics_file_is_read_a_line_at_a_time_and_thinned(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as handle:
        for step in range(1, 30_001):
            extra = {"note": "x" * 400} if step % 2 else {}
            handle.write(json.dumps({"kind": "step", "step": step, "loss": 1 / step, **extra}) + "\n")
            if step % 3_000 == 0:
                handle.write(
                    json.dumps({"kind": "epoch", "step": step, "loss": 0.1, "test_accuracy": 0.9}) + "\n"
                )
    records, peak = peak_of(lambda: plot.read_metrics(path, limit=500))
    steps = [record["step"] for record in records if record["kind"] == "step"]
    assert steps[0] == 1 and steps[-1] == 30_000 and len(steps) <= 502
    assert [record["step"] for record in records if record["kind"] == "epoch"] == list(
        range(3_000, 30_001, 3_000)
    )
    assert all(set(record) <= set(plot.PLOTTED) for record in records)  # the rest of a record is not kept
    assert peak < 2 * 2**20  # the file is ~8 MiB
    plot.plot_metrics(records, tmp_path / "loss.png", title="long")
    assert (tmp_path / "loss.png").read_bytes()[:8] == PNG_MAGIC


def test_one_enormous_line_is_named_never_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with open(path, "wb") as handle:
        handle.write(b'{"kind": "step", "step": 1, "loss": 1.0}\n{"step": 2, "pad": "' + b"y" * 20 * 2**20)
        handle.write(b'"}\n{"kind": "step", "step": 3, "loss": 0.5}\n')

    def read() -> None:
        with pytest.raises(plot.PlotError, match=r"line 2 is longer than 1024 KiB, which no record is"):
            plot.read_metrics(path)

    _, peak = peak_of(read)
    assert peak < 3 * plot.MAX_LINE


@pytest.mark.parametrize(
    ("tail", "said"),
    [
        (b'{"step": 2, "loss": "\xff"}\n', "line 2 is not UTF-8 (byte 0xff at 21)"),
        (b"[" * 100_000 + b"\n", "line 2 is not JSON"),
    ],
)
def test_a_line_that_is_no_utf8_or_too_deep_is_named_and_a_torn_last_one_skipped(
    tmp_path: Path, tail: bytes, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "metrics.jsonl"
    first = b'{"kind": "step", "step": 1, "loss": 1.0}\n'
    path.write_bytes(first + tail + first)
    with pytest.raises(plot.PlotError, match=re.escape(said)):
        plot.read_metrics(path)
    path.write_bytes(first + tail.rstrip(b"\n"))  # the last line, cut short by a killed run
    assert plot.read_metrics(path) == [{"kind": "step", "step": 1, "loss": 1.0}]
    assert ddp_cluster(["plot", str(path), "-o", str(tmp_path / "loss.png")]) == 0
    assert "skipping the incomplete last line" in capsys.readouterr().err


def test_a_loss_that_is_no_number_is_left_out_of_the_curve(tmp_path: Path) -> None:
    write_metrics(tmp_path, ['{"step": 1, "loss": "nan?"}', '{"step": 2, "loss": 0.5, "test_accuracy": [1]}'])
    assert plot.read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1}, {"step": 2, "loss": 0.5}]


def test_long_telemetry_is_thinned_and_keeps_every_problem_s_first_sighting(tmp_path: Path) -> None:
    folder = tmp_path / "telemetry"
    records = [npu_record("n0", float(at), 50.0) for at in range(20_000)]
    records[12_345] = npu_record("n0", 12_345.0, 50.0, problem="health alarm")
    records[17_000] = npu_record("n0", 17_000.0, 50.0, problem="health alarm")
    telemetry_file(folder, "n0", records, tail='{"time": "late"}\n[1]\n{"time": NaN}\n{"time": 3')
    (found,) = plot.scan_telemetry(folder, limit=300).values()
    assert found.samples == 20_000 and found.start == 0.0 and len(found.records) <= 302
    assert found.records[-1]["time"] == 19_999.0
    # both devices of the record said it (npu_record gives the second the first's fields)
    assert found.problems == {("0", "health alarm"): 12_345.0, ("1", "health alarm"): 12_345.0}
    assert found.skipped == 3  # the torn last line is not counted: the file was being written


def test_a_node_with_more_problems_than_are_named_says_how_many_more(tmp_path: Path) -> None:
    folder = tmp_path / "telemetry"
    records = []
    for at in range(plot.MAX_PROBLEMS + 7):
        record = npu_record("n0", float(at), 50.0, problem=f"health word{at}")
        records.append(record | {"devices": record["devices"][:1]})  # type: ignore[index]
    telemetry_file(folder, "n0", records)
    (found,) = plot.scan_telemetry(folder).values()
    assert len(found.problems) == plot.MAX_PROBLEMS and found.more_problems == 7
