"""A resumed run's metrics.jsonl keeps its records up to the checkpoint's step, read and rewritten a line at a
time, whatever the file holds (ddp_cluster.runtime.metrics.keep_records). No torch."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from ddp_cluster.runtime import metrics


def test_records_up_to_the_step_are_kept_and_lines_that_are_no_record_left_out(tmp_path: Path) -> None:
    path = tmp_path / metrics.METRICS_FILE
    lines = [
        b'{"kind": "step", "step": 1, "loss": 1.0}',
        b'{"kind": "epoch", "epoch": 1}',  # no step: counted as step 0
        b'{"step": 2, "loss": "caf\xe9"}',  # no UTF-8
        b'{"step": "2"}',  # a step that is no whole number
        b"[" * 100_000,  # nested past the parser's depth
        b'{"kind": "step", "step": 3, "loss": 0.5}',
        b'{"kind": "step", "step": 4, "loss": 0.4}',
        b'{"kind": "step", "st',  # the torn last line of a killed run
    ]
    path.write_bytes(b"\n".join(lines))
    assert metrics.keep_records(path, 3) == 3
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"kind": "step", "step": 1, "loss": 1.0},
        {"kind": "epoch", "epoch": 1},
        {"kind": "step", "step": 3, "loss": 0.5},
    ]
    assert [item.name for item in tmp_path.iterdir()] == [metrics.METRICS_FILE]  # no temporary file left


def test_a_huge_file_and_an_enormous_line_are_never_held_whole(tmp_path: Path) -> None:
    path = tmp_path / metrics.METRICS_FILE
    with open(path, "wb") as handle:
        handle.write(b'{"step": 1}\n{"step": 2, "pad": "' + b"z" * 16 * 2**20 + b'"}\n')
        for step in range(3, 60_000):
            handle.write(b'{"step": %d, "loss": 0.1}\n' % step)
    tracemalloc.start()
    try:
        kept = metrics.keep_records(path, 50_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert kept == 1 + (50_000 - 2) and peak < 3 * metrics.MAX_RECORD
    assert path.read_text().splitlines()[:2] == ['{"step": 1}', '{"step": 3, "loss": 0.1}']
