"""``ddp-cluster doctor``: every signature against a fixture holding the tool's real message, the order of
causes, and the command's output and exit status."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ddp_cluster import cli
from ddp_cluster.job import doctor

FIXTURES = Path(__file__).parent / "data" / "doctor"

# Per fixture: the signature that must come first, and the text of the line that is its evidence.
EXPECTED = {
    "node-down.status.json": ("node-down", "reason: node node1 stopped answering ssh"),
    "killed-oom.log": ("killed-oom", "mpirun noticed that process rank 1 with PID 0 on node node1 exited"),
    "killed-oom-torchrun.log": ("killed-oom", "E1120 10:00:05.456000 41 torch/distributed/elastic"),
    "device-unusable.log": ("device-unusable", "node sim-server1 rank 1/2: the job's device is npu"),
    "import-torch.log": ("import-torch", "ModuleNotFoundError: No module named 'torch'"),
    # torch_npu 2.13.0 (the stand-in wheel, as the real one) where the driver's library is missing.
    "import-torch-autoload.log": ("import-torch", "RuntimeError: Failed to load the backend extension"),
    "import-cann.log": ("import-cann", "ImportError: libhccl.so: cannot open shared object file"),
    "hccl-EJ0001.log": ("hccl-EJ0001", "EJ0001: 2026-11-20-10:00:05.167.645 Failed to initialize the HCCP"),
    "hccl-bind.log": ("hccl-bind", "[ERROR] HCCL(3305,python)"),
    "hccl-bind-EJ0003.log": ("hccl-bind", "EJ0003: 2026-11-20-10:00:05.001.100 Failed to bind the IP port"),
    "hccl-EI0004.log": ("hccl-EI0004", "EI0004: The ranktable is invalid"),
    "hccl-EI0005.log": ("hccl-EI0005", "EI0005: The arguments for collective communication are inconsistent"),
    "address-in-use.log": ("address-in-use", "[W1120 10:00:05.000000000 socket.cpp:752]"),
    "ssh-host-key.log": ("ssh-host-key", "Host key verification failed."),
    "ssh-publickey.log": ("ssh-publickey", "root@node1: Permission denied (publickey)."),
    "ssh-resolve.log": ("ssh-resolve", "ssh: Could not resolve hostname node3"),
    "orte-daemons.log": ("orte-daemons", "ORTE was unable to reliably start one or more daemons."),
    "import-module.log": ("import-module", "ModuleNotFoundError: No module named 'helpers'"),
    "hccl-EI0006.log": ("hccl-EI0006", "EI0006: Getting socket times out."),
    "hccl-EI0002.log": ("hccl-EI0002", "[CRITICAL] DEVICE(162844,fffd6cff91e0,python)"),
    "store-timeout.log": ("store-timeout", "torch.distributed.DistNetworkError: The client socket has timed"),
    "nccl-timeout.log": ("nccl-timeout", "[rank1]:[E1120 10:30:05.000000000 ProcessGroupNCCL.cpp:616]"),
    "gloo-connection.log": ("gloo-connection", "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair"),
    "job-timeout.status.json": ("job-timeout", "reason: the job did not finish within job_timeout=600 s"),
    "rank-exit.status.json": ("rank-exit", "rank 1 on node node1 exited with code 3 first"),
    # the rules grown from the vendors' references (each rule's own example line, in context)
    "cuda-driver-old.log": (
        "cuda-driver-old",
        "RuntimeError: The NVIDIA driver on your system is too old (f",
    ),
    "no-cuda-gpu.log": ("no-cuda-gpu", "RuntimeError: No CUDA GPUs are available"),
    "disk-full.log": ("disk-full", "OSError: [Errno 28] No space left on device: '/workspace/job"),
    "cuda-ecc.log": ("cuda-ecc", "RuntimeError: CUDA error: uncorrectable ECC error encountere"),
    "cuda-oom.log": ("cuda-oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocat"),
    "npu-oom.log": ("npu-oom", "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB "),
    "dataloader-killed.log": (
        "dataloader-killed",
        "RuntimeError: DataLoader worker (pid 4242) is killed by sign",
    ),
    "segfault.log": ("segfault", "mpirun noticed that process rank 0 with PID 1234 on node nod"),
    "dataloader-shm.log": ("dataloader-shm", "ERROR: Unexpected bus error encountered in worker. This migh"),
    "nccl-duplicate-gpu.log": (
        "nccl-duplicate-gpu",
        "NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on",
    ),
    "ssh-refused.log": ("ssh-refused", "ssh: connect to host node1 port 12345: Connection refused"),
    "ssh-unreachable.log": ("ssh-unreachable", "ssh: connect to host 10.0.0.12 port 12345: No route to host"),
    "nccl-no-interface.log": ("nccl-no-interface", "NCCL WARN Bootstrap : no socket interface found"),
    "dns-name.log": ("dns-name", "socket.gaierror: [Errno -3] Temporary failure in name resolu"),
    "mpi-slots.log": ("mpi-slots", "There are not enough slots available in the system to satisf"),
    "cuda-illegal-access.log": (
        "cuda-illegal-access",
        "RuntimeError: CUDA error: an illegal memory access was encou",
    ),
    "mpi-orted-missing.log": ("mpi-orted-missing", "bash: orted: command not found"),
    "mpi-daemon-lost.log": ("mpi-daemon-lost", "ORTE has lost communication with a remote daemon."),
    "too-many-files.log": ("too-many-files", "OSError: [Errno 24] Too many open files"),
    "cuda-device-assert.log": (
        "cuda-device-assert",
        "RuntimeError: CUDA error: device-side assert triggered",
    ),
    "ddp-unused-parameters.log": (
        "ddp-unused-parameters",
        "RuntimeError: Expected to have finished reduction in the pri",
    ),
    "tensors-on-devices.log": (
        "tensors-on-devices",
        "RuntimeError: Expected all tensors to be on the same device,",
    ),
    "process-group-missing.log": (
        "process-group-missing",
        "ValueError: Default process group has not been initialized, ",
    ),
    "state-dict-mismatch.log": (
        "state-dict-mismatch",
        "RuntimeError: Error(s) in loading state_dict for Net:",
    ),
    "store-refused.log": ("store-refused", "torch.distributed.DistNetworkError: The client socket has fa"),
    "gloo-full-mesh.log": ("gloo-full-mesh", "RuntimeError: Gloo connectFullMesh failed with [../third_par"),
    "nccl-system-error.log": (
        "nccl-system-error",
        "torch.distributed.DistBackendError: NCCL error in: ProcessGr",
    ),
    "hccl-watchdog.log": ("hccl-watchdog", "[Rank 1] Watchdog caught collective operation timeout: WorkH"),
    "nan-loss.log": ("nan-loss", "epoch 3 step 120 loss=nan"),
    "elastic-child-failed.log": (
        "elastic-child-failed",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailed",
    ),
    "nccl-ib-error.log": ("nccl-ib-error", "NCCL WARN NET/IB : Got completion from peer 10.0.0.12<47020>"),
    "cuda-busy.log": ("cuda-busy", "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy"),
    "rdzv-timeout.log": ("rdzv-timeout", "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutEr"),
    "hccl-api-error.log": ("hccl-api-error", "RuntimeError: create:build/CMakeFiles/torch_npu.dir/compiler"),
    "bus-error.log": ("bus-error", "Bus error (core dumped)"),
    "nccl-internal.log": ("nccl-internal", "torch.distributed.DistBackendError: NCCL error in: ../torch/"),
    "nccl-invalid-usage.log": (
        "nccl-invalid-usage",
        "torch.distributed.DistBackendError: NCCL error in: ProcessGr",
    ),
    "collective-mismatch.log": (
        "collective-mismatch",
        "RuntimeError: Detected mismatch between collectives on ranks",
    ),
    "mpi-tcp-interface.log": (
        "mpi-tcp-interface",
        "[node1][[41733,1],1][btl_tcp_endpoint.c:796:mca_btl_tcp_endp",
    ),
}


def place(run_dir: Path, fixture: str, node: str = "node1") -> str:
    """Put a fixture where train.yml leaves such a file; returns its path relative to the run directory."""
    if fixture.endswith(".status.json"):
        relative = "nodes/node0/status.json"
    elif fixture.startswith(("orte", "ssh-", "killed-oom.")):
        relative = "nodes/node0/launcher.log"
    else:
        relative = f"nodes/{node}/logs/1/rank.1/stdout"
    target = run_dir / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / fixture, target)
    return relative


def test_every_signature_has_a_fixture_and_every_fixture_a_signature() -> None:
    ids = {signature.id for signature in doctor.SIGNATURES}
    assert len(ids) == len(doctor.SIGNATURES)
    assert {expected for expected, _ in EXPECTED.values()} == ids
    on_disk = {path.name for path in FIXTURES.iterdir() if path.name not in ("README.md", "clean.log")}
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_each_message_is_named_with_its_file_and_line(fixture: str, tmp_path: Path) -> None:
    relative = place(tmp_path, fixture)
    findings = doctor.diagnose(tmp_path)
    expected_id, evidence_start = EXPECTED[fixture]
    assert findings, f"{fixture}: nothing found"
    top = findings[0]
    assert top.signature.id == expected_id, [f.signature.id for f in findings]
    first = top.evidence[0]
    assert first.path == relative and first.text.startswith(evidence_start), first
    if not fixture.endswith(".json"):
        lines = (FIXTURES / fixture).read_text().splitlines()
        assert lines[first.line - 1].strip().startswith(evidence_start)


def test_a_clean_job_has_nothing_to_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    place(tmp_path, "clean.log")
    (tmp_path / "status.json").write_text(json.dumps({"state": "succeeded", "reason": "", "exit_code": 0}))
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "epoch-00003.ckpt").write_bytes(b"\0\x01 Connection reset by peer")
    assert doctor.diagnose(tmp_path) == []
    assert cli.main(["doctor", str(tmp_path)]) == 0
    assert "no known failure found" in capsys.readouterr().out


def test_the_root_cause_comes_before_the_timeouts_it_caused(tmp_path: Path) -> None:
    # node1 went down; node0's rank then lost its gloo peer and the launcher reported it: the dead node first.
    place(tmp_path, "gloo-connection.log", node="node0")
    place(tmp_path, "node-down.status.json")
    place(tmp_path, "hccl-EI0006.log", node="node2")
    found = [f.signature.id for f in doctor.diagnose(tmp_path)]
    assert found == ["node-down", "hccl-EI0006", "gloo-connection"]
    # A rank killed for memory explains its peers' socket timeouts.
    other = tmp_path / "other"
    place(other, "hccl-EI0006.log", node="node0")
    place(other, "killed-oom-torchrun.log", node="node1")
    assert doctor.diagnose(other)[0].signature.id == "killed-oom"
    # A rank that exited with an error of its own comes before the peer that then lost it.
    third = tmp_path / "third"
    place(third, "gloo-connection.log", node="node0")
    place(third, "rank-exit.status.json")
    findings = doctor.diagnose(third)
    assert [f.signature.id for f in findings] == ["rank-exit", "gloo-connection"]
    assert findings[0].fix == "read that rank's own error at the end of its log (logs/rank.1.log)"


def test_the_same_message_in_several_files_is_one_cause_with_all_its_evidence(tmp_path: Path) -> None:
    place(tmp_path, "ssh-resolve.log")
    (tmp_path / "logs").mkdir()
    shutil.copy(FIXTURES / "ssh-resolve.log", tmp_path / "logs" / "rank.0.log")
    findings = doctor.diagnose(tmp_path)
    assert [f.signature.id for f in findings] == ["ssh-resolve", "orte-daemons"]
    assert findings[0].cause == "node name node3 does not resolve inside the containers"
    assert [(e.path, e.line) for e in findings[0].evidence] == [
        ("logs/rank.0.log", 1),
        ("nodes/node0/launcher.log", 1),
    ]


def test_the_table_and_the_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    place(tmp_path, "hccl-EI0004.log")
    assert cli.main(["doctor", str(tmp_path), "--width", "150"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"ddp-cluster doctor: {tmp_path}: 1 likely cause(s), most likely first")
    header = out.splitlines()[2]
    assert header.split() == ["#", "cause", "evidence", "(file:line)", "fix"]
    assert "HCCL EI0004: the rank table or a rank" in out
    assert "nodes/node1/logs/1/rank.1/stdout:6:" in out
    assert "`ddp-cluster ip-plan" in out


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    place(tmp_path, "hccl-EJ0001.log")
    assert cli.main(["doctor", str(tmp_path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    finding, *others = report["findings"]
    assert finding["id"] == "hccl-EJ0001"
    # the torch_npu line above it (ERR02200) follows from it: named after it
    assert [other["id"] for other in others] == ["hccl-api-error"]
    evidence = finding["evidence"][0]
    assert (evidence["path"], evidence["line"]) == ("nodes/node1/logs/1/rank.1/stdout", 5)
    assert "npu-smi info" in finding["fix"]


def test_a_missing_directory_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["doctor", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_a_health_gates_run_before_the_job_is_not_read(tmp_path: Path) -> None:
    run = tmp_path / "job"
    (run / "preflight" / "logs").mkdir(parents=True)
    (run / "preflight" / "logs" / "rank.0.log").write_text("Address already in use\n")
    (run / "logs").mkdir()
    (run / "logs" / "rank.0.log").write_text("all fine\n")
    assert [path.relative_to(run).as_posix() for path in doctor.log_files(run)] == ["logs/rank.0.log"]


# --- the logs are the job's bytes ---------------------------------------------------------------------------
def test_evidence_and_what_it_names_are_shown_never_obeyed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "nodes" / "node1" / "logs" / "1" / "rank.1" / "stdout"
    log.parent.mkdir(parents=True)
    log.write_bytes(
        b"\x1b]52;c;cm0gLXJmIH4=\x07ModuleNotFoundError: No module named 'x\x1b[2Jy'\r\x1b]0;t\x07\n"
    )
    (finding,) = doctor.diagnose(tmp_path)
    assert finding.cause == "Python module x\\x1b[2Jy is missing on the node"
    assert finding.evidence[0].text == (
        "\\x1b]52;c;cm0gLXJmIH4=\\x07ModuleNotFoundError: No module named 'x\\x1b[2Jy'\\r\\x1b]0;t\\x07"
    )
    assert cli.main(["doctor", str(tmp_path), "--width", "200"]) == 1
    out = capsys.readouterr().out
    assert all(char in "\t\n" or char.isprintable() for char in out)


def test_a_file_named_with_an_escape_sequence_is_named_written_out(tmp_path: Path) -> None:
    log = tmp_path / "output" / "\x1b]0;title\x07.log"
    log.parent.mkdir(parents=True)
    log.write_text("Address already in use\n")
    (finding,) = doctor.diagnose(tmp_path)
    assert finding.evidence[0].path == "output/\\x1b]0;title\\x07.log"


def test_a_log_is_read_a_line_at_a_time_and_an_enormous_line_is_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doctor, "MAX_READ_LINE", 1000)
    log = tmp_path / "logs" / "rank.0.log"
    log.parent.mkdir(parents=True)
    # a message at a long line's start is seen; one past its first MAX_READ_LINE bytes is not
    with open(log, "wb") as handle:
        handle.write(b"Address already in use " + b"#" * 5_000_000 + b" Host key verification failed\n")
        handle.write(b"EI0004: The ranktable is invalid\n")
    found = {finding.signature.id: finding for finding in doctor.diagnose(tmp_path)}
    assert set(found) == {"address-in-use", "hccl-EI0004"}
    assert found["hccl-EI0004"].evidence[0].line == 2


def test_a_node_s_status_that_is_no_utf8_and_a_linked_log_are_passed_over(tmp_path: Path) -> None:
    status = tmp_path / "nodes" / "node1" / "status.json"
    status.parent.mkdir(parents=True)
    status.write_bytes(b'{"state": "failed", "reason": "\xff\xfe node node1 stopped answering ssh"}')
    outside = tmp_path.parent / f"{tmp_path.name}-outside.log"
    outside.write_text("Address already in use\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank.0.log").symlink_to(outside)
    assert doctor.diagnose(tmp_path) == []


def test_every_rule_names_its_vendor_reference_and_its_own_example_is_named_by_it() -> None:
    rules = json.loads(doctor.RULES_FILE.read_text(encoding="utf-8"))["rules"]
    assert len(rules) >= 60 and len({rule["id"] for rule in rules}) == len(rules)
    for rule in rules:
        assert set(doctor.RULE_FIELDS) <= set(rule), rule["id"]
        assert rule["reference"].strip() and rule["cause"].strip() and rule["fix"].strip(), rule["id"]
        found = [s for s in doctor.SIGNATURES if s.pattern.search(rule["example"])]
        assert found and max(found, key=lambda s: s.weight).id == rule["id"], (
            rule["id"],
            [s.id for s in found],
        )


def test_a_malformed_rule_is_named(tmp_path: Path) -> None:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"rules": [{"id": "x", "pattern": "y"}]}))
    with pytest.raises(ValueError, match=r"rule 0 \(x\) lacks weight, cause, fix, reference, example"):
        doctor.load_rules(path)


def test_what_a_restart_may_cure_is_the_rules_restartable_and_a_lost_connection_follows_a_cause() -> None:
    from ddp_cluster.supervisor.failures import Failure, restart_cause

    failed = Failure("rank 1 exited with code 1", node="node1", rank=1, exit_code=1)
    gloo = (FIXTURES / "gloo-connection.log").read_text()
    daemon = (FIXTURES / "mpi-daemon-lost.log").read_text()
    # the peer's lost connection ranks first, as before the rules grew: a restart may cure it
    found: dict[str, doctor.Finding] = {}
    doctor.match_lines("0", gloo.splitlines(), found)
    [lost] = found.values()
    assert restart_cause(failed, [gloo, daemon]) == lost.cause
    assert restart_cause(failed, [daemon]) is not None  # a node gone under mpirun: a spare may cure it
    oom = (FIXTURES / "cuda-oom.log").read_text()
    assert restart_cause(failed, [oom]) is None  # the program's own error: a restart cures no out-of-memory
    # below a cause no restart cures, a lost connection follows from it; a timeout still may be cured
    crash = (FIXTURES / "segfault.log").read_text()
    assert restart_cause(failed, [crash, daemon, gloo]) is None
    watchdog = (FIXTURES / "hccl-watchdog.log").read_text()
    assert restart_cause(failed, [crash, watchdog]) is not None
    restartable = {signature.id for signature in doctor.SIGNATURES if signature.restartable}
    assert restartable >= {"node-down", "store-timeout", "nccl-timeout", "gloo-connection"}


def test_the_first_failure_in_time_is_named_and_what_follows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # node1's rank ran out of memory at 10:00:01 (Python logging's stamp; its traceback follows the stamped
    # line); node0's rank then waited for it until NCCL's watchdog fired at 10:30:05 (glog's stamp, no year).
    node1 = tmp_path / "nodes" / "node1" / "logs" / "1" / "rank.1"
    node0 = tmp_path / "nodes" / "node0" / "logs" / "1" / "rank.0"
    node1.mkdir(parents=True)
    node0.mkdir(parents=True)
    (node1 / "stdout").write_text(
        "2026-11-20 10:00:01,234 INFO step 40 loss 0.31\n"
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 80, in <module>\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"
        " of 79.10 GiB of which 1.20 GiB is free.\n"
    )
    (node0 / "stdout").write_text(
        "[rank0]:[E1120 10:30:05.000000000 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective"
        " operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE, NumelIn=1, NumelOut=1,"
        " Timeout(ms)=1800000) ran for 1800004 milliseconds before timing out.\n"
    )
    findings = doctor.diagnose(tmp_path)
    assert [f.signature.id for f in findings] == ["cuda-oom", "nccl-timeout"]
    order = doctor.timeline(findings)
    assert order is not None and order.first.signature.id == "cuda-oom"
    assert [(f.signature.id, seconds) for f, seconds in order.after] == [("nccl-timeout", 1803.766)]
    assert cli.main(["doctor", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    where = "nodes/node1/logs/1/rank.1/stdout:4"
    assert lines[1] == f"first in time: #1 cuda-oom, at 2026-11-20 10:00:01 ({where})"
    assert lines[2] == "after it, and likely following from it: #2 nccl-timeout (+1804 s)"
    assert cli.main(["doctor", str(tmp_path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["first_in_time"] == "cuda-oom"
    assert report["findings"][0]["first_seen"] == "2026-11-20T10:00:01.234000"


def test_of_two_causes_alike_the_earlier_comes_first(tmp_path: Path) -> None:
    # The launcher could not reach node2 (10:00:01), then node1 refused it (10:00:03): equally likely causes,
    # the earlier named first, whichever file holds it; an unstamped line in an unstamped file has no time.
    log = tmp_path / "nodes" / "node0" / "launcher.log"
    log.parent.mkdir(parents=True)
    log.write_text(
        "2026-11-20T10:00:03 ssh: connect to host node1 port 12345: Connection refused\n"
        "2026-11-20T10:00:01 ssh: connect to host 10.0.0.12 port 12345: No route to host\n"
    )
    found = doctor.diagnose(tmp_path)
    assert [f.signature.id for f in found] == ["ssh-unreachable", "ssh-refused"]
    (tmp_path / "undated.log").write_text("ssh: connect to host node1 port 12345: Connection refused\n")
    [_, refused] = doctor.diagnose(tmp_path)
    assert [e.when for e in refused.evidence] == [doctor.stamp("2026-11-20T10:00:03", 2026), None]
    assert doctor.stamp("E1120 10:30:05.5 x", 2025) == doctor.stamp("2025-11-20 10:30:05.500", 1)
    assert doctor.stamp("EJ0001: 2026-11-20-10:00:05.167.645 Failed", 1) is not None
    assert doctor.stamp("step 1200 loss 0.5", 2026) is None
