"""The job's results_max_gb on the controller (issue 45, point 5): each node's share of the collect, the
layout that never writes more than the limit whatever the archives say, the first node's output first, and
the syncs of a running job bounded by the same limit (a sparse file, a NUL-led file and a large secrets.json
on the node side too)."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml
from test_sync import JOB, NODES, SECRET, Cluster, job_dir, make_job, run_sync

from ddp_cluster.job import results, sync
from ddp_cluster.supervisor import sync as node_sync

REPO = Path(__file__).resolve().parents[2]


def archive(run_dir: Path, node: str, files: dict[str, bytes]) -> None:
    incoming = run_dir / ".incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    with tarfile.open(incoming / f"{node}.tar.gz", "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def plan_json(run_dir: Path, gib: float) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.json").write_text(json.dumps({"spec": {"results_max_gb": gib}}))


def test_the_default_limit_is_the_settings() -> None:
    specs = yaml.safe_load((REPO / "roles" / "ddp_job" / "meta" / "argument_specs.yml").read_text())
    assert (
        specs["argument_specs"]["main"]["options"]["ddp_job_results_max_gb"]["default"]
        == results.RESULTS_MAX_GB
    )


def test_the_first_node_has_three_quarters_at_least_and_the_shares_never_sum_over_the_limit() -> None:
    for count in (1, 2, 3, 8, 1000):
        nodes = [f"node{index}" for index in range(count)]
        for first in ("node0", nodes[-1]):
            parts = results.shares(1 << 40, nodes, first)
            assert sum(parts.values()) <= 1 << 40 and parts[first] >= 3 * (1 << 40) // 4
            assert len({parts[node] for node in nodes if node != first}) <= 1
    assert results.shares(1000, ["a", "b"], "a") == {"a": 875, "b": 125}


def test_the_collect_share_follows_the_standby_that_ended_the_job(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "j"
    run_dir.mkdir(parents=True)
    plan = {
        "spec": {"results_max_gb": 1},
        "first": "node0",
        "run_dir": str(run_dir),
        "host_dirs": {"node0": "/w/jobs/j", "node1": "/w/jobs/j", "spare": "/w/jobs/j"},
    }
    gib = 1 << 30
    assert results.collect_share(plan, "node0") == gib - 2 * (gib // 12)
    assert results.collect_share(plan, "node1") == gib // 12
    (run_dir / "status.json").write_text(json.dumps({"supervisor_node": "node1"}))  # node0 was lost
    assert results.collect_share(plan, "node1") == gib - 2 * (gib // 12)
    (run_dir / "status.json").write_bytes(b"\xff not json")
    assert results.collect_share(plan, "node0") == gib - 2 * (gib // 12)
    assert results.collect_share({"spec": {}}, "node0") == results.RESULTS_MAX_GB * gib


def test_the_limit_is_the_plans_else_the_default(tmp_path: Path) -> None:
    assert results.run_limit(tmp_path) == results.RESULTS_MAX_GB << 30
    plan_json(tmp_path, 0.5)
    assert results.run_limit(tmp_path) == 1 << 29
    (tmp_path / "plan.json").write_text(json.dumps({"spec": {"results_max_gb": "lots"}}))
    assert results.run_limit(tmp_path) == results.RESULTS_MAX_GB << 30


def test_the_layout_writes_no_more_than_the_limit_whatever_the_archives_say(tmp_path: Path) -> None:
    """A gzip of zeros declares gigabytes in a few kB: the layout counts what members declare, the first
    node's first, and leaves out (naming them) those over what is left; the rest is laid out."""
    run_dir = tmp_path / "runs" / "j"
    archive(run_dir, "node1", {"logs/1/rank.1/stdout": b"rank 1\n", "output/zeros.bin": bytes(6000)})
    archive(
        run_dir,
        "node0",
        {
            "status.json": b"{}",
            "logs/1/rank.0/stdout": b"rank 0\n",
            "output/checkpoints/epoch-00001.ckpt": b"c" * 5000,
        },
    )
    done = results.lay_out(run_dir, "node0", ["node1", "node0"], max_bytes=6000)
    assert (run_dir / "output" / "checkpoints" / "epoch-00001.ckpt").read_bytes() == b"c" * 5000
    assert (run_dir / "logs" / "rank.0.log").read_bytes() == b"rank 0\n"
    assert (run_dir / "logs" / "rank.1.log").read_bytes() == b"rank 1\n"  # small: it still fits
    assert not (run_dir / "nodes" / "node1" / "output" / "zeros.bin").exists()
    assert done.warnings == [
        "results: 1 file(s) of node1 left out, over the job's results_max_gb (output/zeros.bin (6000 bytes)):"
        " raise -e results_max_gb to bring them"
    ]


