"""What a training run tells the world: per-rank log lines, rank 0's progress, metrics.jsonl, summary.json and
TensorBoard's event files.

Every rank prints a few lines of its own to stdout (start, each epoch, end), each prefixed ``[rank R/W]``, so
the launcher's per-rank output files say what each process did. Rank 0 also prints the global progress (a
bar when stdout is a terminal, plain lines otherwise) and writes ``metrics.jsonl``: one JSON object a line,
``"kind": "step"`` every ``--log-every`` steps and ``"kind": "epoch"`` at the end of each epoch.

Rank 0 writes the same records as TensorBoard scalars (:class:`TensorBoard`), each at its global step, into
:func:`tensorboard_dir`: ``$DDP_TENSORBOARD_DIR`` (the launcher sets it to ``JOB/output/tensorboard``, which
the collect and ``jobs.yml -e sync=ID`` bring to ``runs/ID/output/tensorboard/``), else
``OUTPUT_DIR/tensorboard``; set but empty, none. The tags, by the record's kind and field
(:data:`TENSORBOARD_TAGS`):

    step    loss -> train/loss, lr -> train/learning_rate, samples_per_s -> train/samples_per_s,
            step_time_s -> train/step_time_s (means over the steps since the last log)
    epoch   loss -> train/epoch_loss, test_loss -> eval/loss, test_accuracy -> eval/accuracy,
            samples_per_s -> train/epoch_samples_per_s
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from ddp_cluster import text
from ddp_cluster.errors import DdpClusterError
from ddp_cluster.files import write_atomic

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
# The longest metrics record a resume keeps (the entrypoint's are a few hundred bytes; a longer line is no
# record of its own, and is never held whole).
MAX_RECORD = 1024 * 1024
TENSORBOARD_VARIABLE = "DDP_TENSORBOARD_DIR"
TENSORBOARD_SUBDIR = "tensorboard"  # under the output directory, when the variable is not set
# The writer's thread writes each event to its file at once and flushes the file at most this many seconds
# later: a sync mid-run sees the steps logged until a second before. No flush of ours at each record: a call
# to tensorboardX's flush does not wait for its thread to have written the events, so it would promise nothing
# more, and it costs some 0.85 ms a record against 0.15 ms for the four scalars.
TENSORBOARD_FLUSH_SECONDS = 1
# What training may get ahead of the writer's thread (records, each a few scalars) before TensorBoard stops:
# a writer that far behind hangs. And what closing waits, at most, for the queued records and the file.
TENSORBOARD_QUEUE_RECORDS = 1000
TENSORBOARD_CLOSE_SECONDS = 10
TENSORBOARD_TAGS: dict[str, dict[str, str]] = {
    "step": {
        "loss": "train/loss",
        "lr": "train/learning_rate",
        "samples_per_s": "train/samples_per_s",
        "step_time_s": "train/step_time_s",
    },
    "epoch": {
        "loss": "train/epoch_loss",
        "test_loss": "eval/loss",
        "test_accuracy": "eval/accuracy",
        "samples_per_s": "train/epoch_samples_per_s",
    },
}

WriterFactory = Callable[..., Any]  # SummaryWriter(log_dir, purge_step=, flush_secs=, filename_suffix=)


def tensorboard_dir(output_dir: Path, environ: Mapping[str, str] | None = None) -> Path | None:
    """Where rank 0 writes its event files: ``$DDP_TENSORBOARD_DIR`` (every rank of a job has it from the
    launcher), else ``OUTPUT_DIR/tensorboard`` (a run by hand); ``DDP_TENSORBOARD_DIR=`` (empty): none."""
    value = (os.environ if environ is None else environ).get(TENSORBOARD_VARIABLE)
    if value is None:
        return output_dir / TENSORBOARD_SUBDIR
    return Path(value) if value.strip() else None


def tensorboardx_writer() -> WriterFactory | None:
    """tensorboardX's SummaryWriter (the image's: it needs only protobuf, some 5 MB with it); None without it.
    The entrypoint falls back on torch's own (``ddp_cluster.runtime.train.summary_writer``): this module
    imports no torch, since the controller reads its names."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter  # type: ignore[no-any-return]


