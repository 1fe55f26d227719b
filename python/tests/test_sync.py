"""jobs.yml -e sync=ID without containers: the node side (ddp_cluster.supervisor.sync: what differs from the
controller's manifest, pieces of files that only grew, secrets masked, what the collect alone brings left
out) and the controller's merge (ddp_cluster.job.sync: the final layout's places, hostile members refused,
the bytes a second sync moves). Two nodes are two folders; the mesh is a stand-in."""

from __future__ import annotations

import base64
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.job import sync
from ddp_cluster.job.spec import JobSpec
from ddp_cluster.job.status import Status
from ddp_cluster.job.transport import Done
from ddp_cluster.supervisor import sync as node_sync
from ddp_cluster.supervisor.remote import Mesh

JOB = "j1"
NODES = ("node0", "node1")
SECRET = "hunter2-token"


def job_dir(root: Path, node: str) -> Path:
    return root / node / "workspace" / "jobs" / JOB


def make_job(root: Path, state: str = "running") -> None:
    """Two nodes' job directories as a running mpirun job leaves them (node0 runs the supervisor)."""
    spec = JobSpec.from_dict(
        {
            "id": JOB,
            "job_dir": f"/workspace/jobs/{JOB}",
            "nodes": list(NODES),
            "nproc_per_node": 1,
            "launcher": "mpirun",
            "device": "cpu",
            "networks": ["10.0.0.0/24"],
            "timeout": 600,
        }
    )
    for node in NODES:
        folder = job_dir(root, node)
        (folder / "output").mkdir(parents=True)
        (folder / "job.json").write_text(spec.dumps())
        (folder / "job.tar.gz").write_bytes(b"the job's files as sent")
        (folder / "secrets.json").write_text(json.dumps({"TOKEN": SECRET}))
    first = job_dir(root, "node0")
    (first / "status.json").write_text(Status(state=state, nodes=NODES, supervisor_node="node0").dumps())
    (first / "output" / "metrics.jsonl").write_text('{"kind": "step", "step": 1, "loss": 2.0}\n')
    (first / "output" / "tensorboard").mkdir()
    (first / "output" / "tensorboard" / "events.out.tfevents.1").write_bytes(b"\0\1events" * 100)
    (first / "output" / "checkpoints").mkdir()
    (first / "output" / "checkpoints" / "epoch-00001.ckpt").write_bytes(b"\0" * 1000)
    (first / "workdir").mkdir()
    (first / "workdir" / "train.py").write_text("print('project as sent')\n")
    (first / "telemetry").mkdir()
    (first / "telemetry" / "node0.jsonl").write_text('{"time": 1, "node": "node0"}\n')
    (first / "heartbeat").mkdir()
    (first / "heartbeat" / "rank.0").write_text("")
    for rank in (0, 1):
        log = first / "logs" / "1" / f"rank.{rank}" / "stdout"
        log.parent.mkdir(parents=True)
        log.write_text(f"rank {rank} starts with {SECRET}\n")
    (first / "progress.tmp").write_text("half written")


class StandInMesh(Mesh):
    """The mesh of node0: the other node's command runs on its folder here (no ssh)."""


