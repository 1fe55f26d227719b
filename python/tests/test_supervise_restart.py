"""A job's restarts on the cluster: the supervisor's newest checkpoint, what a restart can cure, and the
restart itself (spares, min_nodes, max_restarts) with the nodes faked (probe, on_node, distribute: no ssh, no
containers); the spec's and the status's new fields; and the plan's spares."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from test_plan import OPTIONS, exported, records, request
from test_plan import inventory as plan_inventory
from test_supervise import spec

from ddp_cluster.files import add_file
from ddp_cluster.job import doctor, plan, status
from ddp_cluster.job import spec as jobspec
from ddp_cluster.job.plan import Inventory, PlanError
from ddp_cluster.job.spec import JobSpec, JobSpecError
from ddp_cluster.job.status import Status
from ddp_cluster.runtime import checkpoint_names
from ddp_cluster.server import image_reset
from ddp_cluster.supervisor import fence, recovery
from ddp_cluster.supervisor.failures import Failure, launcher_failure
from ddp_cluster.supervisor.jobs import ENDED
from ddp_cluster.supervisor.loop import STATUS_FILE, Supervisor
from ddp_cluster.supervisor.recovery import ATTEMPTS, BUNDLE, LAUNCHER_LOG, newest_checkpoint

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "supervise"
GLOO_LINE = (
    "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"
    " [172.23.0.3]:7340"
)
GLOO_CAUSE = next(item for item in doctor.SIGNATURES if item.id == "gloo-connection").cause
ZERO_DIVISION = """\
Traceback (most recent call last):
  File "/workspace/jobs/j1/train.py", line 42, in <module>
    loss = total / count
ZeroDivisionError: division by zero
"""


# --- newest_checkpoint ---


def test_no_checkpoint_folder_or_an_empty_one_is_no_checkpoint(tmp_path: Path) -> None:
    assert newest_checkpoint(tmp_path / "output") == ("", 0)
    (tmp_path / "output" / "checkpoints").mkdir(parents=True)
    assert newest_checkpoint(tmp_path / "output") == ("", 0)


def checkpoints(output: Path, *names: str) -> None:
    folder = output / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:  # complete checkpoints: a header with the payload's length and checksum
        (folder / name).write_bytes(checkpoint_names.header(name.encode()) + name.encode())


def test_an_epoch_checkpoints_step_comes_from_the_epochs_record(tmp_path: Path) -> None:
    checkpoints(tmp_path, "epoch-00001.ckpt", "epoch-00002.ckpt")
    records = [
        {"kind": "step", "epoch": 0, "step": 40, "loss": 1.0},
        {"kind": "epoch", "epoch": 1, "step": 40, "loss": 1.0},
        {"kind": "step", "epoch": 1, "step": 80, "loss": 0.9},
        {"kind": "epoch", "epoch": 2, "step": 80, "loss": 0.9},
        {"kind": "step", "epoch": 2, "step": 100, "loss": 0.8},
    ]
    lines = [json.dumps(record) for record in records]
    (tmp_path / "metrics.jsonl").write_text("\n".join([lines[0], "not json", *lines[1:]]) + "\n")
    assert newest_checkpoint(tmp_path) == ("epoch-00002.ckpt", 80)


def test_an_epoch_checkpoint_without_its_record_resumes_from_step_0(tmp_path: Path) -> None:
    checkpoints(tmp_path, "epoch-00002.ckpt")
    assert newest_checkpoint(tmp_path) == ("epoch-00002.ckpt", 0)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "epoch", "epoch": 1, "step": 40}) + "\n")
    assert newest_checkpoint(tmp_path) == ("epoch-00002.ckpt", 0)


def test_a_mid_epoch_checkpoint_names_its_step_and_comes_after_its_epochs_start(tmp_path: Path) -> None:
    checkpoints(
        tmp_path, "epoch-00003.ckpt", "epoch-00002.step-000000120.ckpt", "epoch-00003.step-000000150.ckpt"
    )
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "epoch", "epoch": 3, "step": 130}) + "\n")
    assert newest_checkpoint(tmp_path) == ("epoch-00003.step-000000150.ckpt", 150)
    checkpoints(tmp_path, "epoch-00004.ckpt")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "epoch", "epoch": 4, "step": 170}) + "\n")
    assert newest_checkpoint(tmp_path) == ("epoch-00004.ckpt", 170)


def test_temporary_and_other_files_are_not_checkpoints(tmp_path: Path) -> None:
    checkpoints(
        tmp_path,
        "epoch-00001.ckpt",
        ".epoch-00009.ckpt.tmp-123",
        "epoch-00009.ckpt.tmp-123",
        "epoch-00009.step-000000999.ckpt.partial",
        "epoch-x.ckpt",
        "latest.ckpt",
    )
    assert newest_checkpoint(tmp_path) == ("epoch-00001.ckpt", 0)


# --- the supervisor, on nodes faked: n0 (this node), n1, the spares ---


class Cluster:
    """Stands in for the nodes: ``down`` do not answer, ``busy`` run another job, ``leftover`` still run the
    job's processes. Commands for this node (n0) run here for real (the archive of the attempt's logs)."""

    def __init__(self, supervisor: Supervisor, monkeypatch: pytest.MonkeyPatch) -> None:
        self.supervisor = supervisor
        self.down: set[str] = set()
        self.busy: set[str] = set()
        self.leftover: dict[str, str] = {}
        self.tails: dict[str, str] = {}  # node -> what a rank's log there ends with
        self.commands: list[tuple[str, str]] = []
        self.given: list[tuple[list[str], bytes]] = []
        self.errors: dict[str, str] = {}  # node -> the exception lines of its ranks' logs
        self.resets: dict[str, str] = {}  # node -> what the reset of its image's start files says there
        self.fences: dict[str, fence.Held] = {}  # node -> the generation of the job's supervisor it granted
        self.gone: set[str] = set()  # nodes proven gone (their name no longer resolves)
        self.real_run = supervisor.mesh.run
        monkeypatch.setattr(supervisor.mesh, "probe", self.probe)
        monkeypatch.setattr(supervisor.mesh, "run", self.on_node)
        monkeypatch.setattr(supervisor.mesh, "give", self.distribute)
        monkeypatch.setattr(supervisor.mesh, "proven_gone", lambda node: node in self.gone)

    def probe(self, node: str) -> str:
        return "down" if node in self.down else "up"

    def on_node(self, node: str, command: str) -> str:
        self.commands.append((node, command))
        if node in self.down:
            return ""
        if command.startswith("pgrep -a"):
            return self.leftover.get(node, "")
        if f"-m {fence.MODULE} " in command and " --ask " in command:  # the fence's election
            asked = re.search(r"--ask (\d+) --node (\S+)", command)
            assert asked is not None, command
            generation, asker = int(asked.group(1)), asked.group(2)
            held = self.fences.get(node, fence.Held())
            if generation > held.generation or (generation == held.generation and asker == held.node):
                held = self.fences[node] = fence.Held(generation, asker)
                return json.dumps({"granted": True, "generation": generation, "node": asker}) + "\n"
            return json.dumps({"granted": False, "generation": held.generation, "node": held.node}) + "\n"
        if command.startswith("cat ") and fence.RECORD in command and node in self.fences:
            held = self.fences[node]
            return json.dumps({"generation": held.generation, "node": held.node}) + "\n"
        if image_reset.SCRIPT in command:  # a spare's image put back before it joins
            return self.resets.get(node, "") + recovery.RESET_RAN + "\n"
        if " --claim " in command and " --here" in command:  # a spare claimed for the job
            refused = {"claimed": False, "job": "j0", "nodes": [node]}
            return json.dumps(refused if node in self.busy else {"claimed": True}) + "\n"
        if "ddp_cluster.supervisor.jobs --jobs-dir" in command:  # which jobs run there
            return json.dumps({"busy": ["j0"] if node in self.busy else []}) + "\n"
        if command.startswith("tail -n") and node in self.tails:
            return self.tails[node]
        if command.startswith("for f in") and "| grep -E" in command:  # the exception lines of its ranks
            return self.errors.get(node, "")
        if node == self.supervisor.me:
            return self.real_run(node, command)
        return ""

    def distribute(self, nodes: Any, data: bytes, where: Path, pool: ThreadPoolExecutor) -> Failure | None:
        self.given.append((list(nodes), data))
        return None

    def asked(self, node: str) -> list[str]:
        """The commands ``node`` was asked, but the fence's election (asserted on its own)."""
        return [command for where, command in self.commands if where == node and fence.MODULE not in command]


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4) as executor:
        yield executor


