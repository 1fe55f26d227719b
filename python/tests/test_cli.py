"""``ddp-cluster SUBCOMMAND``: each subcommand names its module's entry function, which exists and takes the
subcommand's arguments; the command's own usage and errors. No torch."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

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


def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def closed(argv: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")  # `ddp-cluster doctor RUN | head`

    monkeypatch.setattr(cli, "entry", lambda name: closed)
    saved = os.dup(1)
    try:
        assert cli.main(["doctor", "runs/x"]) == 0
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def test_workdir_given_a_directory_or_an_unwritable_output_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    assert cli.main(["workdir", str(tmp_path), "--script", "train.py", "-o", str(tmp_path)]) == 2
    assert f"-o {tmp_path} is a directory: give the .tar.gz file to write" in capsys.readouterr().err
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert cli.main(["workdir", str(tmp_path), "--script", "train.py", "-o", str(blocked / "j.tgz")]) == 2
    said = capsys.readouterr().err
    assert "cannot be written" in said and "Traceback" not in said


# Every command given a path that is missing, of the wrong kind, or not what it reads: one line on stderr
# naming it, exit 2 (bad input), never a traceback.
BAD_PATHS = [
    ("plot", "nope"),
    ("plot", "adir"),
    ("report", "nope"),
    ("report", "afile"),
    ("report", "adir"),
    ("doctor", "nope"),
    ("doctor", "afile"),
    ("health", "nope"),
    ("health", "afile"),
    ("health", "adir"),
    ("workdir", "nope --script a.py -o out"),
    ("workdir", "adir --script a.py -o out"),
    ("ip-plan", "check nope"),
    ("ip-plan", "check adir"),
    ("ip-plan", "check bad.yml"),
    ("ip-plan", "check afile"),
    ("ip-plan", "expand bad.yml"),
    ("rank-table", "nope"),
    ("rank-table", "adir"),
    ("rank-table", "bad.yml"),
    ("hccn", "diff nope --host a"),
    ("hccn", "check adir --host a"),
    ("hccn", "diff bad.yml --host a"),
]


@pytest.mark.parametrize(("name", "args"), BAD_PATHS)
def test_a_bad_path_is_one_line_exit_2_and_no_traceback(name: str, args: str, tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("hello\n")
    (tmp_path / "bad.yml").write_text("x: [\n")
    done = subprocess.run(
        [sys.executable, "-m", "ddp_cluster.cli", name, *args.split()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == "", done.stdout
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"ddp-cluster {name}"), done.stderr
