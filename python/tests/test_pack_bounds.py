"""ddp_cluster.server.pack's bounds on what comes back (issue 45, points 1, 5 and 10): a sparse file and what
is over the node's bytes are named and left on the node, the rest packed; the newest complete checkpoint is
packed whatever wrote it; every file but a checkpoint is masked, and a secrets.json that cannot be read masks
nothing, so what it would mask stays behind."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_cluster.runtime import checkpoint_names as names
from ddp_cluster.server import pack

REPO = Path(__file__).resolve().parents[2]


def make_job(tmp_path: Path) -> Path:
    job_dir = tmp_path / "jobs" / "job-1"
    (job_dir / "logs" / "1" / "rank.0").mkdir(parents=True)
    (job_dir / "output").mkdir()
    (job_dir / "status.json").write_text('{"state": "succeeded"}')
    (job_dir / "logs" / "1" / "rank.0" / "stdout").write_text("epoch 1 loss 0.5\n")
    (job_dir / "output" / "metrics.jsonl").write_text('{"step": 1}\n')
    return job_dir


def pack_it(job_dir: Path, max_bytes: int | None = None, check: bool = False) -> dict[str, Any]:
    workspace = job_dir.parent.parent
    server_tmp = workspace.with_name(f"{workspace.name}-server-tmp")
    server_tmp.mkdir(exist_ok=True)
    return pack.pack_job(str(job_dir), str(workspace), check=check, into=str(server_tmp), max_bytes=max_bytes)


def contents(packed: dict[str, Any]) -> dict[str, bytes]:
    with tarfile.open(packed["archive"]) as tar:
        return {
            member.name: tar.extractfile(member).read()  # type: ignore[union-attr]
            for member in tar.getmembers()
            if member.isreg()
        }


def tar_bytes(packed: dict[str, Any]) -> int:
    import gzip

    with gzip.open(packed["archive"]) as raw:
        return len(raw.read())


# --- point 5: sparse and oversized files ---


def test_a_20_gib_sparse_file_is_named_and_left_on_the_node_the_rest_packed(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    hole = job_dir / "output" / "scratch.bin"
    subprocess.run(["truncate", "-s", "20G", str(hole)], check=True)  # costs this disk nothing
    with hole.open("r+b") as handle:
        handle.write(b"some data at the start")
    for check in (True, False):
        packed = pack_it(job_dir, check=check)
        assert len(packed["left_out"]) == 1, packed["left_out"]
        said = packed["left_out"][0]
        assert (
            said.startswith(f"output/scratch.bin (sparse: {20 << 30} bytes, ") and "left on the node" in said
        )
    assert hole.stat().st_size == 20 << 30  # left where it is
    found = contents(packed)
    assert "output/scratch.bin" not in found
    assert found["output/metrics.jsonl"] == b'{"step": 1}\n' and found["status.json"]
    assert packed["bytes"] < 1 << 20


def test_a_file_with_a_few_holes_is_no_sparse_file(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    with (job_dir / "output" / "data.bin").open("wb") as handle:
        handle.write(b"x" * (20 << 20))
        handle.seek(30 << 20)  # 10 MiB of holes: under SPARSE_HOLES, and under the data
        handle.write(b"y")
    packed = pack_it(job_dir)
    assert packed["left_out"] == [] and len(contents(packed)["output/data.bin"]) == (30 << 20) + 1


def test_over_the_nodes_bytes_the_largest_files_stay_behind_named_the_small_ones_come(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    (job_dir / "output" / "dump.bin").write_bytes(b"d" * 300_000)
    (job_dir / "output" / "big.bin").write_bytes(b"b" * 200_000)
    (job_dir / "output" / "summary.json").write_text("{}")
    limit = 250_000
    packed = pack_it(job_dir, max_bytes=limit)
    assert pack_it(job_dir, max_bytes=limit, check=True)["left_out"] == packed["left_out"]
    found = contents(packed)
    assert "output/dump.bin" not in found and found["output/big.bin"] == b"b" * 200_000
    assert {"status.json", "output/metrics.jsonl", "output/summary.json", "logs/1/rank.0/stdout"} <= set(
        found
    )
    [said] = packed["left_out"]
    assert said.startswith("output/dump.bin (300000 bytes: over the ") and "results_max_gb" in said
    assert tar_bytes(packed) <= limit  # the tar itself, not only its files' bytes
    assert (job_dir / "output" / "dump.bin").exists()


def test_no_bytes_at_all_packs_nothing_and_says_so(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    packed = pack_it(job_dir, max_bytes=0)
    assert packed["members"] == 0 and contents(packed) == {} and len(packed["left_out"]) == 7
    with pytest.raises(pack.PackError, match="max_bytes=-1 must be 0 or more"):
        pack_it(job_dir, max_bytes=-1)


def test_a_file_that_grows_past_the_bytes_between_the_choice_and_the_pack_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_dir = make_job(tmp_path)
    log = job_dir / "logs" / "1" / "rank.0" / "stdout"
    chosen = pack.admit

    def admit_then_grow(job: int, max_bytes: int, unmaskable: str = "") -> pack.Admitted:
        admitted = chosen(job, max_bytes, unmaskable)
        log.write_bytes(b"x" * 20_000)  # a leftover process of the job still writing
        return admitted

    monkeypatch.setattr(pack, "admit", admit_then_grow)
    packed = pack_it(job_dir, max_bytes=20_000)
    assert "logs/1/rank.0/stdout (grew to 20000 bytes while packed" in " ".join(packed["left_out"])
    assert "logs/1/rank.0/stdout" not in contents(packed) and tar_bytes(packed) <= 20_000


def test_the_default_bytes_are_the_settings_default() -> None:
    specs = yaml.safe_load((REPO / "roles" / "ddp_job" / "meta" / "argument_specs.yml").read_text())
    stated = specs["argument_specs"]["main"]["options"]["ddp_job_results_max_gb"]["default"]
    assert int(stated * (1 << 30)) == pack.DEFAULT_MAX_BYTES


# --- point 1: the newest complete checkpoint, whatever wrote it ---


def torch_save_like(path: Path, payload: bytes) -> bytes:
    """A file in torch.save's format (a zip of data.pkl and the storages), without torch."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        archive.writestr("archive/data/0", payload)
    return path.read_bytes()