def faked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **changes: Any) -> tuple[Supervisor, Cluster]:
    """A supervisor of job j1 on n0 (this node) and n1, its nodes faked (no ssh)."""
    job_dir = tmp_path / "jobs" / "j1"
    (job_dir / "output").mkdir(parents=True, exist_ok=True)
    fields: dict[str, Any] = {"nodes": ["n0", "n1"], "job_dir": str(job_dir), "max_restarts": 1}
    job = spec(**(fields | changes))
    supervisor = Supervisor(spec=job, job_dir=job_dir, launcher=job.launch_argv())
    supervisor.mesh.me = "n0"
    supervisor.holder = True  # as run() has it: the start's supervisor holds the job
    # as run() starts the first attempt
    supervisor.status.write(state="running", nodes=supervisor.nodes, ran_on=supervisor.nodes, max_restarts=1)
    return supervisor, Cluster(supervisor, monkeypatch)


def lost(node: str) -> Failure:
    return Failure(
        f"node {node} stopped answering ssh (its container or server is down)", node=node, lost=(node,)
    )


# --- what a restart can cure ---


def test_a_lost_node_or_a_signal_can_be_cured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, _ = faked(tmp_path, monkeypatch)
    assert recovery.restart_cause(supervisor, lost("n1"), pool) == "node n1 stopped answering"
    two = Failure("x", lost=("n1", "n2"))
    assert recovery.restart_cause(supervisor, two, pool) == "node n1, n2 stopped answering"
    killed = Failure("a rank was killed by a signal", node="n1", rank=1, signal=9)
    assert recovery.restart_cause(supervisor, killed, pool) == "rank 1 on n1 was killed by SIGKILL"
    agent = Failure("x", node="n1", signal=15)
    assert recovery.restart_cause(supervisor, agent, pool) == "n1 was killed by SIGTERM"
    assert recovery.restart_cause(supervisor, Failure("x", signal=9), pool) == "a rank was killed by SIGKILL"


def test_mpiruns_signal_line_is_a_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, _ = faked(tmp_path, monkeypatch)
    failure = launcher_failure((DATA / "mpirun-signal.log").read_text(), supervisor.spec, 1)
    assert recovery.restart_cause(supervisor, failure, pool) == "rank 1 on node1 was killed by SIGKILL"


def test_a_stop_or_the_time_bound_is_never_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, _ = faked(tmp_path, monkeypatch)
    assert (
        recovery.restart_cause(supervisor, Failure("stopped", lost=("n1",), restartable=False), pool) is None
    )
    assert recovery.restart_cause(supervisor, Failure("x", signal=9, restartable=False), pool) is None


def test_a_gloo_peer_lost_in_the_launchers_log_is_a_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, _ = faked(tmp_path, monkeypatch)
    (supervisor.job_dir / LAUNCHER_LOG).write_text(f"starting\n{GLOO_LINE}\n")
    assert (
        recovery.restart_cause(supervisor, Failure("the launcher exited with status 1", exit_code=1), pool)
        == GLOO_CAUSE
    )


