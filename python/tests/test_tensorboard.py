"""TensorBoard's event files from the entrypoint (ddp_cluster.runtime.metrics), read back with TensorBoard's
own event reader: where they go, their tags and steps, a resumed run's curves, and training that goes on
without a writer package or when writing fails.

The tests that write real event files need the train extra (tensorboardX, torch): they are marked ``torch``;
the rest run on a controller without it (the reader, ``tensorboard``, is in requirements/controller.txt)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ddp_cluster.runtime import metrics
from ddp_cluster.runtime.metrics import (
    TENSORBOARD_FLUSH_SECONDS,
    TENSORBOARD_TAGS,
    Reporter,
    TensorBoard,
    tensorboard_dir,
)

SMALL = ["--dataset", "synthetic", "--synthetic-samples", "256", "--batch-size", "32", "--log-every", "3"]
STEP_TAGS = set(TENSORBOARD_TAGS["step"].values())
EPOCH_TAGS = set(TENSORBOARD_TAGS["epoch"].values())


def scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in the directory's event files, as TensorBoard loads them (restarts purged)."""
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def scalars_within(directory: Path, seconds: float, tag: str) -> dict[str, list[tuple[int, float]]]:
    """:func:`scalars` once ``tag`` is there, or at the deadline (the writer's thread makes the directory and
    writes them: TensorBoard's reader takes a directory not made yet for one deleted)."""
    deadline = time.monotonic() + seconds
    while True:
        series = scalars(directory) if directory.is_dir() else {}
        if tag in series or time.monotonic() >= deadline:
            return series
        time.sleep(0.1)


def event_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("events.out.tfevents.*"))


def train(out: Path, *args: str) -> int:
    from ddp_cluster.runtime.train import main

    return main([*SMALL, "--output-dir", str(out), *args])


def records(out: Path, kind: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["kind"] == kind]


def step(number: int, loss: float) -> dict[str, Any]:
    return {"kind": "step", "epoch": 1, "step": number, "loss": loss, "lr": 0.1, "samples_per_s": 100.0}


# -- where, and without a writer ----------------------------------------------------------------------------
def test_the_directory_is_the_launchers_else_under_the_output_else_none(tmp_path: Path) -> None:
    assert tensorboard_dir(tmp_path, {"DDP_TENSORBOARD_DIR": "/j/output/tensorboard"}) == Path(
        "/j/output/tensorboard"
    )
    assert tensorboard_dir(tmp_path, {}) == tmp_path / "tensorboard"  # run by hand
    assert tensorboard_dir(tmp_path, {"DDP_TENSORBOARD_DIR": ""}) is None  # asked for none


def test_without_a_writer_package_it_says_so_once_and_records_go_on(tmp_path: Path) -> None:
    stream = io.StringIO()
    reporter = Reporter(0, 2, tmp_path, stream, tensorboard=tmp_path / "tb", writer_factory=lambda: None)
    reporter.open_metrics(keep_until_step=None)
    for number in (1, 2, 3):
        reporter.record(step(number, 1.0 / number))
    reporter.close()
    lines = stream.getvalue().splitlines()
    warnings = [line for line in lines if "no TensorBoard event files" in line]
    assert len(warnings) == 1 and warnings[0].startswith("[rank 0/2] note: ")
    assert "tensorboardX" in warnings[0] and "training goes on" in warnings[0]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
    assert not (tmp_path / "tb").exists()


class BrokenWriter:
    """A SummaryWriter whose writes fail (a full disk) after the first record."""

    def __init__(self, log_dir: str, **options: Any) -> None:
        self.added = 0
        self.closed = False

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.added += 1
        if self.added > len(TENSORBOARD_TAGS["step"]):
            raise OSError(28, "No space left on device")

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_a_failing_write_is_said_once_and_never_raised(tmp_path: Path) -> None:
    said: list[str] = []
    made: list[BrokenWriter] = []

    def factory(log_dir: str, **options: Any) -> BrokenWriter:
        made.append(BrokenWriter(log_dir, **options))
        return made[-1]

    board = TensorBoard(tmp_path / "tb", said.append, lambda: factory)
    board.open(0)
    for number in (1, 2, 3):
        board.write(step(number, 1.0) | {"step_time_s": 0.1})
    board.close()
    assert len(said) == 1 and "TensorBoard stopped" in said[0] and "No space left on device" in said[0]
    assert "training goes on" in said[0] and made[0].closed and not board.active


def test_other_ranks_write_no_event_files(tmp_path: Path) -> None:
    reporter = Reporter(1, 2, tmp_path, io.StringIO(), tensorboard=tmp_path / "tb")
    reporter.open_metrics(keep_until_step=None)
    reporter.record(step(1, 1.0))
    reporter.close()
    assert not (tmp_path / "tb").exists()


