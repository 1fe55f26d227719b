"""Files a job could write, read defensively on the controller: a gate's health.json, a sample's /proc lines
of the job's processes. Whatever they hold: a named error, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_cluster.accelerators import telemetry
from ddp_cluster.health import judge


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b'{"verdict": "\xff"}', "cannot be read as JSON: it is not UTF-8 (byte 0xff at 13)"),
        (b"[" * 100_000, "cannot be read as JSON: "),
        (b"{not json", "cannot be read as JSON: Expecting property name"),
        (b'{"nodes": []}', "is not a health gate's results (no verdict)"),
    ],
)
def test_a_health_json_that_is_no_gate_s_results_is_named(tmp_path: Path, data: bytes, said: str) -> None:
    path = tmp_path / judge.HEALTH_FILE
    path.write_bytes(data)
    with pytest.raises(ValueError, match="^" + str(path).replace(".", r"\.")) as error:
        judge.load(path)
    assert said in str(error.value)


def test_a_health_json_larger_than_any_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judge, "HEALTH_MAX", 2**20)
    path = tmp_path / judge.HEALTH_FILE
    path.write_bytes(b" " * (2**20 + 1))
    with pytest.raises(ValueError, match="is larger than 1 MiB, which no gate's results are"):
        judge.load(path)


@pytest.mark.parametrize(
    "name",
    ["x) R 1 2 3", "\x1b]0;t\x07", "((", "a\nb", " ) 99999999999999999999999 x"],
)
def test_a_process_named_to_confuse_the_sample_is_read_or_passed_over(name: str) -> None:
    fields = " ".join(str(n) for n in range(3, 53))
    text = f"@@uptime 100.0\n@@pagesize 4096\n@@procs\n42 ({name}) S {fields}\n"
    sample = telemetry.read_sample(text)
    assert sample is not None and sample.uptime == 100.0
    for process in sample.processes:
        assert isinstance(process.ticks, int) and isinstance(process.rss_pages, int)