def test_a_gloo_peer_lost_in_a_ranks_log_is_a_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, _ = faked(tmp_path, monkeypatch)
    log = supervisor.job_dir / "logs" / "1" / "rank.0" / "stdout"
    log.parent.mkdir(parents=True)
    log.write_text(f"epoch 1\n{GLOO_LINE}\n")
    failure = Failure("a rank exited with an error", node="n0", rank=0, exit_code=1)
    assert recovery.restart_cause(supervisor, failure, pool) == GLOO_CAUSE


def test_the_store_timing_out_is_a_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, _ = faked(tmp_path, monkeypatch)
    (supervisor.job_dir / LAUNCHER_LOG).write_text(
        (REPO / "python/tests/data/doctor/store-timeout.log").read_text()
    )
    cause = recovery.restart_cause(
        supervisor, Failure("the launcher exited with status 1", exit_code=1), pool
    )
    assert cause is not None and cause.startswith("the ranks could not meet at the rendezvous")


def test_a_collective_timing_out_under_torchrun_is_a_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    """torchrun's worker on n1 says NCCL's watchdog timed out (its output, teed by its agent, reaches the
    launcher's log as mpirun forwards it, and its log on n1); the agent then reports the worker's exit
    (ChildFailedError, torchrun's own exception). No error of the program: a restart may cure it."""
    supervisor, cluster = faked(tmp_path, monkeypatch, launcher="torchrun")
    watchdog = (
        "[rank1]:[E1120 10:00:04.1 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation"
        " timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n"
    )
    agent = (DATA / "torchrun-root-cause.log").read_text()
    for signalled, exited in [
        ("(exitcode: -9)", "(exitcode: 1)"),
        ("exitcode  : -9", "exitcode  : 1"),
        (
            "Signal 9 (SIGKILL) received by PID 51",
            "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        ),
        ("node1", "n1"),
    ]:
        assert signalled in agent
        agent = agent.replace(signalled, exited)
    text = watchdog + agent
    (supervisor.job_dir / LAUNCHER_LOG).write_text(text)
    cluster.tails["n1"] = watchdog
    failure = launcher_failure(text, supervisor.spec, 1)
    assert (failure.node, failure.rank, failure.exit_code, failure.signal) == ("n1", 1, 1, None)
    cause = recovery.restart_cause(supervisor, failure, pool)
    assert cause is not None and cause.startswith("an NCCL collective timed out or lost its peer")


def test_an_hccl_collective_timing_out_is_a_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    """HCCL's EI0002 (a collective waited for a rank that never came) is HCCL's collective timeout."""
    supervisor, _ = faked(tmp_path, monkeypatch)
    text = (REPO / "python/tests/data/doctor/hccl-EI0002.log").read_text()
    (supervisor.job_dir / LAUNCHER_LOG).write_text(text)
    assert (
        recovery.restart_cause(supervisor, Failure("the launcher exited with status 1", exit_code=1), pool)
        is not None
    )


def test_the_users_python_error_is_not_a_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, _ = faked(tmp_path, monkeypatch)
    log = supervisor.job_dir / "logs" / "1" / "rank.1" / "stdout"
    log.parent.mkdir(parents=True)
    log.write_text(ZERO_DIVISION)
    (supervisor.job_dir / LAUNCHER_LOG).write_text("mpirun noticed that process rank 1 exited\n")
    failure = Failure("a rank exited with an error", node="n1", rank=1, exit_code=1)
    assert recovery.restart_cause(supervisor, failure, pool) is None


def test_a_cause_no_restart_cures_outranks_its_peers_lost_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    """Rank 1 cannot use the job's device (the same on a restart); rank 0's gloo collective then lost it."""
    supervisor, _ = faked(tmp_path, monkeypatch)
    unusable = (REPO / "python/tests/data/doctor/device-unusable.log").read_text()
    (supervisor.job_dir / LAUNCHER_LOG).write_text(f"{unusable}\n{GLOO_LINE}\n")
    failure = Failure("a rank exited with an error", node="n1", rank=1, exit_code=1)
    assert recovery.restart_cause(supervisor, failure, pool) is None


def test_a_rank_that_exited_first_with_the_users_error_is_not_a_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, _ = faked(tmp_path, monkeypatch)
    log = f"{ZERO_DIVISION}{GLOO_LINE}\nrank 1 on node n1 exited with code 1 first\n"
    (supervisor.job_dir / LAUNCHER_LOG).write_text(log)
    failure = Failure("a rank exited with an error", node="n1", rank=1, exit_code=1)
    assert recovery.restart_cause(supervisor, failure, pool) is None


def test_a_rank_that_exited_with_an_error_while_its_peer_lost_the_connection_is_not_a_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    """Real mpirun 4.1 output: rank 1 exited with code 3, rank 0's gloo collective then lost its peer; rank
    1's log (here, where mpirun writes it) holds the program's own error."""
    supervisor, _ = faked(tmp_path, monkeypatch)
    text = (DATA / "mpirun-exit.log").read_text()
    (supervisor.job_dir / LAUNCHER_LOG).write_text(text)
    log = supervisor.job_dir / "logs" / "1" / "rank.1" / "stdout"
    log.parent.mkdir(parents=True)
    log.write_text(ZERO_DIVISION)
    failure = launcher_failure(text, supervisor.spec, 1)
    assert (failure.rank, failure.exit_code, failure.signal) == (1, 3, None)
    assert recovery.restart_cause(supervisor, failure, pool) is None


def test_the_users_error_in_the_failing_ranks_log_on_its_own_node_is_not_a_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    """As above, but rank 1's log is on n1 (mpirun writes a rank's log on its node): it is read there."""
    supervisor, cluster = faked(tmp_path, monkeypatch)
    text = (DATA / "mpirun-exit.log").read_text().replace("node1", "n1")
    (supervisor.job_dir / LAUNCHER_LOG).write_text(text)
    cluster.tails["n1"] = "[rank1]: " + ZERO_DIVISION.replace("\n", "\n[rank1]: ")
    failure = launcher_failure(text, supervisor.spec, 1)
    assert (failure.node, failure.rank) == ("n1", 1)
    assert recovery.restart_cause(supervisor, failure, pool) is None


def test_a_peers_lost_connection_heard_first_is_no_cause_when_another_node_holds_the_users_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    """Rank 1 on n1 raised the program's error; rank 0 here lost its gloo peer and mpirun heard of rank 0's
    exit first. The other nodes are asked for their ranks' errors: n1's makes it no cause. Without one, the
    lost connection is a cause; a stopped torchrun agent's SignalException is not the program's error."""
    supervisor, cluster = faked(tmp_path, monkeypatch, nodes=["n0", "n1", "n2"])
    log = supervisor.job_dir / "logs" / "1" / "rank.0" / "stdout"
    log.parent.mkdir(parents=True)
    log.write_text(GLOO_LINE + "\n")
    (supervisor.job_dir / LAUNCHER_LOG).write_text("mpirun noticed that process rank 0 exited\n")
    failure = Failure("a rank exited with an error", node="n0", rank=0, exit_code=1)
    cluster.errors["n2"] = (
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 42 got signal: 15\n"
    )
    assert recovery.restart_cause(supervisor, failure, pool) == GLOO_CAUSE
    assert sorted(node for node, command in cluster.commands if "| grep -E" in command) == ["n1", "n2"]
    cluster.errors["n1"] = "[rank1]: ZeroDivisionError: a bug of mine\n"
    assert recovery.restart_cause(supervisor, failure, pool) is None


# --- the restart ---


def first_attempt(supervisor: Supervisor) -> None:
    """What the first attempt left: logs, a checkpoint at step 150, progress at step 170, the bundle."""
    job_dir = supervisor.job_dir
    checkpoints(job_dir / "output", "epoch-00003.ckpt", "epoch-00003.step-000000150.ckpt")
    records = [{"kind": "epoch", "epoch": 3, "step": 120}, {"kind": "step", "epoch": 3, "step": 170}]
    (job_dir / "output" / "metrics.jsonl").write_text("".join(json.dumps(item) + "\n" for item in records))
    log = job_dir / "logs" / "1" / "rank.0" / "stdout"
    log.parent.mkdir(parents=True)
    log.write_text("epoch 3\n")
    (job_dir / LAUNCHER_LOG).write_text("the first attempt\n")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        add_file(bundle, "train.py", b"the job's script")
    (job_dir / BUNDLE).write_bytes(buffer.getvalue())


def tar_files(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {item.name: tar.extractfile(item).read() for item in tar.getmembers()}  # type: ignore[union-attr]


def test_a_spare_whose_image_cannot_be_put_back_is_passed_over_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    """Before a spare takes the job's files its image's start files are put back (as a start's node check
    does); one that refuses is passed over like a node that did not take the files, the next spare taken."""
    supervisor, cluster = faked(tmp_path, monkeypatch, spares=["n2", "n3"])
    cluster.down = {"n1"}
    cluster.resets["n2"] = image_reset.REFUSED + "/opt/venv/bin is no longer the image's directory\n"
    cluster.resets["n3"] = image_reset.UNDONE + "removed /opt/venv/lib/python3.11/site-packages/x.pth\n"
    first_attempt(supervisor)

    assert recovery.recover(supervisor, lost("n1"), pool) is True

    assert supervisor.spec.nodes == ("n0", "n3")
    assert [node for node, command in cluster.commands if image_reset.SCRIPT in command] == ["n2", "n3"]
    assert all(nodes != ["n2"] for nodes, _ in cluster.given)  # n2 never got the job's files


def test_a_spare_that_does_not_answer_its_reset_is_not_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, cluster = faked(tmp_path, monkeypatch, spares=["n2"])
    cluster.down = {"n1"}
    first_attempt(supervisor)
    real = cluster.on_node
    monkeypatch.setattr(
        supervisor.mesh,
        "run",
        lambda node, command: "" if image_reset.SCRIPT in command else real(node, command),
    )
    failure = lost("n1")

    assert recovery.recover(supervisor, failure, pool) is False
    assert "did not take the job's files: n2" in failure.reason


def test_a_lost_node_is_replaced_by_a_free_spare_from_the_newest_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, cluster = faked(tmp_path, monkeypatch, spares=["n2"])
    cluster.down = {"n1"}
    first_attempt(supervisor)
    job_dir = supervisor.job_dir
    failure = lost("n1")

    assert recovery.recover(supervisor, failure, pool) is True

    new = supervisor.spec
    assert (new.nodes, new.spares, new.restart, new.resume) == (("n0", "n2"), (), 1, True)
    checkpoint = f"{job_dir}/output/checkpoints/epoch-00003.step-000000150.ckpt"
    assert new.resume_from == checkpoint
    assert supervisor.nodes == ["n0", "n2"] and supervisor.launcher == new.launch_argv()
    variables = exported(supervisor.spec)
    assert (variables["DDP_RESTART_COUNT"], variables["DDP_MAX_RESTARTS"], variables["DDP_RESUME_FROM"]) == (
        "1",
        "1",
        checkpoint,
    )
    assert (
        "--resume" in supervisor.launcher and supervisor.launcher[supervisor.launcher.index("-np") + 1] == "2"
    )
    # this attempt's files, here and for the other nodes
    assert jobspec.load(job_dir / jobspec.JOB_FILE) == new
    hostfile = (job_dir / "hostfile").read_text()
    assert "n0 slots=1\nn2 slots=1\n" in hostfile and "n1" not in hostfile
    assert [nodes for nodes, _ in cluster.given] == [["n2"], ["n2"]]
    # the spare gets the job's files first, and the bundle itself (to hand on if it takes the job over)
    given = tar_files(cluster.given[0][1])
    assert given["train.py"] == b"the job's script" and given[BUNDLE] == (job_dir / BUNDLE).read_bytes()
    update = tar_files(cluster.given[1][1])
    assert json.loads(update[jobspec.JOB_FILE])["nodes"] == ["n0", "n2"]
    # the attempt's logs, archived here; the lost node is asked nothing
    assert (job_dir / ATTEMPTS / "0" / LAUNCHER_LOG).read_text() == "the first attempt\n"
    assert (job_dir / ATTEMPTS / "0" / "logs" / "1" / "rank.0" / "stdout").read_text() == "epoch 3\n"
    assert (job_dir / "logs").is_dir() and not any((job_dir / "logs").iterdir())
    assert not (job_dir / LAUNCHER_LOG).exists()
    # the spare is asked which jobs it runs, claimed for this one, then its image's start files put back
    assert cluster.asked("n1") == [] and len(cluster.asked("n2")) == 3
    assert "--claim j1 --here" in cluster.asked("n2")[1]
    assert image_reset.SCRIPT in cluster.asked("n2")[2]
    # the record, in the supervisor and its status
    (record,) = supervisor.restarts
    assert {key: record[key] for key in record if key not in ("lost_at", "restarted_at")} == {
        "restart": 1,
        "cause": "node n1 stopped answering",
        "lost": ["n1"],
        "nodes_before": ["n0", "n1"],
        "nodes_after": ["n0", "n2"],
        "spares_taken": ["n2"],
        "training_again_s": None,
        "checkpoint": "epoch-00003.step-000000150.ckpt",
        "resume_step": 150,
        "last_step": 170,
        "steps_redone": 20,
        "checkpoints_skipped": [],
    }
    assert record["lost_at"] == round(failure.at, 2) <= record["restarted_at"]
    written = status.read(job_dir / STATUS_FILE)
    assert written is not None and written.state == "running"
    assert (written.nodes, written.ran_on, written.lost_nodes) == (("n0", "n2"), ("n0", "n1", "n2"), ("n1",))
    assert [dict(item) for item in written.restarts] == [record] and written.ranks_running is False


def test_a_users_script_resumes_from_its_own_plain_checkpoint_passing_over_a_cut_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    """A user's script writes plain torch.save files (zip archives, no header of ours): the restart takes the
    newest whole one by its archive and names it in DDP_RESUME_FROM; a newer one cut short is named and left
    where it is (never renamed aside: the script may read its own folder)."""
    supervisor, cluster = faked(tmp_path, monkeypatch, spares=["n2"], script="train.py")
    cluster.down = {"n1"}
    first_attempt(supervisor)
    folder = supervisor.job_dir / "output" / "checkpoints"
    for stale in folder.iterdir():
        stale.unlink()
    for name in ("epoch-00001.ckpt", "epoch-00001.step-000000070.ckpt", "epoch-00002.ckpt"):
        with zipfile.ZipFile(folder / name, "w") as archive:
            archive.writestr("archive/data.pkl", name.encode() * 100)
    cut = folder / "epoch-00002.ckpt"
    cut.write_bytes(cut.read_bytes()[:-40])
    os.utime(folder / "epoch-00001.ckpt", (4e9, 4e9))  # a future mtime decides nothing

    assert recovery.recover(supervisor, lost("n1"), pool) is True

    resumed = f"{supervisor.job_dir}/output/checkpoints/epoch-00001.step-000000070.ckpt"
    assert exported(supervisor.spec)["DDP_RESUME_FROM"] == resumed and not supervisor.spec.resume
    [record] = supervisor.restarts
    assert record["checkpoint"] == "epoch-00001.step-000000070.ckpt" and record["resume_step"] == 70
    [skipped] = record["checkpoints_skipped"]
    assert f"checkpoint {cut} is not a whole zip archive" in skipped and "left as it is" in skipped
    assert sorted(path.name for path in folder.iterdir()) == [
        "epoch-00001.ckpt",
        "epoch-00001.step-000000070.ckpt",
        "epoch-00002.ckpt",
    ]


def test_max_restarts_bounds_the_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, cluster = faked(tmp_path, monkeypatch, nodes=["n0", "n1"], spares=["n2", "n3"])
    cluster.down = {"n1"}
    first_attempt(supervisor)
    assert recovery.recover(supervisor, lost("n1"), pool) is True
    cluster.down = {"n1", "n2"}
    again = lost("n2")
    assert recovery.recover(supervisor, again, pool) is False
    assert "not restarted again: max_restarts=1 reached (lost before: n1)" in again.reason
    assert supervisor.spec.nodes == ("n0", "n2") and len(supervisor.restarts) == 1


def test_without_a_spare_the_job_goes_on_with_fewer_nodes_down_to_min_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, cluster = faked(tmp_path, monkeypatch, min_nodes=1)
    cluster.down = {"n1"}
    first_attempt(supervisor)
    assert recovery.recover(supervisor, lost("n1"), pool) is True
    assert supervisor.spec.nodes == ("n0",) and supervisor.spec.restart == 1
    assert supervisor.restarts[0]["spares_taken"] == [] and supervisor.restarts[0]["nodes_after"] == ["n0"]
    assert supervisor.launcher[supervisor.launcher.index("-np") + 1] == "1"
    assert "n1" not in (supervisor.job_dir / "hostfile").read_text()


def test_without_a_spare_and_min_nodes_0_the_job_is_not_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, cluster = faked(tmp_path, monkeypatch)
    cluster.down = {"n1"}
    first_attempt(supervisor)
    failure = lost("n1")
    assert recovery.recover(supervisor, failure, pool) is False
    assert "not restarted: 1 node(s) left (n0), fewer than min_nodes=2" in failure.reason
    assert "(the inventory has none)" in failure.reason
    assert supervisor.spec.nodes == ("n0", "n1") and supervisor.restarts == [] and cluster.given == []
    assert (supervisor.job_dir / LAUNCHER_LOG).exists()  # nothing archived


def test_a_busy_or_down_spare_is_not_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, cluster = faked(tmp_path, monkeypatch, spares=["n2", "n3"])
    cluster.down, cluster.busy = {"n1", "n3"}, {"n2"}
    first_attempt(supervisor)
    failure = lost("n1")
    assert recovery.recover(supervisor, failure, pool) is False
    assert "fewer than min_nodes=2, and no spare up and free among n2, n3" in failure.reason
    assert len(cluster.asked("n2")) == 1 and cluster.asked("n3") == []  # a spare that is down is not asked


def test_the_first_free_spare_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, cluster = faked(tmp_path, monkeypatch, spares=["n2", "n3", "n4"])
    cluster.down, cluster.busy = {"n1"}, {"n2"}
    first_attempt(supervisor)
    assert recovery.recover(supervisor, lost("n1"), pool) is True
    assert supervisor.spec.nodes == ("n0", "n3") and supervisor.spec.spares == ("n2", "n4")
    assert supervisor.restarts[0]["spares_taken"] == ["n3"] and cluster.asked("n4") == []


def test_a_failure_a_restart_does_not_cure_is_not_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, cluster = faked(tmp_path, monkeypatch, spares=["n2"])
    first_attempt(supervisor)
    users = Failure("a rank exited with an error", node="n1", rank=1, exit_code=1)
    assert recovery.recover(supervisor, users, pool) is False
    assert users.reason.endswith("; not restarted: a restart does not cure this (the job's own error)")
    bound = Failure("the job did not finish within job_timeout=60 s", restartable=False)
    assert recovery.recover(supervisor, bound, pool) is False
    assert bound.reason == "the job did not finish within job_timeout=60 s"
    # nothing is asked of the nodes but the failing rank's log
    assert all(command.startswith("tail -n") for _, command in cluster.commands)
    assert supervisor.restarts == []


def test_without_max_restarts_nothing_is_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, cluster = faked(tmp_path, monkeypatch, max_restarts=0, spares=["n2"])
    cluster.down = {"n1"}
    failure = lost("n1")
    assert recovery.recover(supervisor, failure, pool) is False
    assert "not restarted" not in failure.reason and cluster.commands == []


def test_processes_that_outlived_the_stop_prevent_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, cluster = faked(tmp_path, monkeypatch, spares=["n2"])
    cluster.down = {"n1"}
    cluster.leftover = {"n0": f"4321 python -m ddp_cluster.train --output-dir {supervisor.job_dir}/output"}
    first_attempt(supervisor)
    failure = lost("n1")
    assert recovery.recover(supervisor, failure, pool) is False
    assert "not restarted: processes of the job outlived the stop on n0" in failure.reason
    assert supervisor.spec.nodes == ("n0", "n1")


def test_a_users_script_is_told_where_to_resume_but_not_given_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, cluster = faked(tmp_path, monkeypatch, spares=["n2"], script="train.py")
    cluster.down = {"n1"}
    first_attempt(supervisor)
    assert recovery.recover(supervisor, lost("n1"), pool) is True
    assert supervisor.spec.resume is False and "--resume" not in supervisor.launcher
    assert exported(supervisor.spec)["DDP_RESUME_FROM"].endswith("/epoch-00003.step-000000150.ckpt")


# --- the spec's recovery fields ---


def test_every_rank_is_told_the_restart_count_and_the_checkpoint() -> None:
    first = spec().variables()
    assert (first["DDP_RESTART_COUNT"], first["DDP_MAX_RESTARTS"], first["DDP_RESUME_FROM"]) == ("0", "0", "")
    later = spec(
        max_restarts=3, restart=2, resume_from="/workspace/jobs/j1/output/checkpoints/epoch-00002.ckpt"
    )
    assert {name: later.variables()[name] for name in ("DDP_RESTART_COUNT", "DDP_MAX_RESTARTS")} == {
        "DDP_RESTART_COUNT": "2",
        "DDP_MAX_RESTARTS": "3",
    }
    assert exported(later)["DDP_RESUME_FROM"] == later.resume_from


def test_the_spec_refuses_more_min_nodes_than_nodes_and_spares_among_its_nodes() -> None:
    assert spec(min_nodes=2).min_nodes == 2
    with pytest.raises(JobSpecError, match=r"min_nodes=3 is more than the job's 2 node\(s\)"):
        spec(min_nodes=3)
    with pytest.raises(
        JobSpecError, match=r"spares=\['node1', 'node2'\] names the job's own node\(s\) node1"
    ):
        spec(spares=["node1", "node2"])
    with pytest.raises(JobSpecError, match="max_restarts=-1 must be at least 0"):
        spec(max_restarts=-1)


def test_the_recovery_fields_round_trip_through_job_json() -> None:
    job = spec(
        max_restarts=2,
        min_nodes=1,
        spares=["node2"],
        restart=1,
        resume_from="/workspace/jobs/j1/output/checkpoints/epoch-00001.ckpt",
        recovery={"visible": {"node0": "0,1"}},
    )
    assert JobSpec.from_dict(json.loads(job.dumps())) == job


# --- the status's restart fields ---


RECORD = {
    "restart": 1,
    "cause": "node n1 stopped answering",
    "lost": ["n1"],
    "nodes_before": ["n0", "n1"],
    "nodes_after": ["n0", "n2"],
    "spares_taken": ["n2"],
    "lost_at": 100.0,
    "restarted_at": 104.5,
    "training_again_s": 12.34,
    "checkpoint": "epoch-00003.step-000000150.ckpt",
    "resume_step": 150,
    "last_step": 170,
    "steps_redone": 20,
}


def test_the_restart_fields_of_a_status_round_trip(tmp_path: Path) -> None:
    written = Status().update(
        state="failed",
        restarts=[RECORD],
        ran_on=["n0", "n1", "n2"],
        ranks_running=True,
        interrupted="stopped with jobs.yml -e stop=j1",
        max_restarts=1,
    )
    path = tmp_path / status.FILE
    path.write_text(written.dumps())
    read = status.read(path)
    assert read == written and read is not None
    assert (read.ran_on, read.ranks_running, read.interrupted, read.max_restarts) == (
        ("n0", "n1", "n2"),
        True,
        "stopped with jobs.yml -e stop=j1",
        1,
    )
    assert [dict(item) for item in read.restarts] == [RECORD]
    assert json.loads(read.dumps())["restarts"] == [RECORD]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ranks_running", "yes", "ranks_running='yes' must be bool"),
        ("interrupted", 1, "interrupted=1 must be str"),
        ("restarts", "x", "restarts='x' must be a list of records"),
        ("ran_on", "n0", "ran_on='n0' must be a list"),
        ("max_restarts", True, "max_restarts=True must be int"),
    ],
)
def test_a_wrong_restart_field_is_named(field: str, value: Any, message: str) -> None:
    with pytest.raises(status.StatusError) as error:
        Status.from_dict({"state": "running", field: value})
    assert message in str(error.value)


