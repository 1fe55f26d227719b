"""Where a job's logs are (one place for the supervisor and the results), and the results laid out under
runs/<job-id>/ from the nodes' archives, for mpirun and torchrun."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from ddp_cluster.job import results


def node_archive(run_dir: Path, node: str, files: dict[str, str]) -> None:
    source = run_dir.parent / f"src-{node}"
    for relative, text in files.items():
        path = source / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    incoming = run_dir / ".incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    with tarfile.open(incoming / f"{node}.tar.gz", "w:gz") as tar:
        tar.add(source, arcname=".")


def test_the_supervisor_and_the_layout_agree_on_mpiruns_log_paths(tmp_path: Path) -> None:
    job = tmp_path / "job"
    path = results.mpirun_log(job, 3)
    assert path == job / "logs" / "1" / "rank.3" / "stdout"
    assert results.MPIRUN_LOG.match(path.relative_to(job).as_posix())
    assert results.find_mpirun_log(job, 3) is None
    path.parent.mkdir(parents=True)
    path.write_text("x\n")
    assert results.find_mpirun_log(job, 3) == path


def test_mpirun_results(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "j1"
    node_archive(
        run,
        "node0",
        {
            "logs/1/rank.0/stdout": "rank 0\n",
            "output/summary.json": "{}",
            "output/checkpoints/epoch-00002.ckpt": "ckpt",
            "status.json": '{"state": "succeeded"}',
            "launcher.log": "mpirun\n",
        },
    )
    node_archive(run, "node1", {"logs/1/rank.1/stdout": "rank 1\n", "output/summary.json": '{"not": 1}'})
    done = results.lay_out(run, "node0", ["node0", "node1", "node2"])
    assert done.missing == ["node2"] and done.warnings == []
    assert sorted(p.name for p in (run / "logs").iterdir()) == ["rank.0.log", "rank.1.log"]
    assert (run / "logs" / "rank.1.log").read_text() == "rank 1\n"
    assert (run / "output" / "summary.json").read_text() == "{}"  # the first node's output
    assert (run / "output" / "checkpoints" / "epoch-00002.ckpt").exists()
    assert (run / "status.json").read_text() == '{"state": "succeeded"}'
    assert (run / "nodes" / "node1" / "output" / "summary.json").exists()
    assert not (run / "nodes" / "node0" / "output").exists()
    assert not (run / ".incoming").exists()


def test_torchrun_results_give_each_worker_its_log_and_each_agent_its_own(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "j2"
    for index, node in enumerate(["node0", "node1"]):
        files = {f"logs/1/rank.{index}/stdout": f"agent {index}\n"}
        for local in range(2):
            base = f"logs/torchrun/none_x/attempt_0/{local}"
            files[f"{base}/stdout.log"] = f"old {node} {local}\n"
            base = f"logs/torchrun/none_x/attempt_1/{local}"
            files[f"{base}/stdout.log"] = f"out {node} {local}\n"
            files[f"{base}/stderr.log"] = f"err {node} {local}\n"
        node_archive(run, node, files)
    assert results.lay_out(run, "node0", ["node0", "node1"], torchrun_nproc=2) == results.LaidOut()
    names = sorted(p.name for p in (run / "logs").iterdir())
    assert names == ["agent.0.log", "agent.1.log", "rank.0.log", "rank.1.log", "rank.2.log", "rank.3.log"]
    assert (run / "logs" / "rank.3.log").read_text() == "out node1 1\nerr node1 1\n"  # the last attempt's
    assert (run / "logs" / "agent.1.log").read_text() == "agent 1\n"


def test_the_command_lays_out_what_came_back(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "j3"
    node_archive(run, "node0", {"logs/1/rank.0/stdout": "r0\n"})
    assert results.main([str(run), "node0", "node0,node1"]) == 0
    assert results.main([str(run)]) == 2


# --- what a job left: never a failure of the layout ---


def raw_archive(run_dir: Path, node: str, members: list[tarfile.TarInfo], data: bytes = b"x") -> Path:
    """An archive as a job's code could make one: any member, any name, any link."""
    incoming = run_dir / ".incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    archive = incoming / f"{node}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for member in members:
            member.size = len(data) if member.isreg() else 0
            tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
    return archive


def entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.linkname = kind, link
    member.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return member


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (entry("/etc/evil"), "a path outside the node's directory"),
        (entry("../../evil"), "a path outside the node's directory"),
        (entry("output/../../evil"), "a path outside the node's directory"),
        (entry("output/dangling", tarfile.SYMTYPE, "/abs/nowhere"), "link to /abs/nowhere"),
        (entry("output/up", tarfile.SYMTYPE, "../status.json"), "link to ../status.json, outside the output"),
        (
            entry("data", tarfile.SYMTYPE, "../../plan.json"),
            "link to ../../plan.json, outside the node directory",
        ),
        (entry("output/hard", tarfile.LNKTYPE, "/etc/passwd"), "hard link to /etc/passwd"),
        (entry("output/hard", tarfile.LNKTYPE, "status.json"), "hard link to status.json"),
        (entry("output/sda", tarfile.BLKTYPE), "a device, fifo or special file"),
        (entry("output/tty", tarfile.CHRTYPE), "a device, fifo or special file"),
        (entry("output/pipe", tarfile.FIFOTYPE), "a device, fifo or special file"),
    ],
)
def test_each_kind_of_unsafe_member_is_left_out_and_named(
    tmp_path: Path, member: tarfile.TarInfo, why: str
) -> None:
    run = tmp_path / "runs" / "j4"
    raw_archive(run, "node0", [entry("status.json"), member, entry("output/summary.json")])
    done = results.lay_out(run, "node0", ["node0"])
    name = member.name
    assert done.warnings == [f"results: skipped 1 unsafe member(s) from node0: {name} ({why})"]
    assert (run / "output" / "summary.json").read_bytes() == b"x"  # the rest is laid out
    assert not (tmp_path / "evil").exists() and not (tmp_path / "runs" / "evil").exists()
    assert not any(path.name in ("evil", "sda", "tty", "pipe", "hard") for path in tmp_path.rglob("*"))


