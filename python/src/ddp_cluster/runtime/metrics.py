"""What a training run tells the world: per-rank log lines, rank 0's progress, metrics.jsonl, summary.json.

Every rank prints a few lines of its own to stdout (start, each epoch, end), each prefixed ``[rank R/W]``, so
the launcher's per-rank output files say what each process did. Rank 0 also prints the global progress (a
bar when stdout is a terminal, plain lines otherwise) and writes ``metrics.jsonl``: one JSON object a line,
``"kind": "step"`` every ``--log-every`` steps and ``"kind": "epoch"`` at the end of each epoch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from ddp_cluster.files import write_atomic

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


class Reporter:
    def __init__(self, rank: int, world_size: int, output_dir: Path, stream: TextIO | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.output_dir = output_dir
        self.stream = stream if stream is not None else sys.stdout
        self.is_main = rank == 0
        self.tty = self.is_main and self.stream.isatty()
        self._metrics: TextIO | None = None
        self._bar_open = False

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
            text = f"\repoch {epoch}/{epochs} [{bar}] {batch}/{batches} loss {loss:.4f}"
            self.stream.write(text)
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
        (a run killed mid-epoch logged steps that the resumed run will log again)."""
        if not self.is_main:
            return
        path = self.output_dir / METRICS_FILE
        kept: list[str] = []
        if keep_until_step is not None and path.exists():
            for text in path.read_text().splitlines():
                try:
                    record = json.loads(text)
                except json.JSONDecodeError:
                    continue  # the torn last line of a killed run
                if isinstance(record, dict) and int(record.get("step", 0)) <= keep_until_step:
                    kept.append(text)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._metrics.writelines(text + "\n" for text in kept)
        self._metrics.flush()

    def record(self, record: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.write(json.dumps(record) + "\n")
            self._metrics.flush()

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.is_main:
            write_atomic(self.output_dir / SUMMARY_FILE, (json.dumps(summary, indent=2) + "\n").encode())

    def close(self) -> None:
        self._end_bar()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