def test_a_restart_is_one_line() -> None:
    line = status.describe_restart(RECORD)
    assert line == (
        "restart 1: node n1 stopped answering; lost n1; on n0, n2 (spare n2 taken),"
        " resumed from epoch-00003.step-000000150.ckpt (step 150), 20 step(s) redone,"
        " training again 12.3 s after the loss"
    )
    bare = {"restart": 2, "cause": "rank 0 on n0 was killed by SIGKILL", "lost": [], "nodes_after": ["n0"]}
    assert (
        status.describe_restart(bare) == "restart 2: rank 0 on n0 was killed by SIGKILL; lost no node; on n0"
    )
    assert "\n" not in line


# --- the plan's spares ---


def inventory(tmp_path: Path, nodes: tuple[str, ...], recorded: tuple[str, ...] | None = None) -> Inventory:
    """test_plan's inventory, with site.yml's records of ``recorded`` only (default: every node)."""
    return plan_inventory(tmp_path, nodes, records=records(*(nodes if recorded is None else recorded)))


THREE = ("node0", "node1", "node2")


def test_with_max_restarts_the_inventorys_other_recorded_nodes_are_spares(tmp_path: Path) -> None:
    planned = plan.make_plan(request(max_restarts="1"), OPTIONS, inventory(tmp_path, THREE))
    assert planned.spec.nodes == ("node0", "node1") and planned.spec.spares == ("node2",)
    assert (planned.spec.max_restarts, planned.spec.min_nodes) == (1, 0)
    assert planned.host_dirs["node2"] == "/var/lib/ddp-cluster/node2/workspace/jobs/j1"
    assert planned.to_dict()["spares"] == ["node2"]
    restarts = [line for line in planned.lines() if "restarts up to 1 time(s)" in line]
    assert len(restarts) == 1 and "spares: up to 1 more node(s) Slurm has free at the start" in restarts[0]
    fewer = plan.make_plan(request(max_restarts=1, min_nodes="1"), OPTIONS, inventory(tmp_path, THREE))
    assert fewer.spec.min_nodes == 1 and "down to min_nodes=1" in fewer.lines()[-1]


