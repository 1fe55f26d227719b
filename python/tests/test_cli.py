"""``ddp-cluster SUBCOMMAND``: each subcommand names its module's entry function, which exists and takes the
subcommand's arguments; the command's own usage and errors. No torch."""

from __future__ import annotations

import inspect

import pytest

from ddp_cluster import cli


@pytest.mark.parametrize("name", sorted(cli.SUBCOMMANDS))
def test_every_subcommand_names_an_entry_function_that_takes_its_arguments(name: str) -> None:
    entry = cli.entry(cli.SUBCOMMANDS[name][0])
    assert list(inspect.signature(entry).parameters) == ["argv"], name


def test_the_usage_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    shown = capsys.readouterr().out
    assert all(f"  {name} " in shown for name in cli.SUBCOMMANDS)
    assert cli.main([]) == 2


def test_an_unknown_subcommand_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_a_subcommand_runs_its_modules_entry_function(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["workdir", "--help"])
    assert exited.value.code == 0
    assert "usage: ddp-cluster workdir" in capsys.readouterr().out
