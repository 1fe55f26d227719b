"""Real 2-process gloo runs of ``python -m ddp_cluster.train`` on this host, started as mpirun or torchrun do.

(a) every rank ends with bitwise identical parameters; (b) 2 processes x batch B match 1 process x batch 2B
(the gradients are averaged, not summed); (c) digits reaches test accuracy >= 0.90; (d) a run stopped after
an epoch and resumed ends exactly where an uninterrupted run ends; a corrupt checkpoint stops every rank;
(e) with --checkpoint-every, a run resumed from a mid-epoch checkpoint, on 2 processes or on 1, goes on
from that step.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from ddp_cluster.runtime import checkpoint as ckpt
from ddp_cluster.runtime.train import main

SYNTHETIC = ["--dataset", "synthetic", "--synthetic-samples", "512", "--lr", "0.1", "--log-every", "4"]
PER_RANK_BATCH = 16
DIGEST = re.compile(r"params sha256 ([0-9a-f]{64})")
LOCAL_LOSS = re.compile(r"epoch 1 done: \d+ batches, local loss ([0-9.]+)")


def final_state(out: Path) -> dict[str, Any]:
    path = ckpt.latest_checkpoint(out / "checkpoints")
    assert path is not None, f"no checkpoint in {out}"
    return ckpt.load_checkpoint(path)


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory: pytest.TempPathFactory, launch: Any) -> Any:
    out = tmp_path_factory.mktemp("digits") / "run"
    run = launch(
        ["--dataset", "digits", "--epochs", "4", "--batch-size", "32"], out, nproc=2, style="openmpi"
    )
    assert run.ok, run.explain()
    return run


@pytest.fixture(scope="module")
def synthetic_whole(tmp_path_factory: pytest.TempPathFactory, launch: Any) -> Any:
    out = tmp_path_factory.mktemp("whole") / "run"
    run = launch([*SYNTHETIC, "--epochs", "2", "--batch-size", str(PER_RANK_BATCH)], out, nproc=2)
    assert run.ok, run.explain()
    return run


def test_a_all_ranks_end_with_identical_parameters(digits_run: Any) -> None:
    digests = [DIGEST.findall(rank.stdout) for rank in digits_run.ranks]
    assert all(len(found) == 1 for found in digests), digits_run.explain()
    assert digests[0] == digests[1] == [digits_run.summary()["params_sha256"]]
    # ... although each rank trained on its own half of the data
    local_losses = [LOCAL_LOSS.search(rank.stdout) for rank in digits_run.ranks]
    assert all(local_losses) and local_losses[0].group(1) != local_losses[1].group(1)  # type: ignore[union-attr]


def test_c_digits_reaches_90_percent(digits_run: Any) -> None:
    summary = digits_run.summary()
    assert summary["world_size"] == 2 and summary["launcher"] == "openmpi" and summary["backend"] == "gloo"
    assert summary["accuracy"] >= 0.90, summary


def test_each_rank_logs_its_own_lines(digits_run: Any) -> None:
    for rank in digits_run.ranks:
        lines = rank.stdout.splitlines()
        assert lines and all(line.startswith(f"[rank {rank.rank}/2] ") for line in lines)
        assert "started by openmpi" in lines[0] and rank.stderr == ""
    assert "test_accuracy" in digits_run.ranks[0].stdout and "test_accuracy" not in digits_run.ranks[1].stdout


def test_b_two_processes_match_one_process_on_the_same_global_batch(
    synthetic_whole: Any, tmp_path: Path, no_launcher: None
) -> None:
    two = final_state(synthetic_whole.output_dir)
    assert (
        main(
            [
                *SYNTHETIC,
                "--epochs",
                "2",
                "--batch-size",
                str(2 * PER_RANK_BATCH),
                "--output-dir",
                str(tmp_path / "one"),
            ]
        )
        == 0
    )
    one = final_state(tmp_path / "one")
    assert two["step"] == one["step"] == 32
    tolerance = 1e-5
    assert max_difference(two["model"], one["model"]) < tolerance
    assert abs(synthetic_whole.summary()["final_loss"] - one["metrics"]["loss"]) < tolerance
    # the tolerance tells runs apart: one process on the per-rank batch alone ends elsewhere
    assert (
        main(
            [
                *SYNTHETIC,
                "--epochs",
                "2",
                "--batch-size",
                str(PER_RANK_BATCH),
                "--output-dir",
                str(tmp_path / "half"),
            ]
        )
        == 0
    )
    assert max_difference(two["model"], final_state(tmp_path / "half")["model"]) > 100 * tolerance


def test_d_resumed_run_ends_where_an_uninterrupted_run_ends(
    synthetic_whole: Any, tmp_path: Path, launch: Any
) -> None:
    out = tmp_path / "parts"
    args = [*SYNTHETIC, "--batch-size", str(PER_RANK_BATCH)]
    first = launch([*args, "--epochs", "1"], out, nproc=2)
    assert first.ok, first.explain()
    second = launch([*args, "--epochs", "2", "--resume"], out, nproc=2)
    assert second.ok, second.explain()
    for rank in second.ranks:
        assert f"resuming from {out}/checkpoints/epoch-00001.ckpt (epoch 1, step 16)" in rank.stdout
    digests = [DIGEST.findall(rank.stdout) for rank in second.ranks]
    assert digests[0] == digests[1] == [synthetic_whole.summary()["params_sha256"]]
    resumed, whole = final_state(out), final_state(synthetic_whole.output_dir)
    assert (resumed["epoch"], resumed["step"]) == (whole["epoch"], whole["step"]) == (2, 32)
    for name in whole["model"]:
        assert torch.equal(resumed["model"][name], whole["model"][name]), name
    for index, buffers in whole["optimizer"]["state"].items():
        assert torch.equal(
            resumed["optimizer"]["state"][index]["momentum_buffer"], buffers["momentum_buffer"]
        )
    assert second.summary()["final_loss"] == synthetic_whole.summary()["final_loss"]


def test_corrupt_checkpoint_stops_every_rank(digits_run: Any, tmp_path: Path, launch: Any) -> None:
    out = tmp_path / "copy"
    shutil.copytree(digits_run.output_dir, out)
    latest = out / "checkpoints" / "epoch-00004.ckpt"
    data = bytearray(latest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    latest.write_bytes(bytes(data))
    run = launch(["--dataset", "digits", "--epochs", "5", "--resume"], out, nproc=2, timeout=60)
    for rank in run.ranks:
        assert rank.returncode == 2, run.explain()
        assert f"checkpoint {latest} is corrupt" in rank.stderr, run.explain()
        assert "resuming" not in rank.stdout


def test_e_resume_from_a_mid_epoch_checkpoint_continues_at_its_step(
    synthetic_whole: Any, tmp_path: Path, launch: Any, no_launcher: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # 512 samples, 2 ranks x 16: 16 batches (steps) an epoch
    out = tmp_path / "every"
    args = [
        *SYNTHETIC,
        "--batch-size",
        str(PER_RANK_BATCH),
        "--checkpoint-every",
        "5",
        "--checkpoint-keep",
        "20",
    ]
    run = launch([*args, "--epochs", "2"], out, nproc=2)
    assert run.ok, run.explain()
    names = [path.name for _, path in ckpt.list_checkpoints(out / "checkpoints")]
    assert names == [
        "epoch-00000.step-000000005.ckpt",
        "epoch-00000.step-000000010.ckpt",
        "epoch-00000.step-000000015.ckpt",
        "epoch-00001.ckpt",
        "epoch-00001.step-000000020.ckpt",
        "epoch-00001.step-000000025.ckpt",
        "epoch-00001.step-000000030.ckpt",
        "epoch-00002.ckpt",
    ]
    assert sorted(path.name for path in (out / "checkpoints").iterdir()) == names
    whole = synthetic_whole.summary()
    assert run.summary()["params_sha256"] == whole["params_sha256"] and run.summary()["steps"] == 32

    def killed_after(name: str, directory: Path) -> Path:
        """What a run killed after writing checkpoint ``name`` leaves behind."""
        shutil.copytree(out, directory)
        for path in (directory / "checkpoints").iterdir():
            if ckpt.checkpoint_order(path.name) > ckpt.checkpoint_order(name):  # type: ignore[operator]
                path.unlink()
        (directory / "summary.json").unlink()
        return directory

    name = "epoch-00001.step-000000025.ckpt"  # 1 epoch and 9 batches done
    saved = ckpt.load_checkpoint(out / "checkpoints" / name)
    assert (saved["epoch"], saved["step"], saved["batch"], saved["world_size"]) == (1, 25, 9, 2)
    parts = killed_after(name, tmp_path / "parts")
    second = launch([*args, "--epochs", "2", "--resume"], parts, nproc=2)
    assert second.ok, second.explain()
    for rank in second.ranks:
        assert f"resuming from {parts}/checkpoints/{name} (epoch 1, step 25)" in rank.stdout
        assert "epoch 2 done: 7 batches" in rank.stdout
    assert "epoch 2 goes on after its first 9 batches" in second.ranks[0].stdout
    digests = [DIGEST.findall(rank.stdout) for rank in second.ranks]
    assert digests[0] == digests[1] == [whole["params_sha256"]]
    assert second.summary()["steps"] == whole["steps"] == 32
    assert abs(second.summary()["final_loss"] - whole["final_loss"]) < 1e-6

    # On 1 process: the 9 batches of 2 x 16 samples done are 18 of its batches of 16; 14 are left.
    alone = killed_after(name, tmp_path / "alone")
    capsys.readouterr()
    assert main([*args, "--epochs", "2", "--resume", "--output-dir", str(alone)]) == 0
    printed = capsys.readouterr().out
    assert f"resuming from {alone}/checkpoints/{name} (epoch 1, step 25)" in printed
    assert "was written with world size 2 and batch size 16, this run has 1 and 16" in printed
    assert "epoch 2 goes on after its first 18 batches" in printed and "epoch 2 done: 14 batches" in printed
    result = json.loads((alone / "summary.json").read_text())
    assert result["steps"] == 25 + 14 and result["samples"] == 14 * PER_RANK_BATCH
    epoch_2 = [json.loads(line) for line in (alone / "metrics.jsonl").read_text().splitlines()][-1]
    assert (epoch_2["kind"], epoch_2["epoch"], epoch_2["step"], epoch_2["samples"]) == ("epoch", 2, 39, 512)
