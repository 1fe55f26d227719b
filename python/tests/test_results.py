"""Where a job's logs are (one place for the supervisor and the results), and the results laid out under
runs/<job-id>/ from the nodes' archives, for mpirun and torchrun."""

from __future__ import annotations

import io
import os
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
    node_archive(
        run, "node1", {"logs/1/rank.1/stdout": "rank 1\n", "output/big.bin": os.urandom(99_999).hex()}
    )
    archive = run / ".incoming" / "node1.tar.gz"
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    done = results.lay_out(run, "node0", ["node0", "node1"])
    [first, other] = done.warnings
    # The first node's output went to runs/<id>/output/: the warning says where it is.
    assert first.startswith("results: node0's archive is truncated or corrupt (") and first.endswith(
        f"what could be read is laid out under {run / 'output'} (its output) and {run / 'nodes' / 'node0'}"
    )
    assert other.endswith(f"laid out under {run / 'nodes' / 'node1'}")
    assert (run / "output" / "big-0.bin").is_file()
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


# --- links that lead out only through other links ---


def escape(order: str, base: str = "output") -> list[tarfile.TarInfo]:
    """A link, lexically inside, that leads to the controller's runs/<id>/plan.json (or, from the node's
    directory, a file of the controller's) through another link, laid out before or after it."""
    if base == OUTPUT:
        # x/up -> .. is the output itself: loss.png -> x/up/../plan.json is runs/<id>/plan.json, once moved.
        link = entry("output/loss.png", tarfile.SYMTYPE, "x/up/../plan.json")
        chain = [entry("output/x", tarfile.DIRTYPE), entry("output/x/up", tarfile.SYMTYPE, "..")]
        tree = [entry("output", tarfile.DIRTYPE)]
    else:
        # a/b/up -> ../.. is the node's directory: logs -> a/b/up/../../../secret is runs/secret.
        link = entry("logs", tarfile.SYMTYPE, "a/b/up/../../../secret")
        chain = [entry("a", tarfile.DIRTYPE), entry("a/b", tarfile.DIRTYPE)]
        chain.append(entry("a/b/up", tarfile.SYMTYPE, "../.."))
        tree = []
    tree += [link, *chain] if order == "link first" else [*chain, link]
    return [*tree, entry("output/summary.json")] if base == OUTPUT else tree


OUTPUT = results.OUTPUT


def controllers_secret(run: Path) -> None:
    (run / "plan.json").write_text("controller's")
    (run.parent / "secret" / "1" / "rank.0").mkdir(parents=True)
    (run.parent / "secret" / "1" / "rank.0" / "stdout").write_text("controller's")


@pytest.mark.parametrize("order", ["link first", "chain first"])
def test_a_link_with_dotdot_after_a_name_is_left_out_in_either_order(tmp_path: Path, order: str) -> None:
    run = tmp_path / "runs" / "j11"
    run.mkdir(parents=True)
    controllers_secret(run)
    raw_archive(run, "node0", escape(order))
    raw_archive(run, "node1", escape(order, base="node"))
    done = results.lay_out(run, "node0", ["node0", "node1"])
    why = "with '..' after a name: a link may only climb first"
    assert done.warnings == [
        f"results: skipped 1 unsafe member(s) from node0: output/loss.png (link to x/up/../plan.json, {why})",
        f"results: skipped 1 unsafe member(s) from node1: logs (link to a/b/up/../../../secret, {why})",
    ]
    assert not (run / "output" / "loss.png").is_symlink() and (run / "output" / "summary.json").is_file()
    assert (run / "output" / "x" / "up").is_symlink()  # a link that only climbs, as far as it may, is kept
    assert not (run / "nodes" / "node1" / "logs").is_symlink() and not (run / "logs" / "rank.0.log").exists()


@pytest.mark.parametrize(
    ("link", "kept"),
    [
        ("..", True),
        ("../..", False),
        ("./../x", True),
        ("a/./b", True),
        ("a/..", False),
        ("../a/../b", False),
    ],
)
def test_a_link_may_climb_only_before_its_first_name(link: str, kept: bool) -> None:
    member = entry("output/d/l", tarfile.SYMTYPE, link)
    assert (results.unsafe(member, member.name) == "") is kept


