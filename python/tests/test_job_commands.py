"""The short job commands (ddp-cluster jobs/logs/stop/sync/attach/drain/undrain/submit): the playbook each
runs, its extra vars as Ansible reads them, where it runs, and their bad input."""

from __future__ import annotations

import itertools
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_cluster import cli
from ddp_cluster.job import commands


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("jobs.yml", "train.yml", "ansible.cfg"):
        (tmp_path / name).write_text("---\n")
    (tmp_path / "docs").mkdir()
    monkeypatch.chdir(tmp_path / "docs")
    monkeypatch.delenv(commands.HOME_VARIABLE, raising=False)
    return tmp_path


def ran(argv: list[str]) -> tuple[str, list[str], Path]:
    seen: list[tuple[str, list[str], Path]] = []
    assert commands.main(argv, run=lambda program, args: seen.append((program, args, Path.cwd()))) == 0
    [found] = seen
    return found


def extra_vars(args: list[str]) -> dict[str, str]:
    """The extra vars as ansible-playbook reads -e: NAME=VALUE split on spaces, else JSON."""
    found: dict[str, str] = {}
    for flag, value in itertools.pairwise(args):
        if flag == "-e":
            if value.startswith("{"):
                found.update(json.loads(value))
            else:
                assert " " not in value
                name, _, text = value.partition("=")
                found[name] = text
    return found


@pytest.mark.parametrize(
    ("argv", "playbook", "expected"),
    [
        (["jobs"], "jobs.yml", {}),
        (["stop", "lr-01"], "jobs.yml", {"stop": "lr-01"}),
        (["sync", "lr-01"], "jobs.yml", {"sync": "lr-01"}),
        (["attach", "lr-01"], "train.yml", {"attach": "lr-01"}),
        (["logs", "lr-01"], "jobs.yml", {"logs": "lr-01"}),
        (
            ["logs", "lr-01", "-f", "-n", "5", "--rank", "3", "--node", "node1"],
            "jobs.yml",
            {"logs": "lr-01", "follow": "true", "tail": "5", "rank": "3", "node": "node1"},
        ),
        (
            ["drain", "node3", "--reason", "fan 3 failed"],
            "jobs.yml",
            {"drain": "node3", "reason": "fan 3 failed"},
        ),
        (["undrain", "node3"], "jobs.yml", {"undrain": "node3"}),
        (["submit"], "train.yml", {}),
        (
            [
                "submit",
                "-N",
                "2",
                "--detach",
                "--job-id",
                "a1",
                "-e",
                "max_restarts=1",
                "-e",
                "exclude=node0",
            ],
            "train.yml",
            {"nodes": "2", "detach": "true", "job_id": "a1", "max_restarts": "1", "exclude": "node0"},
        ),
    ],
)
def test_each_command_runs_its_playbook_with_the_extra_vars_it_stands_for(
    checkout: Path, argv: list[str], playbook: str, expected: dict[str, str]
) -> None:
    program, args, cwd = ran(argv)
    assert cwd == checkout  # the playbooks' relative paths (runs/, inventories/) hold
    assert args[0] == program and program.endswith("ansible-playbook")
    assert args[1] == playbook and extra_vars(args) == expected


def test_submit_passes_the_script_from_here_and_its_arguments_as_one_string(checkout: Path) -> None:
    (checkout / "docs" / "train.py").write_text("print(1)\n")
    _, args, _ = ran(["submit", "-N", "2", "train.py", "--lr=0.1", "--name", "a b", "-e", "x"])
    found = extra_vars(args)
    assert found["script"] == str(checkout / "docs" / "train.py")
    assert shlex.split(found["script_args"]) == [
        "--lr=0.1",
        "--name",
        "a b",
        "-e",
        "x",
    ]  # after SCRIPT: its own


def test_print_says_the_command_and_runs_nothing(checkout: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        commands.main(["stop", "lr-01", "--print", "-i", "inventories/site"], run=lambda *a: pytest.fail())
        == 0
    )
    assert capsys.readouterr().out == "ansible-playbook -i inventories/site jobs.yml -e stop=lr-01\n"


def test_outside_a_checkout_it_says_where_to_run_or_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(commands.HOME_VARIABLE, raising=False)
    assert commands.main(["jobs"], run=lambda *a: pytest.fail()) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "not inside a ddp-cluster checkout" in err and commands.HOME_VARIABLE in err
    )
    monkeypatch.setenv(commands.HOME_VARIABLE, str(tmp_path / "nope"))
    assert commands.main(["jobs"], run=lambda *a: pytest.fail()) == 2
    assert "holds no jobs.yml" in capsys.readouterr().err


def test_the_home_variable_names_the_checkout(
    checkout: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    monkeypatch.setenv(commands.HOME_VARIABLE, str(checkout))
    assert ran(["jobs"])[2] == checkout


@pytest.mark.parametrize("bad", [["submit", "-e", "nonsense"], ["submit", "-e", "a b=1"]])
def test_a_bad_extra_var_is_one_line_exit_2(
    checkout: Path, bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert commands.main(bad, run=lambda *a: pytest.fail()) == 2
    assert "is not NAME=VALUE" in capsys.readouterr().err


def test_missing_arguments_are_argparse_errors_exit_2() -> None:
    for argv in (["logs"], ["drain", "node1"], ["stop"]):
        with pytest.raises(SystemExit) as exited:
            commands.main(argv, run=lambda *a: pytest.fail())
        assert exited.value.code == 2


def test_the_top_command_lists_the_job_commands_first_and_routes_them(
    checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert listed.index("  jobs ") < listed.index("  submit ") < listed.index("  plot ")
    assert cli.main(["undrain", "node2", "--print"]) == 0
    assert capsys.readouterr().out == "ansible-playbook jobs.yml -e undrain=node2\n"


def test_the_bash_completion_script_completes_commands(tmp_path: Path) -> None:
    script = subprocess.run(
        [sys.executable, "-m", "ddp_cluster.cli", "completion"], capture_output=True, text=True, check=True
    ).stdout
    probe = script + 'COMP_WORDS=(ddp-cluster su); COMP_CWORD=1; _ddp_cluster; echo "${COMPREPLY[@]}"\n'
    (tmp_path / "runs" / "lr-01").mkdir(parents=True)
    probe += 'COMP_WORDS=(ddp-cluster stop l); COMP_CWORD=2; _ddp_cluster; echo "${COMPREPLY[@]}"\n'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.splitlines() == ["submit", "lr-01"]


def test_submit_check_is_train_yml_check(checkout: Path) -> None:
    _, args, _ = ran(["submit", "-N", "2", "--check"])
    assert args[1] == "train.yml" and "--check" in args and extra_vars(args) == {"nodes": "2"}
    _, args, _ = ran(["submit", "-N", "2", "train.py", "--check"])  # after SCRIPT: the script's own
    assert "--check" not in args and extra_vars(args)["script_args"] == "--check"
