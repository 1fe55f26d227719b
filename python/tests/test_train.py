"""ddp_cluster.runtime.train in this process (a world of one): outputs, resume rules, errors, the progress
bar."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from ddp_cluster.runtime import checkpoint as ckpt
from ddp_cluster.runtime.metrics import Reporter
from ddp_cluster.runtime.train import main, parse_args

SMALL = [
    "--dataset",
    "synthetic",
    "--synthetic-samples",
    "256",
    "--batch-size",
    "32",
    "--lr",
    "0.2",
    "--log-every",
    "3",
]
TIMING_KEYS = {"seconds", "samples_per_s", "step_time_s"}

pytestmark = pytest.mark.usefixtures("no_launcher")


def train(out: Path, *args: str) -> int:
    return main([*SMALL, "--output-dir", str(out), *args])


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def without_timing(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows]


def summary(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return data


def test_outputs_of_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert train(tmp_path, "--epochs", "2") == 0
    assert not dist.is_initialized()  # the process group was destroyed
    result = summary(tmp_path)
    assert result["dataset"] == "synthetic" and result["epochs"] == 2 and result["world_size"] == 1
    assert result["steps"] == 16 and result["samples"] == 512
    assert 0 < result["final_loss"] < 2.3 and 0.3 < result["accuracy"] <= 1  # it learned something
    assert result["samples_per_s"] > 0 and result["seconds"] >= result["train_seconds"] > 0
    assert result["checkpoint"] == "checkpoints/epoch-00002.ckpt" and result["resumed_from"] is None
    assert (tmp_path / result["checkpoint"]).is_file()

    rows = records(tmp_path)
    steps = [r for r in rows if r["kind"] == "step"]
    epochs = [r for r in rows if r["kind"] == "epoch"]
    assert [r["step"] for r in steps] == [3, 6, 9, 12, 15]
    assert [(r["epoch"], r["step"]) for r in epochs] == [(1, 8), (2, 16)]
    assert all({"loss", "test_accuracy", "samples_per_s"} <= r.keys() for r in epochs)
    assert epochs[-1]["loss"] == result["final_loss"] and epochs[-1]["test_accuracy"] == result["accuracy"]

    out = capsys.readouterr().out
    assert "\r" not in out  # not a terminal: plain lines only
    assert all(line.startswith("[rank 0/1] ") for line in out.splitlines())
    assert "params sha256 " + result["params_sha256"] in out


def test_checkpoint_keep(tmp_path: Path) -> None:
    assert train(tmp_path, "--epochs", "3", "--checkpoint-keep", "2") == 0
    assert [e for e, _ in ckpt.list_checkpoints(tmp_path / "checkpoints")] == [2, 3]
    saved = ckpt.load_checkpoint(tmp_path / "checkpoints" / "epoch-00003.ckpt")
    assert saved["epoch"] == 3 and saved["step"] == 24 and saved["config"]["dataset"] == "synthetic"
    assert {"model", "optimizer", "rng", "config", "metrics"} <= saved.keys()
    assert set(saved["rng"]) >= {"python", "numpy", "torch"}


def test_resume_equals_an_uninterrupted_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert train(whole, "--epochs", "3") == 0
    assert train(parts, "--epochs", "1") == 0
    # a run killed in epoch 2 left step records past the checkpoint, and a torn line
    with open(parts / "metrics.jsonl", "a") as metrics:
        metrics.write('{"kind": "step", "epoch": 2, "step": 12, "loss": 9.9, "samples": 96}\n{"kind": "st')
    capsys.readouterr()
    assert train(parts, "--epochs", "3", "--resume") == 0
    assert f"resuming from {parts}/checkpoints/epoch-00001.ckpt (epoch 1, step 8)" in capsys.readouterr().out
    assert summary(parts)["params_sha256"] == summary(whole)["params_sha256"]
    assert summary(parts)["resumed_from"] == "checkpoints/epoch-00001.ckpt"
    assert without_timing(records(parts)) == without_timing(records(whole))


EVERY_4 = ["--epochs", "2", "--checkpoint-every", "4", "--checkpoint-keep", "10"]  # 8 batches an epoch
MID_EPOCH = ["epoch-00000.step-000000004.ckpt", "epoch-00001.step-000000012.ckpt"]


def test_checkpoint_every_writes_mid_epoch_checkpoints(tmp_path: Path) -> None:
    assert train(tmp_path / "plain", "--epochs", "2") == 0
    out = tmp_path / "every"
    assert train(out, *EVERY_4) == 0
    # steps 4 and 12 midway; none at steps 8 and 16, last batches of epochs (their own checkpoints cover them)
    names = [path.name for path in sorted((out / "checkpoints").iterdir())]
    assert names == [MID_EPOCH[0], "epoch-00001.ckpt", MID_EPOCH[1], "epoch-00002.ckpt"]
    assert [path.name for _, path in ckpt.list_checkpoints(out / "checkpoints")] == names
    mid = ckpt.load_checkpoint(out / "checkpoints" / MID_EPOCH[1])
    assert (mid["epoch"], mid["step"], mid["batch"], mid["world_size"]) == (1, 12, 4, 1)
    assert mid["metrics"]["kind"] == "epoch" and mid["metrics"]["epoch"] == 1  # the last completed epoch's
    assert mid["epoch_sums"]["samples"] == 4 * 32 and mid["epoch_sums"]["loss_sum"] > 0
    assert {"model", "optimizer", "rng", "config"} <= mid.keys()
    assert ckpt.load_checkpoint(out / "checkpoints" / "epoch-00002.ckpt")["batch"] == 0
    # checkpoints change neither the training nor its records (step 6's loss, say, still covers steps 4 to 6)
    assert summary(out)["steps"] == summary(tmp_path / "plain")["steps"] == 16
    assert summary(out)["params_sha256"] == summary(tmp_path / "plain")["params_sha256"]
    rows, plain_rows = records(out), records(tmp_path / "plain")
    assert [(r["kind"], r["step"], r["samples"]) for r in rows] == [
        (r["kind"], r["step"], r["samples"]) for r in plain_rows
    ]
    assert all(abs(r["loss"] - p["loss"]) < 1e-6 for r, p in zip(rows, plain_rows, strict=True))
    assert summary(out)["checkpoint"] == "checkpoints/epoch-00002.ckpt"
    # --checkpoint-keep counts the mid-epoch checkpoints too
    assert train(tmp_path / "kept", *EVERY_4[:-1], "2") == 0
    assert [p.name for p in sorted((tmp_path / "kept" / "checkpoints").iterdir())] == names[-2:]


@pytest.mark.parametrize(
    ("name", "epoch", "step", "batch"), [(MID_EPOCH[0], 0, 4, 4), (MID_EPOCH[1], 1, 12, 4)]
)
def test_resume_from_a_mid_epoch_checkpoint_equals_an_uninterrupted_run(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    epoch: int,
    step: int,
    batch: int,
) -> None:
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    metrics_when_saved: dict[str, str] = {}
    save = ckpt.save_checkpoint

    def save_and_note_metrics(directory: Path, *args: Any, **kwargs: Any) -> Path:
        path = save(directory, *args, **kwargs)
        metrics_when_saved[path.name] = (directory.parent / "metrics.jsonl").read_text()
        return path

    with monkeypatch.context() as patch:  # (undo() would undo no_launcher's too)
        patch.setattr(ckpt, "save_checkpoint", save_and_note_metrics)
        assert train(whole, *EVERY_4) == 0
    # The step records up to a checkpoint are written before it (step 3's too, logged with --log-every 3
    # but reported at the next log point otherwise), so a run killed after the checkpoint loses none.
    logged = [json.loads(line)["step"] for line in metrics_when_saved[name].splitlines()]
    assert logged[-1] == (3 * (step // 3)) and all(s <= step for s in logged)
    # A run killed after writing the checkpoint `name`, during the next step's logs: what it left behind.
    (parts / "checkpoints").mkdir(parents=True)
    for path in sorted((whole / "checkpoints").iterdir()):
        (parts / "checkpoints" / path.name).write_bytes(path.read_bytes())
        if path.name == name:
            break
    (parts / "metrics.jsonl").write_text(
        metrics_when_saved[name]
        + f'{{"kind": "step", "epoch": {epoch + 1}, "step": {step + 1}, "loss": 9.9}}\n'
        '{"kind": "st'
    )
    capsys.readouterr()
    assert train(parts, *EVERY_4, "--resume") == 0
    out = capsys.readouterr().out
    assert f"resuming from {parts}/checkpoints/{name} (epoch {epoch}, step {step})" in out
    assert f"epoch {epoch + 1} goes on after its first {batch} batches" in out
    assert f"epoch {epoch + 1} done: {8 - batch} batches" in out  # the rest of the epoch only
    resumed, uninterrupted = summary(parts), summary(whole)
    assert resumed["steps"] == uninterrupted["steps"] == 16 and resumed["epochs"] == 2
    assert resumed["params_sha256"] == uninterrupted["params_sha256"]
    assert resumed["resumed_from"] == f"checkpoints/{name}"
    assert resumed["final_loss"] == uninterrupted["final_loss"]
    assert resumed["samples"] == (16 - step) * 32  # what this run trained
    # the same records: the epoch's loss and samples count the batches before the checkpoint
    assert without_timing(records(parts)) == without_timing(records(whole))
    # the same RNG states at the end (making the resumed epoch's iterator drew from them once more)
    last, last_whole = (ckpt.load_checkpoint(d / "checkpoints" / "epoch-00002.ckpt") for d in (parts, whole))
    assert torch.equal(last["rng"]["torch"], last_whole["rng"]["torch"])
    assert torch.equal(
        last["optimizer"]["state"][0]["momentum_buffer"],
        last_whole["optimizer"]["state"][0]["momentum_buffer"],
    )


def test_resume_without_checkpoint_starts_fresh_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert train(tmp_path, "--epochs", "1", "--resume") == 0
    assert "--resume: no checkpoint in" in capsys.readouterr().out
    assert summary(tmp_path)["resumed_from"] is None and summary(tmp_path)["epochs"] == 1


@pytest.mark.parametrize("epochs", ["2", "1"])
def test_resume_with_epochs_not_above_the_checkpoint_is_an_error_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], epochs: str
) -> None:
    assert train(tmp_path, "--epochs", "2") == 0
    before = summary(tmp_path)
    capsys.readouterr()
    assert train(tmp_path, "--epochs", epochs, "--resume") == 2
    err = capsys.readouterr().err
    assert f"--epochs {epochs} is not above the checkpoint's epoch 2 (checkpoints/epoch-00002.ckpt)" in err
    assert "ask for --epochs 3 or more" in err
    assert summary(tmp_path) == before  # nothing was trained or rewritten


def test_fresh_run_refuses_a_directory_with_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert train(tmp_path, "--epochs", "1") == 0
    metrics = (tmp_path / "metrics.jsonl").read_text()
    assert train(tmp_path, "--epochs", "1") == 2
    assert "already holds 1 checkpoint(s) of an earlier run: pass --resume" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_text() == metrics  # nothing changed
    assert not dist.is_initialized()


def test_corrupt_latest_checkpoint_is_named_and_not_loaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert train(tmp_path, "--epochs", "2") == 0
    latest = tmp_path / "checkpoints" / "epoch-00002.ckpt"
    latest.write_bytes(latest.read_bytes()[:-10])
    capsys.readouterr()
    assert train(tmp_path, "--epochs", "3", "--resume") == 2
    err = capsys.readouterr().err
    assert f"checkpoint {latest} is truncated" in err and "to resume from epoch-00001.ckpt" in err
    assert summary(tmp_path)["epochs"] == 2  # the earlier summary stands
    assert not dist.is_initialized()


def test_resume_refuses_another_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert train(tmp_path, "--epochs", "1") == 0
    assert main(["--dataset", "digits", "--epochs", "2", "--resume", "--output-dir", str(tmp_path)]) == 2
    assert "written by a run on dataset 'synthetic', this run asks for 'digits'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epochs", "0"], "--epochs must be at least 1"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--checkpoint-every", "-1"], "--checkpoint-every must be at least 0, not -1"),
        (["--lr", "-1"], "--lr and --dist-timeout must be positive"),
        (["--dataset", "imagenet"], "invalid choice: 'imagenet'"),
        (["--backend", "mpi"], "invalid choice: 'mpi'"),
    ],
)
def test_bad_flags(tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--output-dir", str(tmp_path), *args])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_design_flags_parse(tmp_path: Path) -> None:
    design = ["--dataset", "cifar10", "--epochs", "4", "--batch-size", "8", "--lr", "0.1"]
    config = parse_args(
        [
            *design,
            "--output-dir",
            str(tmp_path),
            "--resume",
            "--seed",
            "7",
            "--backend",
            "gloo",
            "--device",
            "cpu",
        ]
    )
    assert (config.dataset, config.epochs, config.batch_size, config.lr, config.resume) == (
        "cifar10",
        4,
        8,
        0.1,
        True,
    )
    assert (config.seed, config.backend, config.device, config.output_dir) == (7, "gloo", "cpu", tmp_path)
    assert config.checkpoint_every == 0  # by default only the epoch-end checkpoints
    assert parse_args(["--output-dir", str(tmp_path), "--checkpoint-every", "50"]).checkpoint_every == 50


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_plain_lines_otherwise(tmp_path: Path) -> None:
    terminal, pipe = FakeTerminal(), io.StringIO()
    for stream in (terminal, pipe):
        reporter = Reporter(0, 2, tmp_path, stream)
        reporter.progress(1, 3, 5, 10, 0.5)
        reporter.line("epoch 1 done")
    assert terminal.getvalue().startswith("\repoch 1/3 [###############...............] 5/10 loss 0.5000\n")
    assert pipe.getvalue() == "[rank 0/2] epoch 1/3 batch 5/10 loss 0.5000\n[rank 0/2] epoch 1 done\n"
    other_rank = io.StringIO()
    Reporter(1, 2, tmp_path, other_rank).progress(1, 3, 5, 10, 0.5)
    assert other_rank.getvalue() == ""  # only rank 0 reports the job's progress


@pytest.mark.parametrize(
    ("args", "environ", "message"),
    [
        (["--device", "npu"], {}, "device npu needs torch_npu"),
        (["--device", "cuda"], {}, "no cuda device is visible"),
        # The job's device from train.yml: no silent fallback to cpu, and the message names node and rank.
        (
            [],
            {"DDP_DEVICE": "npu", "DDP_NODE_NAME": "node3"},
            "node node3 rank 0/1: error: device npu needs torch_npu",
        ),
        ([], {"DDP_DEVICE": "cuda"}, "no cuda device is visible"),
        (["--backend", "nccl"], {}, "--backend nccl cannot run on cpu tensors"),
        (["--dataset", "mnist"], {}, "dataset file train-images-idx3-ubyte not found"),
        (
            [],
            {"RANK": "3", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
            "RANK=3 is not below",
        ),
    ],
)
def test_bad_setups_stop_before_training(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    environ: dict[str, str],
    message: str,
) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "run"
    assert main([*SMALL, "--data-dir", str(tmp_path), "--output-dir", str(out), *args]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()  # nothing was written
    assert not dist.is_initialized()