class TensorBoard:
    """Rank 0's event files: each metrics record's numbers as scalars at the record's step
    (:data:`TENSORBOARD_TAGS`), on disk within :data:`TENSORBOARD_FLUSH_SECONDS`.

    It never stops training: without a writer package (a user's own image), or when a write fails (a full
    disk, an NFS error), it says so once on rank 0's log and writes no more. Training never waits on it: the
    writer is opened, written and closed in a thread of ours, fed through a queue of
    :data:`TENSORBOARD_QUEUE_RECORDS` records that :meth:`write` never blocks on (a full queue means the
    writer hangs: a hung file system; TensorBoard then stops), and :meth:`close` waits at most
    :data:`TENSORBOARD_CLOSE_SECONDS`. Why: both writer packages write in a thread of their own behind a queue
    of ten events; when that thread dies (tensorboardX's, on an OSError, without a word) or hangs, their
    ``add_scalar`` and ``close`` block forever, and rank 0 with them, the other ranks waiting in their
    collectives until the stall watchdog.
    """

    def __init__(
        self,
        directory: Path | None,
        warn: Callable[[str], None],
        writer_factory: Callable[[], WriterFactory | None] = tensorboardx_writer,
    ) -> None:
        self.directory = directory
        self._warn = warn
        self._writer_factory = writer_factory
        self._queue: queue.Queue[list[tuple[str, float, int]] | None] | None = None
        self._thread: threading.Thread | None = None
        # Set by our thread, read by training's: (what it was doing, the error or a sentence).
        self._failure: tuple[str, str] | None = None
        self._said = False

    @property
    def active(self) -> bool:
        return self._queue is not None and self._failure is None

    def open(self, start_step: int) -> None:
        """A new event file in the directory (each attempt of a job writes its own). ``start_step``: the step
        training goes on from (0: a fresh run, the checkpoint's on a resume); TensorBoard then drops the
        earlier files' events from the step after it on (the writer's ``purge_step``): those a killed attempt
        logged past its checkpoint, which this run logs again, so a curve goes on from the checkpoint instead
        of holding both."""
        if self.directory is None:
            return
        factory = self._writer_factory()
        if factory is None:
            self._warn(
                "note: no TensorBoard event files: neither tensorboardX nor tensorboard is installed in this "
                "image; training goes on (add tensorboardX to the image's requirements, as "
                "docker/requirements.txt does, to have them)"
            )
            self.directory = None
            return
        self._queue = queue.Queue(TENSORBOARD_QUEUE_RECORDS)
        # A daemon: a writer that hangs for good never keeps the process from exiting.
        self._thread = threading.Thread(
            target=self._run, args=(factory, self.directory, start_step, self._queue), daemon=True
        )
        self._thread.start()

    def write(self, record: Mapping[str, Any]) -> None:
        """Hand the record's scalars to the writer's thread; never blocks."""
        if self._queue is None:
            return
        if self._failure is not None:
            self._stop()
            return
        tags = TENSORBOARD_TAGS.get(str(record.get("kind")), {})
        try:
            step = int(record["step"])
        except (KeyError, TypeError, ValueError):
            return  # not a record of a step: nothing to plot
        scalars = [
            (tag, float(value), step)
            for field, tag in tags.items()
            if isinstance(value := record.get(field), (int, float)) and not isinstance(value, bool)
        ]
        if not scalars:
            return
        try:
            self._queue.put_nowait(scalars)
        except queue.Full:
            self._failure = (
                "write",
                f"its writer is {TENSORBOARD_QUEUE_RECORDS} records behind (a hung file system?)",
            )
            self._stop()

    def close(self) -> None:
        """Write what is queued and close the file, waiting at most :data:`TENSORBOARD_CLOSE_SECONDS`."""
        if self._queue is None or self._thread is None:
            return
        if self._failure is None:
            with contextlib.suppress(queue.Full):  # full: the join below times out and says so
                self._queue.put_nowait(None)
            self._thread.join(TENSORBOARD_CLOSE_SECONDS)
            if self._thread.is_alive() and self._failure is None:
                self._failure = (
                    "close",
                    f"its writer did not finish within {TENSORBOARD_CLOSE_SECONDS} s (a hung file system?)",
                )
        self._stop()

    def _stop(self) -> None:
        """Say the failure once and write no more; our thread, if it still runs, is left to itself."""
        self._queue = None
        if self._failure is not None and not self._said:
            self._said = True
            action, error = self._failure
            self._warn(
                f"note: TensorBoard stopped: could not {action} an event file in {self.directory} ({error}); "
                "training goes on, metrics.jsonl has every record"
            )

    # -- our writer thread ---------------------------------------------------------------------------------
    def _run(
        self,
        factory: WriterFactory,
        directory: Path,
        start_step: int,
        records: queue.Queue[list[tuple[str, float, int]] | None],
    ) -> None:
        action = "open"
        writer: Any = None
        try:
            directory.mkdir(parents=True, exist_ok=True)
            # A suffix of nanoseconds: two attempts started in the same second on one host (the writers name
            # files by the second and the host) still get two files, in the order they started.
            writer = factory(
                str(directory),
                purge_step=start_step + 1,
                flush_secs=TENSORBOARD_FLUSH_SECONDS,
                filename_suffix=f".{time.time_ns()}",
            )
            action = "write"
            while (scalars := records.get()) is not None:
                for tag, value, step in scalars:
                    _check_writer_thread(writer)
                    writer.add_scalar(tag, value, step)
            action = "close"
            _check_writer_thread(writer)
            writer.close()
        except Exception as error:  # whatever the writer raises, training goes on
            self._failure = (action, f"{type(error).__name__}: {error}")
            if writer is not None:
                _abandon(writer)