def test_the_layout_reads_the_jobs_limit_from_its_plan(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "j"
    plan_json(run_dir, 100 / (1 << 30))  # 100 bytes
    archive(run_dir, "node0", {"status.json": b"{}", "output/big.bin": b"b" * 200})
    done = results.lay_out(run_dir, "node0", ["node0"])
    assert (run_dir / "status.json").exists() and not (run_dir / "output" / "big.bin").exists()
    assert "output/big.bin (200 bytes)" in done.warnings[0]


# --- the syncs ------------------------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    make_job(tmp_path / "cluster")
    return Cluster(tmp_path / "cluster", monkeypatch)


def test_a_sync_never_holds_more_than_the_jobs_limit(cluster: Cluster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    plan_json(runs / JOB, 3000 / (1 << 30))
    big = job_dir(cluster.root, "node0") / "output" / "big.log"
    big.write_text("x" * 5000)
    done = run_sync(cluster, runs)
    assert json.loads(cluster.sent[0])["left"] == 3000
    copy = runs / JOB / "output" / "big.log"
    assert not copy.exists() or copy.stat().st_size < 3000  # a piece, at most
    held = sum(
        kept.local for files in sync.Manifest.load(runs / JOB).nodes.values() for kept in files.values()
    )
    assert 0 < held <= 3000
    assert done.pending and "of the 3000 its results_max_gb allows the syncs" in done.lines()[-1]
    again = run_sync(cluster, runs)
    assert json.loads(cluster.sent[-1])["left"] == 3000 - held  # what fits still comes, never more
    manifest = sync.Manifest.load(runs / JOB)
    assert sum(kept.local for files in manifest.nodes.values() for kept in files.values()) <= 3000
    assert again.pending


def test_a_node_s_refusal_is_the_controller_s_too_whatever_the_node_sends(tmp_path: Path) -> None:
    """The controller's room holds against a node that sends more than it was told."""
    data = b"y" * 500
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("output/a.log")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    import base64

    entry = {"path": "output/a.log", "start": 0, "size": 500, "mtime": 1, "tail": "t", "bytes": 500}
    part = {"files": [entry], "archive": base64.b64encode(buffer.getvalue()).decode()}
    synced = sync.Synced(JOB, tmp_path, limit=400, room=400)
    written = sync.merge_part(tmp_path, "node0", "node0", part, sync.Manifest(), synced)
    assert written == [] and not (tmp_path / "output" / "a.log").exists()
    assert "500 bytes: over the 400 bytes the job's results_max_gb has left" in synced.warnings[0]


def test_a_node_sends_no_sparse_file_and_masks_a_file_with_a_nul_first(tmp_path: Path) -> None:
    make_job(tmp_path)
    first = job_dir(tmp_path, "node0")
    hole = first / "output" / "scratch.bin"
    subprocess.run(["truncate", "-s", "20G", str(hole)], check=True)
    (first / "output" / "events.bin").write_bytes(b"\0\0" + SECRET.encode() + b"\0")
    answer = node_sync.part(str(first), str(first.parent.parent), {}, node_sync.BUDGET)
    assert answer["left_out_count"] == 1 and answer["left_out"][0].startswith("output/scratch.bin (sparse: ")
    sent = {entry["path"]: entry for entry in answer["files"]}
    assert "output/scratch.bin" not in sent and sent["output/events.bin"]["masked"] == 1
    with tarfile.open(fileobj=io.BytesIO(__import__("base64").b64decode(answer["archive"]))) as tar:
        assert tar.extractfile("output/events.bin").read() == b"\0\0***\0"  # type: ignore[union-attr]


def test_a_node_reads_a_secrets_json_over_a_mib_whole(tmp_path: Path) -> None:
    make_job(tmp_path)
    first = job_dir(tmp_path, "node0")
    (first / "secrets.json").write_text(json.dumps({"TOKEN": SECRET, "pad": "p" * (1 << 21)}))
    answer = node_sync.part(str(first), str(first.parent.parent), {}, node_sync.BUDGET)
    assert sum(entry["masked"] for entry in answer["files"]) == 2  # the two ranks' logs


def test_the_nodes_are_told_what_is_left_split_between_them(tmp_path: Path) -> None:
    make_job(tmp_path)
    answer = node_sync.gather(
        JOB,
        str(job_dir(tmp_path, "node0").parent),
        {"left": 0},
        node_sync.Mesh("node0"),
        [],
        False,
    )
    part = answer["parts"]["node0"]
    assert part["bytes"] == 0 and part["pending"] > 0 and NODES[0] == "node0"
