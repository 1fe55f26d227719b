"""The health gate run alone (``python -m ddp_cluster.gate``) measures as check.yml does: the gate's own
option defaults are the ddp_job_health_* defaults argument_specs states (the plan passes every one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
OPTIONS = yaml.safe_load((REPO / "roles" / "ddp_job" / "meta" / "argument_specs.yml").read_text())[
    "argument_specs"
]["main"]["options"]


@pytest.mark.parametrize(
    "setting", ["min_bytes", "max_bytes", "factor", "seconds_per_size", "fraction", "floor_gbps"]
)
def test_the_gates_defaults_are_the_jobs(setting: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from ddp_cluster.health import gate

    args = gate.parse_args(["--output-dir", str(tmp_path)])
    assert getattr(args, setting) == OPTIONS[f"ddp_job_health_{setting}"]["default"]
