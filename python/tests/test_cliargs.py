"""ddp_cluster.runtime.cliargs: argparse options from a dataclass's fields."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_cluster.runtime.cliargs import add_dataclass_arguments, dataclass_from_args, option


@dataclass(frozen=True, kw_only=True)
class Settings:
    name: str = field(default="x", metadata=option("a name (default %(default)s)", choices=("x", "y")))
    out: Path = field(metadata=option("where", metavar="DIR"))
    count: int = 3
    ratio: float | None = None
    quiet: bool = False
    color: bool = True
    tags: tuple[str, ...] = field(default=(), init=False)


def parser(
    defaults: Mapping[str, Any] | None = None, exclude: Collection[str] = ()
) -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="prog")
    add_dataclass_arguments(made, Settings, defaults=defaults, exclude=exclude)
    return made


def test_defaults_come_from_the_fields() -> None:
    settings = dataclass_from_args(Settings, parser().parse_args(["--out", "o"]))
    assert settings == Settings(out=Path("o"))


def test_types_switches_and_optional_values() -> None:
    args = ["--out", "o", "--name", "y", "--count", "7", "--ratio", "0.5", "--quiet", "--no-color"]
    settings = dataclass_from_args(Settings, parser().parse_args(args))
    assert settings == Settings(out=Path("o"), name="y", count=7, ratio=0.5, quiet=True, color=False)


def test_a_field_without_default_is_required_and_choices_are_kept(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args([])
    assert "the following arguments are required: --out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser().parse_args(["--out", "o", "--name", "z"])
    assert "invalid choice: 'z'" in capsys.readouterr().err


def test_help_metavar_and_the_default_in_help() -> None:
    text = parser().format_help()
    assert "--out DIR" in text and "a name (default x)" in text
    assert "--tags" not in text  # init=False: not an option


def test_defaults_override_the_command_line_only_and_exclude_leaves_out() -> None:
    made = parser(defaults={"count": None}, exclude={"ratio"})
    args = made.parse_args(["--out", "o"])
    assert args.count is None and not hasattr(args, "ratio")
    assert dataclass_from_args(Settings, args, count=4) == Settings(out=Path("o"), count=4)
    with pytest.raises(ValueError, match="no field nope"):
        parser(defaults={"nope": 1})


def test_train_options_have_the_config_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from ddp_cluster.runtime.train import TrainConfig, parse_args

    monkeypatch.delenv("DDP_DEVICE", raising=False)
    assert parse_args(["--output-dir", str(tmp_path)]) == TrainConfig(output_dir=tmp_path)
    monkeypatch.setenv("DDP_DEVICE", "cpu")
    assert parse_args(["--output-dir", str(tmp_path)]).device == "cpu"


def test_the_jobs_default_arguments_are_options_of_the_entrypoint(tmp_path: Path) -> None:
    """ddp_job_default_args (train.yml without a script) names the entrypoint's options; each is a value the
    config accepts, so a job of the defaults trains what its plan line says."""
    pytest.importorskip("torch")
    from ddp_cluster.runtime.config import parse_args

    specs = Path(__file__).resolve().parents[2] / "roles" / "ddp_job" / "meta" / "argument_specs.yml"
    options = yaml.safe_load(specs.read_text())["argument_specs"]["main"]["options"]
    given = shlex.split(options["ddp_job_default_args"]["default"])
    parse_args([*given, "--output-dir", str(tmp_path), "--device", "cpu"])  # exits on an unknown option


def test_a_field_of_a_generic_type_needs_excluding() -> None:
    @dataclass
    class Listed:
        names: list[str] = field(default_factory=list)

    with pytest.raises(ValueError, match=r"Listed\.names: no option for a list"):
        add_dataclass_arguments(argparse.ArgumentParser(), Listed)
    add_dataclass_arguments(argparse.ArgumentParser(), Listed, exclude={"names"})