# -- real event files ----------------------------------------------------------------------------------------
@pytest.mark.torch
def test_each_writer_package_writes_what_tensorboard_reads(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from ddp_cluster.runtime.train import summary_writer

    writer = summary_writer()
    assert writer is not None and writer.__module__.startswith("tensorboardX")  # the image's, when present
    for name, factory in (("tensorboardX", writer), ("torch", SummaryWriter)):
        board = TensorBoard(tmp_path / name, pytest.fail, lambda factory=factory: factory)
        board.open(0)
        board.write(step(3, 0.5) | {"step_time_s": 0.01})
        board.write({"kind": "epoch", "step": 8, "loss": 0.4, "test_loss": 0.3, "test_accuracy": 0.9})
        # Before close: what a sync mid-run copies is readable up to here within the flush interval.
        series = scalars_within(tmp_path / name, TENSORBOARD_FLUSH_SECONDS + 2, "eval/accuracy")
        board.close()
        assert series["train/loss"] == [(3, 0.5)], name
        assert series["eval/accuracy"] == [(8, pytest.approx(0.9))], name
        assert set(series) == STEP_TAGS | (EPOCH_TAGS - {"train/epoch_samples_per_s"}), name


@pytest.mark.torch
def test_without_tensorboardx_the_entrypoint_takes_torchs_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from ddp_cluster.runtime.train import summary_writer

    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # as in an image that has tensorboard only (NGC)
    assert summary_writer() is SummaryWriter


@pytest.mark.torch
def test_a_restart_goes_on_from_the_checkpoints_step(tmp_path: Path) -> None:
    # The first attempt logged up to step 12 and was killed; its checkpoint is at step 8. The second attempt
    # writes a file of its own, from step 9 on: the curve has each step once, the second attempt's after 8.
    first = TensorBoard(tmp_path, pytest.fail)
    first.open(0)
    for number in (3, 6, 9, 12):
        first.write(step(number, 1.0))
    first.close()
    second = TensorBoard(tmp_path, pytest.fail)
    second.open(8)
    for number in (9, 12, 15):
        second.write(step(number, 0.5))
    second.close()
    assert len(event_files(tmp_path)) == 2
    assert scalars(tmp_path)["train/loss"] == [(3, 1.0), (6, 1.0), (9, 0.5), (12, 0.5), (15, 0.5)]


# -- the entrypoint ------------------------------------------------------------------------------------------
@pytest.mark.torch
@pytest.mark.usefixtures("no_launcher")
def test_a_run_writes_its_metrics_as_scalars_where_the_launcher_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    board = tmp_path / "job" / "output" / "tensorboard"
    monkeypatch.setenv("DDP_TENSORBOARD_DIR", str(board))
    assert train(tmp_path / "out", "--epochs", "2", "--lr", "0.2") == 0
    assert not (tmp_path / "out" / "tensorboard").exists()
    series = scalars(board)
    assert set(series) == STEP_TAGS | EPOCH_TAGS
    steps, epochs = records(tmp_path / "out", "step"), records(tmp_path / "out", "epoch")
    assert [s for s, _ in series["train/loss"]] == [3, 6, 9, 12, 15] == [r["step"] for r in steps]
    assert [v for _, v in series["train/loss"]] == pytest.approx([r["loss"] for r in steps])
    assert [v for _, v in series["train/learning_rate"]] == pytest.approx([0.2] * 5)
    assert all(v > 0 for _, v in series["train/samples_per_s"] + series["train/step_time_s"])
    # A step's speed in metrics.jsonl and in TensorBoard are the same number.
    assert [v for _, v in series["train/samples_per_s"]] == pytest.approx([r["samples_per_s"] for r in steps])
    assert series["eval/accuracy"] == [(r["step"], pytest.approx(r["test_accuracy"])) for r in epochs]
    assert [s for s, _ in series["eval/accuracy"]] == [8, 16]


@pytest.mark.torch
@pytest.mark.usefixtures("no_launcher")
def test_a_resumed_run_goes_on_from_the_checkpoints_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DDP_TENSORBOARD_DIR", raising=False)  # by hand: under the output directory
    out = tmp_path / "run"
    board = out / "tensorboard"
    assert train(out, "--epochs", "1") == 0  # its checkpoint: step 8
    # An attempt killed after it logged steps 9 and 12 past that checkpoint, which the resumed run logs again.
    killed = TensorBoard(board, pytest.fail)
    killed.open(8)
    for number in (9, 12):
        killed.write(step(number, 99.0))
    killed.close()
    assert train(out, "--epochs", "2", "--resume") == 0
    assert len(event_files(board)) == 3  # one an attempt
    series = scalars(board)
    assert [s for s, _ in series["train/loss"]] == [3, 6, 9, 12, 15]
    assert [s for s, _ in series["eval/accuracy"]] == [8, 16]
    assert [v for _, v in series["train/loss"]] == pytest.approx([r["loss"] for r in records(out, "step")])


@pytest.mark.torch
@pytest.mark.usefixtures("no_launcher")
def test_training_goes_on_without_a_writer_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As in an image without tensorboardX and tensorboard: importing either fails.
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    from ddp_cluster.runtime.train import summary_writer

    assert summary_writer() is None
    assert train(tmp_path, "--epochs", "2") == 0
    out = capsys.readouterr().out
    assert out.count("no TensorBoard event files") == 1, out
    assert len(records(tmp_path, "step")) == 5 and len(records(tmp_path, "epoch")) == 2
    assert not (tmp_path / "tensorboard").exists()


@pytest.mark.torch
@pytest.mark.usefixtures("no_launcher")
def test_an_empty_directory_variable_writes_no_event_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DDP_TENSORBOARD_DIR", "")
    assert train(tmp_path, "--epochs", "1") == 0
    assert not list(tmp_path.rglob("events.out.tfevents.*"))
    assert "TensorBoard" not in capsys.readouterr().out


# -- a writer that dies or hangs never holds training --------------------------------------------------------
class HungWriter:
    """A SummaryWriter on a hung file system: its add_scalar and close never return (until released)."""

    release = threading.Event()

    def __init__(self, log_dir: str, **options: Any) -> None:
        pass

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.release.wait()

    def close(self) -> None:
        self.release.wait()


def test_a_hung_writer_never_blocks_a_write_and_close_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "TENSORBOARD_QUEUE_RECORDS", 5)
    monkeypatch.setattr(metrics, "TENSORBOARD_CLOSE_SECONDS", 0.5)
    monkeypatch.setattr(HungWriter, "release", threading.Event())
    said: list[str] = []
    board = TensorBoard(tmp_path / "tb", said.append, lambda: HungWriter)
    board.open(0)
    started = time.monotonic()
    for number in range(50):
        board.write(step(number, 1.0))
    assert time.monotonic() - started < 0.5
    assert len(said) == 1 and "TensorBoard stopped" in said[0] and "hung file system" in said[0]
    board.close()
    assert time.monotonic() - started < 1.0 and len(said) == 1 and not board.active
    HungWriter.release.set()


