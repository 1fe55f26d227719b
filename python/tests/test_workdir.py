"""A project directory for every node (``ddp_cluster.job.workdir``): what is shipped, the bound, the
script."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from ddp_cluster import cli
from ddp_cluster.job import workdir


def make_project(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def shipped(root: Path) -> list[str]:
    return [path.as_posix() for path in workdir.project_files(root)]


def test_git_and_caches_are_never_shipped(tmp_path: Path) -> None:
    make_project(
        tmp_path,
        {
            "train.py": "",
            "pkg/__init__.py": "",
            "pkg/__pycache__/mod.cpython-311.pyc": b"\0",
            "pkg/old.pyc": b"\0",
            ".git/HEAD": "ref: refs/heads/main\n",
            "conf/run.yaml": "lr: 0.1\n",
        },
    )
    assert shipped(tmp_path) == ["train.py", "conf/run.yaml", "pkg/__init__.py"]


@pytest.mark.parametrize(
    ("patterns", "expected"),
    [
        ("*.log\n", ["keep.txt", "train.py", "data/small.csv", "data/raw/big.bin", "sub/data/x.csv"]),
        ("data/\n", ["keep.txt", "train.py", "out.log"]),  # a directory pattern, at any depth
        ("/data\n", ["keep.txt", "train.py", "out.log", "sub/data/x.csv"]),  # anchored to the top
        ("data/raw/\n", ["keep.txt", "train.py", "out.log", "data/small.csv", "sub/data/x.csv"]),
        (
            "**/*.csv\n!data/small.csv\n",
            ["keep.txt", "train.py", "out.log", "data/small.csv", "data/raw/big.bin"],
        ),
        ("# a comment\n\n*\n!*.py\n!*/\n", ["train.py"]),  # everything but Python files (and the directories)
        (
            "data/\n!data/small.csv\n",
            ["keep.txt", "train.py", "out.log"],
        ),  # not re-included in an excluded dir
        ("d?ta/r[a-z]w/\n", ["keep.txt", "train.py", "out.log", "data/small.csv", "sub/data/x.csv"]),
    ],
)
def test_the_directorys_gitignore_is_followed(tmp_path: Path, patterns: str, expected: list[str]) -> None:
    make_project(
        tmp_path,
        {
            "train.py": "",
            "keep.txt": "",
            "out.log": "",
            "data/small.csv": "",
            "data/raw/big.bin": "",
            "sub/data/x.csv": "",
        },
    )
    (tmp_path / ".gitignore").write_text(patterns)
    assert sorted(shipped(tmp_path)) == sorted(
        [*expected, ".gitignore"] if "*\n" not in patterns else expected
    )


def test_pack_writes_the_files_and_names_the_script(tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj", {"src/train.py": "print(1)\n", "conf.json": "{}", "a.log": "x"})
    (project / ".gitignore").write_text("*.log\n")
    out = tmp_path / "out" / "proj.tar.gz"
    summary = workdir.pack(project, "src/train.py", out, 2**20)
    assert summary == {"files": 3, "bytes": 9 + 2 + 6, "script": "src/train.py"}
    with tarfile.open(out) as tar:
        assert sorted(tar.getnames()) == [".gitignore", "conf.json", "src/train.py"]
    assert not out.with_name("proj.tar.gz.part").exists()


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("../train.py", "must be a path inside workdir="),
        ("/etc/passwd", "must be a path inside workdir="),
        ("missing.py", "is not a file in workdir="),
        ("scratch/try.py", "is excluded by"),
    ],
)
def test_a_script_outside_the_project_is_refused(tmp_path: Path, script: str, message: str) -> None:
    project = make_project(
        tmp_path / "proj", {"train.py": "", "scratch/try.py": "", ".gitignore": "scratch/\n"}
    )
    with pytest.raises(workdir.WorkdirError, match=message):
        workdir.pack(project, script, tmp_path / "out.tar.gz", 2**20)
    assert not (tmp_path / "out.tar.gz").exists()


def test_a_project_over_the_bound_names_its_biggest_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_project(
        tmp_path / "proj", {"train.py": "", "data/images.bin": b"\0" * 3 * 2**20, "w.bin": b"\0" * 2**20}
    )
    out = tmp_path / "out.tar.gz"
    code = cli.main(
        ["workdir", str(tmp_path / "proj"), "--script", "train.py", "-o", str(out), "--max-mb", "2"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "holds 4.0 MiB in 3 files, more than the 2.0 MiB a job copies" in err
    assert "the biggest: data/images.bin (3.0 MiB), w.bin (1.0 MiB)" in err
    assert "node_container_volumes" in err and ".gitignore" in err
    assert not out.exists()


def test_the_command_prints_what_it_packed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_project(tmp_path / "proj", {"train.py": "x = 1\n"})
    out = tmp_path / "out.tar.gz"
    assert cli.main(["workdir", str(tmp_path / "proj"), "--script", "train.py", "-o", str(out)]) == 0
    assert json.loads(capsys.readouterr().out) == {"files": 1, "bytes": 6, "script": "train.py"}
    assert cli.main(["workdir", str(tmp_path / "nope"), "--script", "train.py", "-o", str(out)]) == 2
    assert "is not a directory on the controller" in capsys.readouterr().err