def test_a_node_site_yml_did_not_record_is_no_spare(tmp_path: Path) -> None:
    inv = inventory(tmp_path, (*THREE, "node3"), recorded=THREE)
    assert plan.make_plan(request(max_restarts=1), OPTIONS, inv).spec.spares == ("node2",)


def test_without_max_restarts_or_for_a_health_gate_there_are_no_spares(tmp_path: Path) -> None:
    planned = plan.make_plan(request(max_restarts=0), OPTIONS, inventory(tmp_path, THREE))
    assert planned.spec.spares == () and not any("restarts up to" in line for line in planned.lines())
    gate = plan.make_plan(request(kind="check", max_restarts=1), OPTIONS, inventory(tmp_path, THREE))
    assert (gate.spec.spares, gate.spec.max_restarts, gate.spec.min_nodes) == ((), 0, 0)


def refused(tmp_path: Path, **changes: Any) -> str:
    with pytest.raises(PlanError) as error:
        plan.make_plan(request(**changes), OPTIONS, inventory(tmp_path, THREE))
    return str(error.value)


def test_more_min_nodes_than_nodes_is_refused_naming_min_nodes(tmp_path: Path) -> None:
    assert "min_nodes=3 is more than nodes=2" in refused(tmp_path, max_restarts=1, min_nodes=3)