class Cluster:
    """The entry node's server, as the controller's transport sees it: the node command runs in-process
    against the folders (node0 is the entry and first node), and what each call sent and got is kept."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.sent: list[bytes] = []
        self._put = ""

        def ask(mesh: Mesh, node: str, command: str, request: bytes) -> dict[str, Any]:
            held = node_sync.read_held(json.loads(request)["held"])
            folder = job_dir(root, node)
            budget = int(command.split("--budget ")[1].split()[0])
            return node_sync.part(str(folder), str(folder.parent.parent), held, budget, "--check" in command)

        monkeypatch.setattr(node_sync, "ask", ask)

    def put(self, local: str) -> str:
        self._put = local
        return local

    def run(self, command: str) -> Done:
        assert f"--job {JOB}" in command and command.startswith("docker exec -i node0 ")
        request = Path(self._put).read_bytes()
        self.sent.append(request)
        folder = job_dir(self.root, "node0")
        answer = node_sync.gather(
            JOB, str(folder.parent), json.loads(request), StandInMesh("node0"), NODES, "--check" in command
        )
        return Done(0, json.dumps(answer) + "\n")

    def close(self) -> None:
        pass


def run_sync(cluster: Cluster, runs: Path, check: bool = False) -> sync.Synced:
    return sync.sync(cluster, "node0", "/workspace/jobs", JOB, runs / JOB, list(NODES), check=check)


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    make_job(tmp_path / "cluster")
    return Cluster(tmp_path / "cluster", monkeypatch)


# --- what differs -----------------------------------------------------------------------------------------


def test_start_of_a_file_unchanged_grown_rewritten_or_new(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"a" * 5000)
    descriptor = os.open(path, os.O_RDONLY)
    try:
        found = os.fstat(descriptor)
        held = node_sync.Held(5000, found.st_mtime_ns, node_sync.digest_before(descriptor, 5000))
        assert node_sync.start_of(None, 5000, found.st_mtime_ns, descriptor) == 0
        assert node_sync.start_of(held, 5000, found.st_mtime_ns, descriptor) is None
        # grown: the bytes before the old size are the same, only the rest goes
        assert node_sync.start_of(held, 6000, found.st_mtime_ns + 1, descriptor) == 5000
        # the same size, touched: whole (its middle may have changed)
        assert node_sync.start_of(held, 5000, found.st_mtime_ns + 1, descriptor) == 0
        # shrunk (truncated and written again): whole
        assert node_sync.start_of(held, 4000, found.st_mtime_ns + 1, descriptor) == 0
    finally:
        os.close(descriptor)
    path.write_bytes(b"b" * 5000 + b"more")  # rewritten, then grown: the old tail differs
    descriptor = os.open(path, os.O_RDONLY)
    try:
        assert node_sync.start_of(held, 5004, 1, descriptor) == 0
    finally:
        os.close(descriptor)


def test_read_held_leaves_out_entries_of_another_shape() -> None:
    held = node_sync.read_held(
        {"a": [1, 2, "x"], "b": [True, 2, "x"], "c": [1, 2], "d": "x", "e": [1, 2, 3], 7: [1, 2, "x"]}
    )
    assert held == {"a": node_sync.Held(1, 2, "x")}
    assert node_sync.read_held(["not", "a", "mapping"]) == {}


def test_a_secret_split_between_two_syncs_is_never_sent_in_part() -> None:
    secrets = [SECRET.encode()]
    first = b"line one\nthe value is hunter2-to"
    keep = node_sync.held_back(first, secrets)
    assert first[: len(first) - keep] == b"line one\nthe value is "
    whole = first[len(first) - keep :] + b"ken and on\n"
    assert node_sync.masked(whole, secrets) == (b"*** and on\n", 1)
    assert node_sync.held_back(b"no secret here\n", secrets) == 0


def test_destination_is_the_final_layout_s_place() -> None:
    run = Path("/runs/j1")
    assert sync.destination(run, "n0", "n0", "output/metrics.jsonl") == run / "output" / "metrics.jsonl"
    assert sync.destination(run, "n0", "n1", "output/metrics.jsonl") == run / "nodes/n1/output/metrics.jsonl"
    assert sync.destination(run, "n0", "n0", "telemetry/n1.jsonl") == run / "telemetry" / "n1.jsonl"
    # a link, another name or a deeper path stays in the node's directory, as the collect leaves it
    assert (
        sync.destination(run, "n0", "n0", "telemetry/n1.jsonl", link=True)
        == run / "nodes/n0/telemetry/n1.jsonl"
    )
    assert sync.destination(run, "n0", "n0", "telemetry/notes.txt") == run / "nodes/n0/telemetry/notes.txt"
    assert sync.destination(run, "n0", "n1", "telemetry/n1.jsonl") == run / "nodes/n1/telemetry/n1.jsonl"
    assert sync.destination(run, "n0", "n0", "logs/1/rank.0/stdout") == run / "nodes/n0/logs/1/rank.0/stdout"


def test_a_node_leaves_out_secrets_the_bundle_temporaries_checkpoints_and_the_project(tmp_path: Path) -> None:
    make_job(tmp_path)
    first = job_dir(tmp_path, "node0")
    os.symlink("metrics.jsonl", first / "output" / "latest.jsonl")
    os.mkfifo(first / "output" / "pipe")
    answer = node_sync.part(str(first), str(first.parent.parent), {}, node_sync.BUDGET)
    paths = {entry["path"] for entry in answer["files"]}
    assert paths == {
        "job.json",
        "status.json",
        "output/metrics.jsonl",
        "output/latest.jsonl",
        "output/tensorboard/events.out.tfevents.1",
        "telemetry/node0.jsonl",
        "logs/1/rank.0/stdout",
        "logs/1/rank.1/stdout",
    }
    assert answer["left_out"] == ["output/pipe (not a file, directory or link)"]
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(answer["archive"]))) as tar:
        log = tar.extractfile("logs/1/rank.0/stdout")
        assert log is not None and log.read() == b"rank 0 starts with ***\n"
        assert tar.getmember("output/latest.jsonl").linkname == "metrics.jsonl"


def test_a_job_directory_reached_through_a_link_is_refused(tmp_path: Path) -> None:
    make_job(tmp_path)
    jobs = job_dir(tmp_path, "node0").parent
    os.rename(jobs / JOB, jobs / "elsewhere")
    os.symlink("elsewhere", jobs / JOB)
    with pytest.raises(node_sync.SyncError, match="symbolic link"):
        node_sync.part(str(jobs / JOB), str(jobs.parent), {}, node_sync.BUDGET)


@pytest.mark.parametrize(
    ("secrets_json", "said"),
    [
        (None, r"has secrets \(secret_env\) but its secrets\.json is missing"),
        ("{not json", r"secrets\.json is not JSON .* could not be masked"),
        ('["a list"]', r"secrets\.json holds no object .* could not be masked"),
    ],
)
def test_a_job_with_secrets_whose_values_cannot_be_read_sends_nothing(
    tmp_path: Path, secrets_json: str | None, said: str
) -> None:
    # secrets.json gone (a collect took it) or invalid: the logs could not be masked.
    make_job(tmp_path)
    first = job_dir(tmp_path, "node0")
    spec = json.loads((first / "job.json").read_text())
    (first / "job.json").write_text(json.dumps({**spec, "secret_env": ["TOKEN"]}))
    if secrets_json is None:
        (first / "secrets.json").unlink()
    else:
        (first / "secrets.json").write_text(secrets_json)
    for check in (False, True):
        with pytest.raises(node_sync.SyncError, match=said):
            node_sync.part(str(first), str(first.parent.parent), {}, node_sync.BUDGET, check)
    if secrets_json is not None:
        return

    (first / "job.json").write_text("{torn")  # cannot tell whether it has secrets: nothing on a guess
    with pytest.raises(node_sync.SyncError, match=r"its job\.json cannot be read"):
        node_sync.part(str(first), str(first.parent.parent), {}, node_sync.BUDGET)


def test_a_job_without_secrets_or_with_them_readable_is_sent(tmp_path: Path) -> None:
    make_job(tmp_path)
    first = job_dir(tmp_path, "node0")
    spec = json.loads((first / "job.json").read_text())
    (first / "job.json").write_text(json.dumps({**spec, "secret_env": ["TOKEN"]}))
    answer = node_sync.part(str(first), str(first.parent.parent), {}, node_sync.BUDGET)
    assert sum(entry["masked"] for entry in answer["files"]) == 2
    (first / "secrets.json").write_text(json.dumps({"TOKEN": "abc"}))  # too short to be masked: none to hide
    assert node_sync.part(str(first), str(first.parent.parent), {}, node_sync.BUDGET)["files"]
    (first / "job.json").write_text(json.dumps(spec))  # no secret_env
    (first / "secrets.json").unlink()
    assert node_sync.part(str(first), str(first.parent.parent), {}, node_sync.BUDGET)["files"]


# --- the controller's merge and the bytes moved -------------------------------------------------------------


def test_a_first_sync_lays_out_as_the_collect_and_a_second_moves_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    (runs / JOB).mkdir(parents=True)
    (runs / JOB / "plan.json").write_text("the controller's plan")
    first = run_sync(cluster, runs)
    run = runs / JOB
    assert (run / "output" / "metrics.jsonl").read_text().startswith('{"kind": "step"')
    assert (run / "output" / "tensorboard" / "events.out.tfevents.1").read_bytes() == b"\0\1events" * 100
    assert (run / "logs" / "rank.1.log").read_text() == "rank 1 starts with ***\n"
    assert (run / "telemetry" / "node0.jsonl").read_text() == '{"time": 1, "node": "node0"}\n'
    assert not (run / "nodes" / "node0" / "telemetry").exists()
    assert (run / "nodes" / "node1" / "job.json").is_file()
    assert (run / "output" / "loss.png").read_bytes().startswith(b"\x89PNG")
    assert (
        not (run / "output" / "checkpoints").exists() and not (run / "nodes" / "node0" / "workdir").exists()
    )
    assert not list(run.rglob("secrets.json")) and not list(run.rglob("job.tar.gz"))
    assert (run / "plan.json").read_text() == "the controller's plan" and not (run / "status.json").exists()
    assert first.files == 8 and first.bytes > 1000 and first.packed > 0 and not first.warnings
    assert "brought 8 file(s)" in first.lines()[0] and str(run) in first.lines()[0]

    second = run_sync(cluster, runs)
    assert (second.files, second.bytes, second.packed) == (0, 0, 0)
    # what crossed: the manifest sent and an answer with no file
    assert second.answer < 2500, second.answer
    assert "nothing changed since the last sync" in second.lines()[0]


def test_only_the_appended_bytes_move_when_a_log_and_the_metrics_grow(
    cluster: Cluster, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    run_sync(cluster, runs)
    node = job_dir(cluster.root, "node0")
    plot_before = (runs / JOB / "output" / "loss.png").read_bytes()
    added = '{"kind": "step", "step": 2, "loss": 1.0}\n'
    with open(node / "output" / "metrics.jsonl", "a") as handle:
        handle.write(added)
    with open(node / "logs" / "1" / "rank.0" / "stdout", "a") as handle:
        handle.write(f"step 2 {SECRET}\n")
    grown = run_sync(cluster, runs)
    assert grown.paths == {"node0": ["logs/1/rank.0/stdout", "output/metrics.jsonl"], "node1": []}
    assert grown.bytes == len(added) + len("step 2 ***\n")
    assert (runs / JOB / "output" / "metrics.jsonl").read_text().endswith(added)
    assert (runs / JOB / "logs" / "rank.0.log").read_text() == "rank 0 starts with ***\nstep 2 ***\n"
    assert grown.plot and (runs / JOB / "output" / "loss.png").read_bytes() != plot_before


def test_a_file_changed_on_the_controller_is_asked_for_whole_again(cluster: Cluster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run_sync(cluster, runs)
    (runs / JOB / "output" / "metrics.jsonl").write_text("edited here")
    (runs / JOB / "nodes" / "node1" / "job.json").unlink()
    again = run_sync(cluster, runs)
    assert again.paths == {"node0": ["output/metrics.jsonl"], "node1": ["job.json"]}
    assert (runs / JOB / "output" / "metrics.jsonl").read_text().startswith('{"kind": "step"')


def test_check_mode_says_what_would_move_and_writes_nothing(cluster: Cluster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    checked = run_sync(cluster, runs, check=True)
    assert checked.files == 8 and checked.bytes > 1000
    assert checked.lines()[0].startswith(f"check mode: job {JOB}: would bring 8 file(s)")
    assert sorted(path.name for path in (runs / JOB).iterdir()) == [sync.LOCK]


def test_a_job_that_is_over_is_not_synced_and_attach_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_job(tmp_path / "cluster", state="succeeded")
    done = run_sync(Cluster(tmp_path / "cluster", monkeypatch), tmp_path / "runs")
    assert done.over == "succeeded" and done.files == 0
    assert f"ansible-playbook train.yml -e attach={JOB}" in done.lines()[0]
    assert not (tmp_path / "runs" / JOB / "output").exists()
    (tmp_path / "runs" / JOB / "status.json").write_text(Status(state="succeeded").dumps())  # collected
    assert done.lines() == [f"job {JOB} is over (succeeded) and collected: its results are in {done.run_dir}"]


def test_a_node_s_budget_leaves_the_rest_for_the_next_sync(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = job_dir(cluster.root, "node0") / "output" / "big.bin"
    big.write_bytes(bytes(range(256)) * 8192)  # 2 MiB, binary: sent as it is
    monkeypatch.setattr(node_sync, "BUDGET", 2 << 20)  # 1 MiB per node
    runs = tmp_path / "runs"
    passes = [run_sync(cluster, runs) for _ in range(4)]
    assert passes[0].pending > 0 and "run the sync again" in passes[0].lines()[-1]
    assert passes[-1].pending == 0 and passes[-1].files == 0
    assert (runs / JOB / "output" / "big.bin").read_bytes() == big.read_bytes()


def test_a_second_sync_of_the_same_run_at_once_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    with sync.locked(tmp_path / "runs" / JOB), pytest.raises(sync.SyncError, match="another sync"):
        run_sync(cluster, tmp_path / "runs")


def test_a_job_that_draws_its_own_loss_png_keeps_it(cluster: Cluster, tmp_path: Path) -> None:
    (job_dir(cluster.root, "node0") / "output" / "loss.png").write_bytes(b"the job's own curve")
    runs = tmp_path / "runs"
    synced = run_sync(cluster, runs)
    assert not synced.plot and (runs / JOB / "output" / "loss.png").read_bytes() == b"the job's own curve"
    assert not sync.drawn_by_sync(runs / JOB)


def test_drawn_by_sync_tells_the_sync_s_curve_from_another(cluster: Cluster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run_sync(cluster, runs)
    assert sync.drawn_by_sync(runs / JOB)
    (runs / JOB / "output" / "loss.png").write_bytes(b"the report's final curve")
    assert not sync.drawn_by_sync(runs / JOB)


# --- hostile members ------------------------------------------------------------------------------------


def hostile_part(
    members: list[tuple[tarfile.TarInfo, bytes]], listed: list[dict[str, Any]]
) -> dict[str, Any]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return {"files": listed, "archive": base64.b64encode(buffer.getvalue()).decode()}


def info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    made = tarfile.TarInfo(name)
    made.type, made.linkname = kind, link
    return made


def entry(path: str, start: int = 0, size: int = 4) -> dict[str, Any]:
    return {"path": path, "start": start, "size": size, "mtime": 1, "tail": "t", "bytes": 4}


def test_hostile_members_are_refused_and_nothing_outside_the_run_is_written(tmp_path: Path) -> None:
    run = tmp_path / "runs" / JOB
    run.mkdir(parents=True)
    for own in ("plan.json", "status.json"):
        (run / own).write_text("the controller's own")
    names = [
        ("../escape", tarfile.REGTYPE, ""),
        ("/etc/evil", tarfile.REGTYPE, ""),
        ("output/../../plan.json", tarfile.REGTYPE, ""),
        ("output/up", tarfile.SYMTYPE, "../status.json"),
        ("output/abs", tarfile.SYMTYPE, "/etc/passwd"),
        ("output/hard", tarfile.LNKTYPE, "plan.json"),
        ("output/dev", tarfile.CHRTYPE, ""),
        ("output/d", tarfile.SYMTYPE, "sub"),
        ("output/d/through", tarfile.REGTYPE, ""),
        ("output", tarfile.REGTYPE, ""),
        ("output/x/up/../y", tarfile.SYMTYPE, "../.."),
        ("output/unlisted", tarfile.REGTYPE, ""),
        ("output/tail", tarfile.REGTYPE, ""),
        ("output/fine.txt", tarfile.REGTYPE, ""),
    ]
    members = [(info(name, kind, link), b"evil") for name, kind, link in names]
    listed = [entry(name) for name, _, _ in names if name != "output/unlisted"]
    listed[[item["path"] for item in listed].index("output/tail")]["start"] = 100  # a piece of nothing held
    answer = {"first": "node0", "nodes": ["node0"], "parts": {"node0": hostile_part(members, listed)}}
    manifest = sync.Manifest()
    synced = sync.Synced(JOB, run)
    sync.merge(run, answer, manifest, synced)
    assert (run / "plan.json").read_text() == (run / "status.json").read_text() == "the controller's own"
    assert not (tmp_path / "escape").exists() and not (tmp_path / "runs" / "escape").exists()
    written = sorted(
        str(path.relative_to(run)) for path in run.rglob("*") if not path.is_dir() or path.is_symlink()
    )
    assert written == ["output/d", "output/fine.txt", "plan.json", "status.json"], written
    assert os.readlink(run / "output" / "d") == "sub"
    assert synced.paths == {"node0": ["output/d", "output/fine.txt"]}
    [warning] = synced.warnings
    assert warning.startswith("sync: left out 12 member(s) from node0:")


def test_an_answer_for_a_node_name_that_is_a_path_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "runs" / JOB
    part = hostile_part([(info("job.json"), b"evil")], [entry("job.json")])
    answer = {"first": "node0", "parts": {"../..": part, "node0": {"error": "no answer within 600 s"}}}
    synced = sync.Synced(JOB, run)
    sync.merge(run, answer, sync.Manifest(), synced)
    assert not list(tmp_path.rglob("job.json"))
    assert synced.warnings == [
        "sync: an answer for '../..', which is no node name, was left out",
        "sync: node0 sent nothing: no answer within 600 s",
    ]


def test_a_link_laid_out_before_is_never_written_through(tmp_path: Path) -> None:
    run = tmp_path / "runs" / JOB
    (run / "output").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, run / "output" / "tensorboard")  # as a hostile earlier layout could have left
    part = hostile_part([(info("output/tensorboard/events"), b"evil")], [entry("output/tensorboard/events")])
    synced = sync.Synced(JOB, run)
    sync.merge(run, {"first": "node0", "parts": {"node0": part}}, sync.Manifest(), synced)
    assert list(outside.iterdir()) == []
    assert "a path through a link" in synced.warnings[0]


@pytest.mark.parametrize("check", [False, True])
def test_a_part_of_another_shape_is_warned_about_never_raised(tmp_path: Path, check: bool) -> None:
    run = tmp_path / "runs" / JOB
    run.mkdir(parents=True)
    part = hostile_part([(info("output/fine.txt"), b"evil")], [entry("output/fine.txt")])
    odd = {
        "pending": "lots",
        "left_out_count": 3,
        "left_out": 7,
        "files": [{"path": "output/a", "bytes": "many"}, {"path": "output/b", "bytes": 4}],
    }
    answer = {
        "first": "node0",
        "nodes": 5,
        "launcher": "torchrun",
        "parts": {"node0": {**part, "pending": "lots"}, "node1": odd, "node2": {"files": 5, "archive": ""}},
    }
    synced = sync.Synced(JOB, run, check=check)
    sync.merge(run, answer, sync.Manifest(), synced)
    said = "\n".join(synced.warnings)
    assert "sync: node0 sent 'lots' as its bytes pending, not a count" in said
    assert "sync: node1 sent 'lots' as its bytes pending" in said and synced.pending == 0
    if check:
        assert "sync: node1 listed 1 file(s) with no byte count" in said and synced.bytes == 4 + 4
    else:
        assert (run / "output" / "fine.txt").read_bytes() == b"evil"


def test_a_member_larger_than_listed_or_than_a_sync_is_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A gzip member of 64 MB of zeros is some 64 kB on the wire: its declared size is checked against the
    # node's own count and what one sync brings before a byte is read, and a member is copied in chunks.
    monkeypatch.setattr(sync, "MEMBER_BYTES", 48 << 20)
    reads: list[int] = []
    real = tarfile.ExFileObject.read

    def read(self: Any, size: int | None = -1) -> bytes:
        reads.append(-1 if size is None or size < 0 else size)
        return real(self, size)

    monkeypatch.setattr(tarfile.ExFileObject, "read", read)
    run = tmp_path / "runs" / JOB
    run.mkdir(parents=True)
    big = b"\0" * (32 << 20)
    members = [(info(f"output/{name}"), big) for name in ("a", "b", "lied")] + [(info("output/c"), b"evil")]
    listed = [{**entry(f"output/{name}"), "bytes": len(big)} for name in ("a", "b")]
    listed += [entry("output/lied"), entry("output/c")]  # "lied" says 4 bytes
    synced = sync.Synced(JOB, run)
    sync.merge(
        run, {"first": "node0", "parts": {"node0": hostile_part(members, listed)}}, sync.Manifest(), synced
    )
    assert (run / "output" / "a").stat().st_size == len(big) and (
        run / "output" / "c"
    ).read_bytes() == b"evil"
    assert not (run / "output" / "b").exists() and not (run / "output" / "lied").exists()
    said = synced.warnings[0]
    assert "output/b (over the 50331648 bytes one sync brings)" in said
    assert "output/lied (33554432 bytes in the archive, 4 in the node's list)" in said
    assert reads and max(reads) <= sync.CHUNK and -1 not in reads
    assert not list(run.rglob(".*piece*")) and not list(run.rglob(".*sync-*"))


def test_a_piece_is_appended_in_chunks_from_a_file_beside(tmp_path: Path) -> None:
    run = tmp_path / "runs" / JOB
    (run / "output").mkdir(parents=True)
    (run / "output" / "log").write_bytes(b"held")
    manifest = sync.Manifest(nodes={"node0": {"output/log": sync.Kept(4, 1, "t", 4)}})
    part = hostile_part([(info("output/log"), b"more")], [entry("output/log", start=4, size=8)])
    synced = sync.Synced(JOB, run)
    sync.merge(run, {"first": "node0", "parts": {"node0": part}}, manifest, synced)
    assert (run / "output" / "log").read_bytes() == b"heldmore" and synced.bytes == 4 and not synced.warnings
    assert manifest.nodes["node0"]["output/log"] == sync.Kept(8, 1, "t", 8)
    assert sorted(path.name for path in (run / "output").iterdir()) == ["log"]


def test_the_controller_s_member_limit_is_the_nodes_budget() -> None:
    assert sync.MEMBER_BYTES == node_sync.BUDGET


def test_a_manifest_of_another_shape_is_read_as_none(tmp_path: Path) -> None:
    (tmp_path / sync.MANIFEST).write_text(
        json.dumps({"nodes": {"node0": {"a": [1, 2, "t", 4], "b": [1, "x"]}}})
    )
    assert sync.Manifest.load(tmp_path).nodes == {"node0": {"a": sync.Kept(1, 2, "t", 4)}}
    (tmp_path / sync.MANIFEST).write_text("[1, 2]")
    assert sync.Manifest.load(tmp_path) == sync.Manifest()


def test_the_entry_node_hands_the_request_to_the_job_s_first_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[tuple[str, str, bytes]] = []

    def ask(mesh: Mesh, node: str, command: str, request: bytes) -> dict[str, Any]:
        asked.append((node, command, request))
        return {"job": JOB, "first": node, "parts": {}}

    monkeypatch.setattr(node_sync, "ask", ask)
    monkeypatch.setattr(node_sync, "locate", lambda *_: node_sync.Located("node3", ["node3", "node4"], False))
    monkeypatch.setattr(node_sync.socket, "gethostname", lambda: "node0")
    args = node_sync.parser().parse_args(["--job", JOB, "--nodes", "node0,node3,node4"])
    answer = node_sync.run(args, {"nodes": {"node3": {}}})
    [(node, command, request)] = asked
    assert node == "node3" and "--first --nodes-now node3,node4" in command
    assert json.loads(request) == {"nodes": {"node3": {}}}
    assert answer == {"job": JOB, "first": "node3", "parts": {}, "via": "node0"}