def test_the_links_laid_out_are_resolved_and_those_that_lead_out_removed(tmp_path: Path) -> None:
    node = tmp_path / "nodes" / "node0"
    (node / "output" / "sub").mkdir(parents=True)
    (node / "d").mkdir()
    (tmp_path / "plan.json").write_text("controller's")
    plant = {
        "output/in": "sub",  # kept: inside the output
        "output/sub/up": "..",  # kept: the output itself
        "output/status": "../status.json",  # inside the node's directory, not the output
        "output/sub/via": "up/../../plan.json",  # through up: outside the node's directory
        "d/up": "../..",  # out of the node's directory: nodes/
        "d/abs": "/etc",
        "d/plan": "../output/sub/up/../../../../plan.json",
        "logs": "d",  # kept: inside the node's directory
        "loop": "loop",  # kept: unresolvable, it leads nowhere
    }
    for name, target in plant.items():
        (node / name).symlink_to(target)
    removed = results.escaping_links(node)
    assert removed == [
        ("d/abs", "link to /etc, resolving outside the node directory"),
        ("d/plan", "link to ../output/sub/up/../../../../plan.json, resolving outside the node directory"),
        ("d/up", "link to ../.., resolving outside the node directory"),
        ("output/status", "link to ../status.json, resolving outside the output"),
        ("output/sub/via", "link to up/../../plan.json, resolving outside the output"),
    ]
    left = sorted(path.relative_to(node).as_posix() for path in node.rglob("*") if path.is_symlink())
    assert left == ["logs", "loop", "output/in", "output/sub/up"]


def without_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    """tarfile as before Python 3.10.12 / 3.11.4: no filter= to pass, none applied."""
    plain = tarfile.TarFile.extract

    def before_filters(
        self: tarfile.TarFile, member: tarfile.TarInfo, path: Path, set_attrs: bool = True
    ) -> None:
        plain(self, member, path, set_attrs, filter="fully_trusted")

    monkeypatch.setattr(results, "DATA_FILTER", False)
    monkeypatch.setattr(tarfile.TarFile, "extract", before_filters)


@pytest.mark.parametrize("order", ["link first", "chain first"])
def test_a_link_that_leads_out_is_removed_before_anything_is_read_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    """Should the member checks and tarfile's filter miss a link, the layout still neither keeps it nor reads
    through it."""
    checked = results.unsafe
    monkeypatch.setattr(
        results, "unsafe", lambda member, name: "" if member.issym() else checked(member, name)
    )
    without_filters(monkeypatch)
    run = tmp_path / "runs" / "j12"
    run.mkdir(parents=True)
    controllers_secret(run)
    raw_archive(run, "node0", escape(order))
    raw_archive(run, "node1", escape(order, base="node"))
    done = results.lay_out(run, "node0", ["node0", "node1"])
    skipped = "results: skipped 1 unsafe member(s) from"
    assert done.warnings == [
        f"{skipped} node0: output/loss.png (link to x/up/../plan.json, resolving outside the output)",
        f"{skipped} node1: logs (link to a/b/up/../../../secret, resolving outside the node directory)",
    ]
    assert not (run / "output" / "loss.png").is_symlink()
    assert not (run / "logs" / "rank.0.log").exists()  # not the controller's file, read through the link


def test_without_tarfiles_filters_members_are_laid_out_with_their_bits_stripped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node image's Python before 3.10.12 / 3.11.4: no filter= to pass, and nothing unsafe laid out."""
    without_filters(monkeypatch)
    run = tmp_path / "runs" / "j13"
    setuid, shared, private = entry("output/setuid"), entry("output/shared"), entry("output/private")
    setuid.mode, shared.mode, private.mode = 0o4777, 0o666, 0o400
    raw_archive(run, "node0", [*escape("link first"), setuid, shared, private])
    done = results.lay_out(run, "node0", ["node0"])
    assert len(done.warnings) == 1 and "output/loss.png (link to x/up/../plan.json" in done.warnings[0]
    modes = {path.name: path.stat().st_mode & 0o7777 for path in (run / "output").iterdir() if path.is_file()}
    assert modes == {"setuid": 0o755, "shared": 0o644, "private": 0o600, "summary.json": 0o644}


