"""Where a job's logs are (one place for the supervisor and the results), and the results laid out under
runs/<job-id>/ from the nodes' archives, for mpirun and torchrun."""

from __future__ import annotations

import tarfile
from pathlib import Path

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
    assert results.lay_out(run, "node0", ["node0", "node1", "node2"]) == ["node2"]
    assert sorted(p.name for p in (run / "logs").iterdir()) == ["rank.0.log", "rank.1.log"]
    assert (run / "logs" / "rank.1.log").read_text() == "rank 1\n"
    assert (run / "summary.json").read_text() == "{}"  # the first node's outputs on top
    assert (run / "checkpoints" / "epoch-00002.ckpt").exists()
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
    assert results.lay_out(run, "node0", ["node0", "node1"], torchrun_nproc=2) == []
    names = sorted(p.name for p in (run / "logs").iterdir())
    assert names == ["agent.0.log", "agent.1.log", "rank.0.log", "rank.1.log", "rank.2.log", "rank.3.log"]
    assert (run / "logs" / "rank.3.log").read_text() == "out node1 1\nerr node1 1\n"  # the last attempt's
    assert (run / "logs" / "agent.1.log").read_text() == "agent 1\n"


def test_the_command_lays_out_what_came_back(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "j3"
    node_archive(run, "node0", {"logs/1/rank.0/stdout": "r0\n"})
    assert results.main([str(run), "node0", "node0,node1"]) == 0
    assert results.main([str(run)]) == 2