def test_a_users_plain_torch_save_checkpoint_is_packed(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    folder = job_dir / pack.CHECKPOINTS
    folder.mkdir()
    torch_save_like(folder / "epoch-00001.ckpt", b"one" * 100)
    newest = torch_save_like(folder / "epoch-00002.ckpt", b"two" * 100)
    packed = pack_it(job_dir)
    assert packed["checkpoint"] == "output/checkpoints/epoch-00002.ckpt" and packed["left_out"] == []
    assert contents(packed)["output/checkpoints/epoch-00002.ckpt"] == newest


def test_checkpoints_are_ordered_by_their_numbers_not_their_text(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    folder = job_dir / pack.CHECKPOINTS
    folder.mkdir()
    torch_save_like(folder / "epoch-9.ckpt", b"nine")
    torch_save_like(folder / "epoch-10.ckpt", b"ten")
    assert pack_it(job_dir)["checkpoint"] == "output/checkpoints/epoch-10.ckpt"


def test_a_newer_checkpoint_cut_short_is_named_and_the_older_complete_one_packed(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    folder = job_dir / pack.CHECKPOINTS
    folder.mkdir()
    good = torch_save_like(folder / "epoch-00003.ckpt", b"good" * 1000)
    whole = torch_save_like(folder / "epoch-00004.ckpt", b"cut" * 1000)
    (folder / "epoch-00004.ckpt").write_bytes(whole[: len(whole) // 2])  # killed while torch.save wrote
    payload = b"header" * 100
    (folder / "epoch-00005.ckpt").write_bytes(names.header(payload) + payload[:-1])  # ours, cut short
    packed = pack_it(job_dir)
    assert packed["checkpoint"] == "output/checkpoints/epoch-00003.ckpt"
    assert contents(packed)["output/checkpoints/epoch-00003.ckpt"] == good
    said = packed["left_out"]
    assert said[0].startswith(
        "output/checkpoints/epoch-00005.ckpt (a checkpoint that is not complete: truncated"
    )
    assert said[1].startswith("output/checkpoints/epoch-00004.ckpt (a checkpoint that is not complete: an")
    assert all("an older one packed" in line for line in said) and len(said) == 2


def test_a_checkpoint_with_our_header_is_checked_by_its_sha256(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    folder = job_dir / pack.CHECKPOINTS
    folder.mkdir()
    payload = b"weights" * 100
    (folder / "epoch-00001.ckpt").write_bytes(names.header(payload) + payload)
    altered = bytearray(names.header(payload) + payload)
    altered[-3] ^= 1
    (folder / "epoch-00002.ckpt").write_bytes(bytes(altered))
    packed = pack_it(job_dir)
    assert packed["checkpoint"] == "output/checkpoints/epoch-00001.ckpt"
    assert "epoch-00002.ckpt (a checkpoint that is not complete: corrupt" in packed["left_out"][0]


@pytest.mark.parametrize("form", ["sha256sum", "json"])
def test_a_plain_checkpoint_s_record_is_packed_with_it_unmasked_and_checked(
    tmp_path: Path, form: str
) -> None:
    job_dir = make_job(tmp_path)
    folder = job_dir / pack.CHECKPOINTS
    folder.mkdir()
    token = "hf_SECRET_1234"
    (job_dir / "secrets.json").write_text(json.dumps({"HF_TOKEN": token}))

    def recorded(name: str, data: bytes) -> bytes:
        (folder / name).write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        text = (
            f"{digest}  {name}\n"
            if form == "sha256sum"
            else json.dumps({"sha256": digest, "size": len(data)})
        )
        (folder / f".{name}.sha256").write_text(text)
        return (folder / f".{name}.sha256").read_bytes()

    record = recorded("epoch-00001.ckpt", b"legacy pickle " + token.encode())  # not a zip: the record says
    recorded("epoch-00002.ckpt", b"newer")
    (folder / "epoch-00002.ckpt").write_bytes(b"newer, changed after its record")
    packed = pack_it(job_dir)
    found = contents(packed)
    assert packed["checkpoint"] == "output/checkpoints/epoch-00001.ckpt"
    assert found["output/checkpoints/epoch-00001.ckpt"] == b"legacy pickle " + token.encode()
    assert found["output/checkpoints/.epoch-00001.ckpt.sha256"] == record
    assert not any(name.startswith("output/checkpoints/.epoch-00002") for name in found)
    assert "epoch-00002.ckpt (a checkpoint that is not complete: " in packed["left_out"][0]


# --- point 10: masking without the NUL and size gaps ---


def test_a_value_across_reads_in_a_file_with_a_nul_first_is_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pack, "CHUNK", 5)
    job_dir = make_job(tmp_path)
    (job_dir / "secrets.json").write_text(json.dumps({"T": "abcdefgh"}))
    (job_dir / "output" / "events.bin").write_bytes(b"\0\0\0abcdefgh\0\xffabcdefgh" * 3)
    found = contents(pack_it(job_dir))
    assert found["output/events.bin"] == b"\0\0\0***\0\xff***" * 3


def test_a_secrets_json_over_a_mib_is_read_whole_and_masks(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    many = {f"S{index}": f"value-{index:07d}" for index in range(80_000)}  # about 2 MiB
    (job_dir / "secrets.json").write_text(json.dumps(many))
    assert (job_dir / "secrets.json").stat().st_size > 1 << 20
    (job_dir / "output" / "log.txt").write_text("a value-0079999 and value-0000001\n")
    packed = pack_it(job_dir)
    assert contents(packed)["output/log.txt"] == b"a *** and ***\n" and packed["left_out"] == []


@pytest.mark.parametrize(
    ("secrets", "why"),
    [
        (b"{not json", "secrets.json is not JSON"),
        (b'["a list"]', "secrets.json holds no object"),
        (None, "secrets.json is over 1000 bytes"),
    ],
)
def test_a_secrets_json_that_cannot_be_read_leaves_what_it_would_mask_on_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, secrets: bytes | None, why: str
) -> None:
    monkeypatch.setattr(pack, "SECRETS_MAX", 1000)
    job_dir = make_job(tmp_path)
    folder = job_dir / pack.CHECKPOINTS
    folder.mkdir()
    checkpoint = torch_save_like(folder / "epoch-00001.ckpt", b"w")
    (job_dir / "secrets.json").write_bytes(
        secrets if secrets is not None else b'{"T": "' + b"v" * 2000 + b'"}'
    )
    packed = pack_it(job_dir)
    found = contents(packed)
    assert found == {"output/checkpoints/epoch-00001.ckpt": checkpoint}
    assert packed["left_out"][-1].startswith(f"3 file(s) outside output/checkpoints ({why}")
    assert "left on the node" in packed["left_out"][-1]
    assert (job_dir / "secrets.json").exists()  # a second pack leaves them behind too, never unmasked
    assert contents(pack_it(job_dir)) == found


def test_the_node_masks_the_forms_the_controller_masks() -> None:
    """pack.py ships alone: its forms of the secrets are ddp_cluster.job.secrets.forms, held equal here."""
    import os
    import tempfile

    from ddp_cluster.job import secrets

    values = {"A": "hf_TOKEN_1234", "B": 'pa"ss\\word', "C": "line one\nline two", "D": "abc"}
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "secrets.json").write_text(json.dumps(values))
        job = os.open(folder, os.O_RDONLY)
        try:
            found = pack.read_secrets(job)
            assert set(found) == set(secrets.forms(values.values())) and len(found) == 7
            assert [len(form) for form in found] == sorted((len(form) for form in found), reverse=True)
        finally:
            os.close(job)


def test_a_plain_checkpoint_s_record_is_named_as_the_ranks_name_it() -> None:
    assert pack.RECORD.format("epoch-00001.ckpt") == names.record_name("epoch-00001.ckpt")


def fake_proc(tmp_path: Path, processes: dict[int, list[str]]) -> Path:
    proc = tmp_path / "proc"
    for pid, words in processes.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(b"\0".join(word.encode() for word in words) + b"\0")
    (proc / "self").mkdir()
    return proc


def test_a_job_whose_supervisor_still_runs_is_not_packed_and_keeps_its_secrets(tmp_path: Path) -> None:
    """The controller took the job for ended (its first node did not answer a while), but its supervisor
    runs on the server: the pack waits its bound, then refuses naming the job and what to do."""
    proc = fake_proc(
        tmp_path,
        {
            41: ["python", "-m", "ddp_cluster.supervise", "--job-dir", "/workspace/jobs/j1"],
            42: ["python", "-m", "ddp_cluster.supervise", "--job-dir", "/workspace/jobs/j10"],  # another job
            43: ["python", "train.py", "--job-dir", "/workspace/jobs/j1"],  # a rank: not the supervisor
        },
    )
    assert pack.supervisor_pids("j1", str(proc)) == [41]
    assert pack.supervisor_pids("j2", str(proc)) == []
    started = time.monotonic()
    with pytest.raises(pack.PackError, match=r"the job still runs on this server \(its supervisor, pid 41\)"):
        pack.await_supervisor_end("/srv/node0/workspace/jobs/j1", wait=0.3, proc=str(proc))
    assert 0.3 <= time.monotonic() - started < 5
    pack.await_supervisor_end("/srv/node0/workspace/jobs/j2", wait=30, proc=str(proc))  # at once