@pytest.mark.parametrize("value", [-1, "-1", "x", "1.5", True])
def test_max_restarts_must_be_a_whole_number(tmp_path: Path, value: Any) -> None:
    assert f"max_restarts={value} must be a whole number (0: no restart)" in refused(
        tmp_path, max_restarts=value
    )


def test_min_nodes_must_be_a_whole_number(tmp_path: Path) -> None:
    assert "min_nodes=y must be a whole number (0: every node of the job)" in refused(tmp_path, min_nodes="y")


def test_a_node_that_does_not_take_the_jobs_files_is_replaced_by_a_spare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, cluster = faked(tmp_path, monkeypatch, nodes=["n0", "n1", "n2"], spares=["n3", "n4"])
    first_attempt(supervisor)
    cluster.down = {"n2"}

    def distribute(nodes: Any, data: bytes, where: Path, pool: ThreadPoolExecutor) -> Failure | None:
        cluster.given.append((list(nodes), data))
        if "n1" in nodes:  # n1 answers probes but cannot take files (frozen, its disk full)
            return Failure(
                "the job's files could not be copied to node n1 (no answer within 300 s)", node="n1"
            )
        return None

    monkeypatch.setattr(supervisor.mesh, "give", distribute)
    assert recovery.recover(supervisor, lost("n2"), pool) is True
    assert supervisor.nodes == ["n0", "n3", "n4"]
    (record,) = supervisor.restarts
    assert record["lost"] == ["n1", "n2"] and record["spares_taken"] == ["n3", "n4"]