class WriterThreadDied(DdpClusterError):
    """The writer package's own thread stopped (its error went to stderr)."""


def _writer_thread(writer: Any) -> Any:
    """The writer package's thread that writes the event file, if this version is known; else None.
    tensorboardX: ``writer.file_writer.event_writer._worker``; torch's (tensorboard's):
    ``writer.file_writer.event_writer._async_writer._worker``. Internals: every step is guarded."""
    event_writer = getattr(getattr(writer, "file_writer", None), "event_writer", None)
    if event_writer is None:
        return None
    holder = getattr(event_writer, "_async_writer", event_writer)
    return getattr(holder, "_worker", None)


def _check_writer_thread(writer: Any) -> None:
    """Raise when the writer package's thread has died: a write after that would queue until its queue is
    full and then block forever."""
    thread = _writer_thread(writer)
    if thread is None:
        return
    exception = getattr(thread, "exception", None)  # tensorboard's thread keeps its error
    if isinstance(exception, BaseException):
        raise WriterThreadDied(f"{type(exception).__name__}: {exception}")
    is_alive = getattr(thread, "is_alive", None)
    if callable(is_alive) and not is_alive():
        raise WriterThreadDied(
            "the writer's own thread stopped (its error is on stderr: a full disk, a file size limit?)"
        )


def _abandon(writer: Any) -> None:
    """Leave a failed writer for good: close it only if its thread still runs (closing one whose thread died
    waits forever on its full queue), and mark its event writer closed, so that tensorboardX's exit handler,
    which closes it too, does not hang the process's exit."""
    thread = _writer_thread(writer)
    is_alive = getattr(thread, "is_alive", None)
    if thread is None or (callable(is_alive) and is_alive()):
        with contextlib.suppress(Exception):  # the failure is what the log says
            writer.close()
    event_writer = getattr(getattr(writer, "file_writer", None), "event_writer", None)
    if event_writer is not None and hasattr(event_writer, "_closed"):
        with contextlib.suppress(Exception):
            event_writer._closed = True