def test_a_close_that_hangs_is_said_and_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "TENSORBOARD_CLOSE_SECONDS", 0.3)
    monkeypatch.setattr(HungWriter, "release", threading.Event())
    said: list[str] = []
    board = TensorBoard(tmp_path / "tb", said.append, lambda: HungWriter)
    board.open(0)
    started = time.monotonic()
    board.close()
    assert time.monotonic() - started < 1.0
    assert len(said) == 1 and "could not close" in said[0] and "0.3 s" in said[0]
    HungWriter.release.set()


class DeadThreadWriter:
    """tensorboardX's layout after its writer thread died: a further add_scalar would block forever."""

    def __init__(self, log_dir: str, **options: Any) -> None:
        worker = threading.Thread(target=lambda: None)
        worker.start()
        worker.join()
        self.file_writer = SimpleNamespace(event_writer=SimpleNamespace(_worker=worker, _closed=False))
        self.calls: list[str] = []

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.calls.append("add_scalar")
        threading.Event().wait()  # its full queue

    def close(self) -> None:
        self.calls.append("close")
        threading.Event().wait()


def test_a_writer_whose_thread_died_is_said_and_left_alone(tmp_path: Path) -> None:
    made: list[DeadThreadWriter] = []
    said: list[str] = []
    board = TensorBoard(
        tmp_path / "tb", said.append, lambda: lambda *a, **o: made.append(DeadThreadWriter(*a)) or made[-1]
    )
    board.open(0)
    board.write(step(1, 1.0))
    board.close()
    assert len(said) == 1 and "writer's own thread stopped" in said[0] and "training goes on" in said[0]
    # Never called into it, and its exit handler (tensorboardX closes at exit) finds it closed.
    assert made[0].calls == [] and made[0].file_writer.event_writer._closed


TB_FAIL = """
import resource, sys, threading, time
from pathlib import Path
from ddp_cluster.runtime.metrics import TensorBoard
if sys.argv[2] == "torch":
    from torch.utils.tensorboard import SummaryWriter
else:
    from tensorboardX import SummaryWriter
said = []
board = TensorBoard(Path(sys.argv[1]), said.append, lambda: SummaryWriter)
board.open(0)
time.sleep(0.5)  # the file is open
resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))  # EFBIG on the next writes (SIGXFSZ is ignored)
for number in range(3000):
    board.write({"kind": "step", "step": number, "loss": 1.0, "lr": 0.1, "samples_per_s": 3.0})
    time.sleep(0.001)
board.close()
sys.stderr.write("SAID " + repr(said) + "\\n")
"""


@pytest.mark.torch
@pytest.mark.parametrize("package", ["tensorboardX", "torch"])
def test_an_event_file_that_cannot_be_written_stops_tensorboard_not_training(
    tmp_path: Path, package: str
) -> None:
    # The real packages, past a file size limit: training's writes go on, rank 0 says it once, and the
    # process exits (tensorboardX's exit handler closes its writer: it must not wait on a dead thread).
    done = subprocess.run(
        [sys.executable, "-c", TB_FAIL, str(tmp_path / "tb"), package],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("SAID ")]
    assert said and said[0].count("TensorBoard stopped") == 1, done.stderr[-2000:]