def test_an_epoch_checkpoint_without_metrics_here_takes_its_step_from_the_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    """A node that took the job over has rank 0's checkpoint copies but not its metrics.jsonl: the step of an
    epoch's checkpoint is the one the first node wrote into the status."""
    supervisor, cluster = faked(tmp_path, monkeypatch, spares=["n2"])
    first_attempt(supervisor)
    job_dir = supervisor.job_dir
    (job_dir / "output" / "metrics.jsonl").unlink()
    (job_dir / "output" / "checkpoints" / "epoch-00003.step-000000150.ckpt").unlink()
    (job_dir / "logs" / "1" / "rank.0" / "stdout").unlink()  # rank 0 ran on the lost first node
    supervisor.status.write(checkpoint_steps={"epoch-00003.ckpt": 120}, progress={"step": 170})
    cluster.down = {"n1"}
    assert recovery.recover(supervisor, lost("n1"), pool) is True
    (record,) = supervisor.restarts
    assert (record["checkpoint"], record["resume_step"], record["steps_redone"]) == (
        "epoch-00003.ckpt",
        120,
        50,
    )


def test_the_supervisor_notes_the_step_of_each_new_checkpoint_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    supervisor, _ = faked(tmp_path, monkeypatch)
    first_attempt(supervisor)
    assert supervisor.checkpoint_steps() == {"checkpoint_steps": {"epoch-00003.step-000000150.ckpt": 150}}
    supervisor.status.write(**supervisor.checkpoint_steps())
    assert supervisor.checkpoint_steps() == {}


