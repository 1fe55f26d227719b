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


def packed(archive: Path) -> dict[str, bytes | None]:
    """Each member's content (None: not a regular file)."""
    with tarfile.open(archive) as tar:
        return {
            member.name: (handle.read() if (handle := tar.extractfile(member)) and member.isfile() else None)
            for member in tar.getmembers()
        }


def test_links_inside_the_directory_ship_what_they_point_to(tmp_path: Path) -> None:
    project = make_project(
        tmp_path / "proj", {"train.py": "x\n", "data/real/a.csv": "1,2\n", "conf.yaml": "c"}
    )
    (project / "latest").symlink_to("data/real", target_is_directory=True)  # a link to a directory inside
    (project / "run.yaml").symlink_to(project / "conf.yaml")  # an absolute link to a file inside
    (project / "data" / "up.yaml").symlink_to("../conf.yaml")
    out = tmp_path / "out.tar.gz"
    summary = workdir.pack(project, "train.py", out, 2**20)
    members = packed(out)
    assert members == {
        "conf.yaml": b"c",
        "run.yaml": b"c",
        "train.py": b"x\n",
        "data/up.yaml": b"c",
        "data/real/a.csv": b"1,2\n",
        "latest/a.csv": b"1,2\n",
    }
    assert summary["files"] == 6 and summary["bytes"] == 1 + 1 + 2 + 1 + 4 + 4


@pytest.mark.parametrize(
    ("link", "target", "message"),
    [
        ("data", "OUTSIDE", "is a link to {outside}, outside the directory"),
        ("secret.txt", "OUTSIDE/key", "is a link to {outside}/key, outside the directory"),
        ("gone.txt", "missing.txt", "is a link to missing.txt, which does not exist"),
        ("sub/back", "..", "a directory it is inside (a loop)"),
    ],
)
def test_a_link_outside_dangling_or_looping_is_refused_naming_it(
    tmp_path: Path, link: str, target: str, message: str
) -> None:
    outside = make_project(tmp_path / "outside", {"key": "secret"})
    project = make_project(tmp_path / "proj", {"train.py": "", "sub/x.py": ""})
    (project / link).symlink_to(target.replace("OUTSIDE", str(outside)))
    out = tmp_path / "out.tar.gz"
    with pytest.raises(workdir.WorkdirError) as error:
        workdir.pack(project, "train.py", out, 2**20)
    said = str(error.value)
    assert said.startswith(f"workdir={project}: {link} is a link to ")
    assert message.format(outside=outside) in said
    assert f"list the link in {project}/.gitignore" in said
    assert not out.exists()


def test_a_link_outside_names_the_setting_that_follows_it_and_the_setting_packs_its_content(
    tmp_path: Path,
) -> None:
    outside = make_project(tmp_path / "outside", {"a.csv": "1\n", "deep/b.csv": "2\n"})
    project = make_project(tmp_path / "proj", {"train.py": ""})
    (project / "data").symlink_to(outside)
    (project / "one.csv").symlink_to(outside / "a.csv")
    out = tmp_path / "out.tar.gz"
    with pytest.raises(workdir.WorkdirError, match="set -e workdir_follow_links=true"):
        workdir.pack(project, "train.py", out, 2**20)
    workdir.pack(project, "train.py", out, 2**20, follow_links=True)
    assert packed(out) == {
        "one.csv": b"1\n",
        "train.py": b"",
        "data/a.csv": b"1\n",
        "data/deep/b.csv": b"2\n",
    }
    # followed, a link still may not dangle, and what it brings counts against the bound
    with pytest.raises(workdir.WorkdirError, match="more than the"):
        (outside / "big.bin").write_bytes(b"\0" * 2048)
        workdir.pack(project, "train.py", out, 1024, follow_links=True)
    (project / "gone").symlink_to(tmp_path / "nothing")
    with pytest.raises(workdir.WorkdirError, match=r"gone is a link to .*which does not exist"):
        workdir.pack(project, "train.py", out, 2**20, follow_links=True)


def test_an_ignored_link_is_not_looked_at(tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj", {"train.py": "", ".gitignore": "datasets\n"})
    (project / "datasets").symlink_to("/nonexistent/data")
    assert shipped(project) == [".gitignore", "train.py"]


def test_a_walk_far_over_the_bound_stops_naming_what_it_saw(tmp_path: Path) -> None:
    outside = make_project(tmp_path / "big", {f"part{index}.bin": b"\0" * 1024 for index in range(20)})
    project = make_project(tmp_path / "proj", {"train.py": ""})
    (project / "data").symlink_to(outside)
    with pytest.raises(
        workdir.WorkdirError, match=r"holds at least 9\.0 KiB in 10 files, more than the 1\.0 KiB"
    ):
        workdir.pack(project, "train.py", tmp_path / "out.tar.gz", 1024, follow_links=True)


def test_the_command_follows_links_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outside = make_project(tmp_path / "outside", {"a.csv": "1\n"})
    project = make_project(tmp_path / "proj", {"train.py": ""})
    (project / "data").symlink_to(outside)
    out = tmp_path / "out.tar.gz"
    assert cli.main(["workdir", str(project), "--script", "train.py", "-o", str(out)]) == 2
    assert "data is a link to" in capsys.readouterr().err
    assert cli.main(["workdir", str(project), "--script", "train.py", "-o", str(out), "--follow-links"]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == 2