def test_an_archive_of_too_many_members_is_laid_out_up_to_the_limit_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results, "MAX_MEMBERS", 6)
    opened: list[tarfile.TarFile] = []
    plain_open = tarfile.open

    def open_archive(name: Path) -> tarfile.TarFile:
        opened.append(plain_open(name))
        return opened[-1]

    run = tmp_path / "runs" / "j14"
    members = [entry(f"../x{index}") for index in range(3)]
    raw_archive(run, "node0", members + [entry(f"output/f{index}") for index in range(10)])
    monkeypatch.setattr(tarfile, "open", open_archive)
    done = results.lay_out(run, "node0", ["node0"])
    assert done.warnings[1] == (
        "results: node0's archive has more than 6 members: the first 6 are read and laid out as they may be,"
        " the rest left out (a job that writes that many files should pack them itself)"
    )
    assert done.warnings[0].startswith("results: skipped 3 unsafe member(s) from node0: ../x0 ")
    assert sorted(path.name for path in (run / "output").iterdir()) == ["f0", "f1", "f2"]
    assert len(opened[0].members) <= 1  # tarfile's list of the members read is not kept


def test_of_many_members_left_out_the_first_few_are_named_and_the_rest_counted(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "j15"
    archive = raw_archive(run, "node0", [entry(f"../x{index}") for index in range(40)])
    got = results.extract(archive, run / "nodes" / "node0")
    assert got.left_out == 40 and not got.broken and not got.cut
    assert got.shown == [
        f"../x{index} (a path outside the node's directory)" for index in range(results.SHOWN)
    ]
    [warning] = results.lay_out(run, "node0", ["node0"]).warnings
    assert warning.endswith(f"../x4 (a path outside the node's directory) and {40 - results.SHOWN} more")


def test_the_first_nodes_telemetry_is_laid_out_beside_the_output(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "j9"
    record = '{"time": 1.0, "node": "node1"}\n'
    node_archive(run, "node0", {"telemetry/node0.jsonl": record, "telemetry/node1.jsonl": record})
    node_archive(run, "node1", {"telemetry/node1.jsonl": "a stale copy on another node\n"})
    assert results.lay_out(run, "node0", ["node0", "node1"]) == results.LaidOut()
    assert sorted(path.name for path in (run / "telemetry").iterdir()) == ["node0.jsonl", "node1.jsonl"]
    assert (run / "telemetry" / "node1.jsonl").read_text() == record  # the first node's, not node1's own


def test_telemetry_takes_only_regular_node_files_never_a_link(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "j10"
    (run / "plan.json").parent.mkdir(parents=True)
    (run / "plan.json").write_text("the controller's\n")
    members = [
        entry("telemetry", tarfile.DIRTYPE),
        entry("telemetry/node0.jsonl"),
        # Safe inside the node's directory (nodes/node0/plan.json), but from runs/j10/telemetry/ it would read
        # the controller's plan.json.
        entry("telemetry/node1.jsonl", tarfile.SYMTYPE, "../plan.json"),
        entry("telemetry/notes.txt"),
    ]
    raw_archive(run, "node0", members)
    results.lay_out(run, "node0", ["node0"])
    assert sorted(path.name for path in (run / "telemetry").iterdir()) == ["node0.jsonl"]
    assert (run / "nodes" / "node0" / "telemetry" / "notes.txt").is_file()


def test_an_mpirun_log_is_found_however_open_mpi_padded_its_number(tmp_path: Path) -> None:
    for name in ("rank.03", "rank.12"):
        (tmp_path / "logs" / "1" / name).mkdir(parents=True)
        (tmp_path / "logs" / "1" / name / "stdout").write_text("x\n")
    assert results.find_mpirun_log(tmp_path, 3) == tmp_path / "logs" / "1" / "rank.03" / "stdout"
    assert results.find_mpirun_log(tmp_path, 12) == tmp_path / "logs" / "1" / "rank.12" / "stdout"
    assert results.find_mpirun_log(tmp_path, 1) is None