def test_links_inside_are_kept_and_a_link_to_a_directory_or_a_dangling_one_fails_nothing(
    tmp_path: Path,
) -> None:
    run = tmp_path / "runs" / "j5"
    members = [
        entry("output", tarfile.DIRTYPE),
        entry("output/data", tarfile.DIRTYPE),
        entry("output/data/x.bin"),
        entry("output/latest", tarfile.SYMTYPE, "data"),  # a link to a directory inside
        entry("output/gone", tarfile.SYMTYPE, "data/removed.bin"),  # dangling, inside
        entry("output/latest/sneaky", tarfile.SYMTYPE, "../../../plan.json"),  # through a link
        entry("output/abs", tarfile.SYMTYPE, "/workspace/jobs/j5/output/data"),
        entry("output/summary.json"),
        entry("logs/1/rank.0/stdout", tarfile.SYMTYPE, "../../../status.json"),  # not copied as a log
        entry("status.json"),
    ]
    raw_archive(run, "node0", members)
    done = results.lay_out(run, "node0", ["node0"])
    assert done.warnings == [
        "results: skipped 2 unsafe member(s) from node0: output/latest/sneaky (a path through a link),"
        " output/abs (link to /workspace/jobs/j5/output/data)"
    ]
    assert (run / "output" / "latest").is_symlink() and (run / "output" / "latest" / "x.bin").is_file()
    assert (run / "output" / "gone").is_symlink() and not (run / "output" / "gone").exists()
    assert not (run / "logs" / "rank.0.log").exists()


def test_a_jobs_output_never_replaces_the_controllers_own_files(tmp_path: Path) -> None:
    """A user's SummaryWriter($DDP_JOB_DIR/output/logs), or an output/plan.json: under output/, never over
    runs/<id>/plan.json, status.json, logs/ or nodes/."""
    run = tmp_path / "runs" / "j6"
    run.mkdir(parents=True)
    (run / "plan.json").write_text('{"run_dir": "mine"}')
    node_archive(
        run,
        "node0",
        {
            "logs/1/rank.0/stdout": "rank 0\n",
            "status.json": '{"state": "succeeded"}',
            "output/plan.json": '{"run_dir": "/etc"}',
            "output/status.json": '{"state": "failed"}',
            "output/logs/events.out.tfevents": "tb",
            "output/nodes/node0/x": "y",
        },
    )
    results.lay_out(run, "node0", ["node0"])
    assert (run / "plan.json").read_text() == '{"run_dir": "mine"}'
    assert (run / "status.json").read_text() == '{"state": "succeeded"}'
    assert sorted(path.name for path in (run / "logs").iterdir()) == ["rank.0.log"]
    assert sorted(path.name for path in (run / "nodes").iterdir()) == ["node0"]
    assert (run / "output" / "plan.json").read_text() == '{"run_dir": "/etc"}'
    assert (run / "output" / "logs" / "events.out.tfevents").read_text() == "tb"


def test_the_output_goes_over_what_a_health_gate_kept_there_only_by_name(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "j7"
    (run / "output" / "checkpoints").mkdir(parents=True)
    (run / "output" / "health.json").write_text("gate")
    (run / "output" / "checkpoints" / "old").write_text("old")
    node_archive(run, "node0", {"output/summary.json": "{}", "output/checkpoints/epoch-00001.ckpt": "c"})
    results.lay_out(run, "node0", ["node0"])
    assert (run / "output" / "health.json").read_text() == "gate"
    assert sorted(path.name for path in (run / "output" / "checkpoints").iterdir()) == ["epoch-00001.ckpt"]
    assert not (run / "nodes" / "node0" / "output").exists()


def test_a_truncated_archive_is_said_and_what_could_be_read_is_laid_out(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "j8"
    files = {"logs/1/rank.0/stdout": "rank 0\n", "status.json": '{"state": "failed"}'}
    files |= {f"output/big-{index}.bin": str(index) * 200_000 for index in range(3)}
    node_archive(run, "node0", files)
    archive = run / ".incoming" / "node0.tar.gz"
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    node_archive(run, "node1", {"logs/1/rank.1/stdout": "rank 1\n"})
    done = results.lay_out(run, "node0", ["node0", "node1"])
    [warning] = done.warnings
    assert (
        warning.startswith("results: node0's archive is truncated or corrupt (")
        and "laid out under" in warning
    )
    assert (run / "logs" / "rank.1.log").read_text() == "rank 1\n"  # the other nodes' are whole
    assert (run / "nodes" / "node0").is_dir()


def test_an_archive_that_is_not_one_is_said(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "j9"
    (run / ".incoming").mkdir(parents=True)
    (run / ".incoming" / "node0.tar.gz").write_bytes(b"not an archive")
    [warning] = results.lay_out(run, "node0", ["node0"]).warnings
    assert "node0's archive is truncated or corrupt" in warning


def test_a_directory_without_write_permission_still_gets_its_members(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "j10"
    locked = entry("output/ro", tarfile.DIRTYPE)
    locked.mode = 0o500
    raw_archive(run, "node0", [entry("output", tarfile.DIRTYPE), locked, entry("output/ro/x")])
    assert results.lay_out(run, "node0", ["node0"]).warnings == []
    assert (run / "output" / "ro" / "x").read_bytes() == b"x"
    assert (run / "output" / "ro").stat().st_mode & 0o700 == 0o700  # a user who is not root may write it