def test_the_step_of_an_epochs_checkpoint_copy_is_read_or_inferred_from_the_first_nodes_word() -> None:
    known = {"epoch-00010.ckpt": 230, "epoch-00011.step-000000250.ckpt": 250}
    assert recovery.step_of_copy("epoch-00010.ckpt", known) == 230
    assert recovery.step_of_copy("epoch-00012.ckpt", known) == 276  # 12 epochs of 23 steps
    assert recovery.step_of_copy("epoch-00012.ckpt", {}) == 0
    assert recovery.step_of_copy("epoch-00012.step-000000270.ckpt", known) == 0


# --- one supervisor per job: the fence ---


def test_a_first_node_cut_from_its_standby_that_took_the_job_over_steps_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    """n0 and n1 cut from each other only: n1 (the standby) won generation 1 on n2 first. n0's restart asks
    for it too, gets n0 alone (n2 refuses it): no restart, no spare claimed, no file given; it steps down,
    its status naming n1 as the job's supervisor (the controller follows the job there)."""
    supervisor, cluster = faked(tmp_path, monkeypatch, nodes=["n0", "n1", "n2"], min_nodes=1)
    cluster.down = {"n1"}
    cluster.fences["n2"] = fence.Held(1, "n1")
    first_attempt(supervisor)
    failure = lost("n1")

    assert recovery.recover(supervisor, failure, pool) is False

    assert "not restarted here: generation 1: 1 of 3 voters granted it" in failure.reason
    assert "refused by n2 (holds generation 1 of n1)" in failure.reason
    assert cluster.given == [] and supervisor.spec.restart == 0
    assert supervisor.lost_election is not None and supervisor.lost_election.winner() == "n1"
    assert supervisor.step_down("n1", failure.reason) == 1
    written = json.loads((supervisor.job_dir / STATUS_FILE).read_text())
    assert written["supervisor_node"] == "n1" and written["state"] == "running"
    assert written["reason"].startswith("the supervisor on n0 stepped down: node n1 stopped answering")
    assert supervisor.outlived  # the other nodes' claims are the new supervisor's: not released
    # this node is out of the job: its end is recorded here, so the next job may take it at once
    assert (supervisor.job_dir / ENDED).is_file()


def test_a_restart_won_on_a_majority_guards_every_command_it_sends_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    supervisor, cluster = faked(tmp_path, monkeypatch, nodes=["n0", "n1", "n2"], min_nodes=1)
    cluster.down = {"n1"}
    first_attempt(supervisor)

    assert recovery.recover(supervisor, lost("n1"), pool) is True

    assert cluster.fences == {"n0": fence.Held(1, "n0"), "n2": fence.Held(1, "n0")}
    assert supervisor.generation == 1
    assert "--holds 1 --node n0 && " in supervisor.replicator.guard
    cluster.commands.clear()
    supervisor.mesh.sweep(["n0", "n2"], supervisor.tag, pool, guard=supervisor.guard())
    [(node, command)] = [(node, command) for node, command in cluster.commands if node != "n0"]
    assert node == "n2" and command.startswith(f"python -m {fence.MODULE} ") and "pkill -TERM" in command


def test_a_standby_of_two_nodes_takes_over_only_when_the_first_is_proven_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: ThreadPoolExecutor
) -> None:
    """Two voters: the standby's own vote is half. Silence of the first node is no proof (a cut between the
    two leaves the job with its first node); a name that no longer resolves is."""
    supervisor, cluster = faked(tmp_path, monkeypatch)
    supervisor.mesh.me, supervisor.holder = "n1", False  # the standby, taking over
    cluster.down = {"n0"}

    silent = supervisor.elect(pool)
    assert not silent.won and silent.silent == ["n0"]
    assert supervisor.stand_down(silent, "n0", pool) == 1
    written = json.loads((supervisor.job_dir / STATUS_FILE).read_text())
    assert written["state"] == "failed" and written["supervisor_node"] == "n1"
    assert "did not take the job over from n0: generation 1: 1 of 2 voters granted it" in written["reason"]
    assert "add a spare (a third voter)" in written["reason"]

    cluster.gone = {"n0"}
    assert supervisor.elect(pool).won and supervisor.generation == 1 and supervisor.holder