class Reporter:
    def __init__(
        self,
        rank: int,
        world_size: int,
        output_dir: Path,
        stream: TextIO | None = None,
        tensorboard: Path | None = None,
        writer_factory: Callable[[], WriterFactory | None] = tensorboardx_writer,
    ) -> None:
        """``tensorboard``: the event files' directory (:func:`tensorboard_dir`; rank 0 writes there); None:
        none."""
        self.rank = rank
        self.world_size = world_size
        self.output_dir = output_dir
        self.stream = stream if stream is not None else sys.stdout
        self.is_main = rank == 0
        self.tty = self.is_main and self.stream.isatty()
        self._metrics: TextIO | None = None
        self._bar_open = False
        self.tensorboard = TensorBoard(tensorboard if self.is_main else None, self.line, writer_factory)

    # -- lines -----------------------------------------------------------------------------------------
    def line(self, message: str) -> None:
        """A line of this rank's own log (every rank)."""
        self._end_bar()
        print(f"[rank {self.rank}/{self.world_size}] {message}", file=self.stream, flush=True)

    def main_line(self, message: str) -> None:
        """A line about the whole job (rank 0 only)."""
        if self.is_main:
            self.line(message)

    def progress(self, epoch: int, epochs: int, batch: int, batches: int, loss: float) -> None:
        if not self.is_main:
            return
        if self.tty:
            width = 30
            filled = width * batch // max(batches, 1)
            bar = "#" * filled + "." * (width - filled)
            bar_line = f"\repoch {epoch}/{epochs} [{bar}] {batch}/{batches} loss {loss:.4f}"
            self.stream.write(bar_line)
            self.stream.flush()
            self._bar_open = True
        else:
            self.line(f"epoch {epoch}/{epochs} batch {batch}/{batches} loss {loss:.4f}")

    def _end_bar(self) -> None:
        if self._bar_open:
            self.stream.write("\n")
            self._bar_open = False

    # -- files (rank 0) ----------------------------------------------------------------------------------
    def open_metrics(self, keep_until_step: int | None) -> None:
        """Start metrics.jsonl: empty for a fresh run; on resume, keep the records up to the checkpoint's step
        (a run killed mid-epoch logged steps that the resumed run will log again). Open a new event file too,
        whose curves go on from that step (:meth:`TensorBoard.open`)."""
        if not self.is_main:
            return
        path = self.output_dir / METRICS_FILE
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if keep_until_step is not None and path.is_file():
            keep_records(path, keep_until_step)
            self._metrics = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        else:
            self._metrics = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self.tensorboard.open(keep_until_step or 0)

    def record(self, record: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.write(json.dumps(record) + "\n")
            self._metrics.flush()
        self.tensorboard.write(record)

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.is_main:
            write_atomic(self.output_dir / SUMMARY_FILE, (json.dumps(summary, indent=2) + "\n").encode())

    def close(self) -> None:
        self._end_bar()
        self.tensorboard.close()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None


def keep_records(path: Path, until_step: int) -> int:
    """Rewrite metrics.jsonl ``path`` with only its records up to ``until_step`` (a record without a step
    counts as step 0), read and written a line at a time (the file may be of any size), replaced atomically;
    a line that is no record (the torn last line of a killed run, bytes that are no UTF-8 or no JSON, a
    step that is no whole number, a line longer than :data:`MAX_RECORD`) is left out. How many were kept."""
    kept = 0
    temporary = path.with_name(f".{path.name}.resume-{os.getpid()}")
    try:
        with open(path, "rb") as old, open(temporary, "wb") as new:
            for line in text.lines(old, MAX_RECORD):
                if line.cut:
                    continue
                try:
                    record = json.loads(line.data.decode("utf-8"))
                except (ValueError, RecursionError):
                    continue
                step = record.get("step", 0) if isinstance(record, dict) else None
                if isinstance(step, int) and not isinstance(step, bool) and step <= until_step:
                    new.write(line.data + b"\n")
                    kept += 1
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return kept
