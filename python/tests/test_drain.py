"""Drained nodes (ddp_cluster.supervisor.drain): the node's record written whole under its lock, the command's
JSON line, a drain over the mesh (a stand-in running the node's own command on a folder per node), the nodes
a health gate's verdict names, and what reads the record: the node's report, the jobs table, the claim of a
new job. No container."""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import shlex
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ddp_cluster.job import node_jobs, queue
from ddp_cluster.job.transport import Done, Unreachable
from ddp_cluster.supervisor import drain, jobs, recovery, remote

PRINTING = threading.Lock()


def run_cli(*argv: str) -> tuple[int, dict[str, Any]]:
    with PRINTING, contextlib.redirect_stdout(io.StringIO()) as out:
        rc = drain.main(list(argv))
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 1, lines  # one JSON line, whatever happened
    return rc, json.loads(lines[0])


# --- the record on one node ---


def test_a_drain_is_written_whole_and_read_back(tmp_path: Path) -> None:
    root = str(tmp_path / "jobs")
    assert drain.read(root) is None
    made, before = drain.drain(root, "  bad   fan ", "alice@ctl", now=0)
    assert before is None
    assert (made.reason, made.since, made.by) == ("bad fan", "1970-01-01T00:00:00Z", "alice@ctl")
    on_disk = json.loads((tmp_path / "jobs" / drain.DRAINED).read_text())
    assert on_disk == made.to_dict() and set(on_disk) == {"node", "reason", "since", "by"}
    assert drain.read(root) == made
    assert sorted(path.name for path in (tmp_path / "jobs").iterdir()) == sorted(
        [drain.DRAINED, drain.NODE_LOCK]
    )
    assert drain.drain(root, "bad fan", "bob@ctl") == (made, made)  # the same reason: kept as it was
    again, was = drain.drain(root, "still bad", "bob@ctl")
    assert was == made and drain.read(root) == again and again.reason == "still bad"
    assert drain.undrain(root) == again
    assert drain.read(root) is None and drain.undrain(root) is None  # not drained: nothing to do


def test_a_drain_without_a_reason_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    root = str(tmp_path / "jobs")
    with pytest.raises(drain.DrainError, match="needs a reason"):
        drain.drain(root, "   ", "alice")
    assert drain.read(root) is None


def test_check_mode_writes_nothing(tmp_path: Path) -> None:
    root = str(tmp_path / "jobs")
    made, _ = drain.drain(root, "r", "a", check=True)
    assert made.reason == "r" and drain.read(root) is None
    drain.drain(root, "r", "a")
    assert drain.undrain(root, check=True) is not None and drain.read(root) is not None


def test_an_unreadable_record_still_drains_the_node_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    root.mkdir()
    (root / drain.DRAINED).write_text("{half")
    found = drain.read(str(root))
    assert found is not None and "cannot be read" in found.reason and "undrain" in found.reason
    (root / drain.DRAINED).write_text("[1]")
    found = drain.read(str(root))
    assert found is not None and "holds no record" in found.reason
    assert drain.undrain(str(root)) is not None and drain.read(str(root)) is None


def _hammer(root: str, number: int) -> None:
    for index in range(30):
        drain.drain(root, f"writer {number} pass {index} " + "x" * 2000, f"w{number}")


def test_concurrent_writers_never_leave_half_a_record(tmp_path: Path) -> None:
    root = str(tmp_path / "jobs")
    drain.drain(root, "first", "w")
    writers = [multiprocessing.Process(target=_hammer, args=(root, number)) for number in range(3)]
    for writer in writers:
        writer.start()
    seen = 0
    while any(writer.is_alive() for writer in writers):
        text = (tmp_path / "jobs" / drain.DRAINED).read_text()
        record = json.loads(text)  # never a half-written file
        assert record["reason"].startswith(("first", "writer"))
        seen += 1
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    assert seen > 0
    assert sorted(path.name for path in (tmp_path / "jobs").iterdir()) == sorted(
        [drain.DRAINED, drain.NODE_LOCK]
    )


# --- the command ---


def test_the_command_drains_shows_and_undrains_in_one_json_line(tmp_path: Path) -> None:
    root = str(tmp_path / "jobs")
    rc, answer = run_cli("--jobs-dir", root, "--show")
    assert rc == 0 and answer["drained"] is None
    rc, answer = run_cli("--jobs-dir", root, "--drain", "--reason", "ECC errors", "--by", "ops", "--check")
    assert rc == 0 and answer["changed"] is False and answer["drained"]["reason"] == "ECC errors"
    assert drain.read(root) is None
    rc, answer = run_cli("--jobs-dir", root, "--drain", "--reason", "ECC errors", "--by", "ops")
    assert rc == 0 and answer["changed"] is True and answer["was"] is None
    assert answer["drained"]["by"] == "ops"
    rc, answer = run_cli("--jobs-dir", root, "--show")
    assert answer["drained"]["reason"] == "ECC errors"
    rc, answer = run_cli("--jobs-dir", root, "--undrain")
    assert rc == 0 and answer["changed"] is True and answer["was"]["reason"] == "ECC errors"
    rc, answer = run_cli("--jobs-dir", root, "--undrain")
    assert rc == 0 and answer["changed"] is False and answer["was"] is None


def test_the_command_refuses_a_drain_without_a_reason(tmp_path: Path) -> None:
    rc, answer = run_cli("--jobs-dir", str(tmp_path / "jobs"), "--drain", "--by", "ops")
    assert rc == 1 and "needs a reason" in answer["error"]
    assert drain.read(str(tmp_path / "jobs")) is None


def test_the_command_line_quotes_what_it_is_given() -> None:
    line = drain.command("/w/jobs", "drain", reason="it's bad; rm -rf /", by="a b")
    argv = shlex.split(line.split(" && ", 1)[1])
    assert argv[:3] == ["python", "-m", drain.MODULE]
    assert argv[argv.index("--reason") + 1] == "it's bad; rm -rf /" and argv[argv.index("--by") + 1] == "a b"
    assert line.startswith(f". {node_jobs.NODE_ENV} && ")


# --- over the mesh ---


class Mesh(remote.Mesh):
    """Stand-in for the mesh: node N's jobs' directory is ``folders[N]``; a command on another node runs the
    node's own drain or jobs command here, on its folder. ``down``: nodes that do not answer."""

    def __init__(self, me: str, folders: dict[str, Path], down: tuple[str, ...] = ()) -> None:
        super().__init__(me)
        self.folders = folders
        self.down = down
        self.asked: list[tuple[str, list[str]]] = []

    def run(self, node: str, command: str) -> str:
        argv = shlex.split(command.split(" && ", 1)[1])
        self.asked.append((node, argv))
        if node in self.down:
            return ""
        argv[argv.index("--jobs-dir") + 1] = str(self.folders[node])
        main = {drain.MODULE: drain.main, node_jobs.MODULE: jobs.main}[argv[2]]
        with PRINTING, contextlib.redirect_stdout(io.StringIO()) as out:
            main(argv[3:])
        return out.getvalue()


def folders_of(tmp_path: Path, *nodes: str) -> dict[str, Path]:
    return {node: tmp_path / node / "jobs" for node in nodes}


def test_drain_remote_drains_another_node_over_the_mesh(tmp_path: Path) -> None:
    folders = folders_of(tmp_path, "n0", "n1", "n2")
    mesh = Mesh("n0", folders, down=("n2",))
    reason = "device-fault: n1 device 3: ECC uncorrectable 2 (job J1)"
    assert drain.drain_remote(mesh, "n1", str(folders["n0"]), reason, "supervisor of J1") is True
    found = drain.read(str(folders["n1"]))
    assert found is not None and found.reason == reason and found.by == "supervisor of J1"
    assert drain.read(str(folders["n0"])) is None
    assert drain.drain_remote(mesh, "n2", str(folders["n0"]), reason, "s") is False  # it did not answer
    assert drain.drain_remote(mesh, "n0", str(folders["n0"]), reason, "s") is True  # here, no ssh
    assert [node for node, _ in mesh.asked] == ["n1", "n2"]
    assert drain.drain_remote(mesh, "n1", str(folders["n0"]), " ", "s") is False  # no reason


def test_show_asks_every_node_at_once_and_names_those_that_did_not_answer(tmp_path: Path) -> None:
    folders = folders_of(tmp_path, "n0", "n1", "n2", "n3")
    drain.drain(str(folders["n2"]), "slow link", "ops")
    drain.drain(str(folders["n0"]), "here", "ops")
    mesh = Mesh("n0", folders, down=("n3",))
    with ThreadPoolExecutor(max_workers=4) as pool:
        drained, unknown = drain.show_on(mesh, ["n0", "n1", "n2", "n3"], str(folders["n0"]), pool)
    assert sorted(drained) == ["n0", "n2"] and drained["n2"]["reason"] == "slow link"
    assert unknown == ["n3"]


def test_undrain_over_the_mesh_of_a_node_not_drained_says_so(tmp_path: Path) -> None:
    folders = folders_of(tmp_path, "n0", "n1")
    mesh = Mesh("n0", folders)
    answer = drain.undrain_on(mesh, "n1", str(folders["n0"]))
    assert answer["changed"] is False and answer["was"] is None and "error" not in answer


# --- the health gate's verdict ---


def verdict(rows: list[tuple[str, str]], problems: list[str], passed: bool = False) -> dict[str, Any]:
    return {
        "verdict": {
            "passed": passed,
            "problems": problems,
            "node_figures": [
                {"node": node, "device": 0, "slow": said == "slow", "verdict": said} for node, said in rows
            ],
        }
    }


def test_the_gate_drains_the_nodes_it_names_slow_with_their_problem_line() -> None:
    line = "node n1 is slow: its best pair reached 0.100 GB/s busbw, below 0.5 x the median node (2.000 GB/s)"
    health = verdict([("n0", "ok"), ("n1", "slow"), ("n2", "ok")], ["FOO differs: ...", line])
    assert drain.gate_drains(health) == {"n1": line}


def test_the_gate_drains_nothing_when_it_passed_or_names_no_node() -> None:
    assert drain.gate_drains(verdict([("n0", "ok"), ("n1", "ok")], [], passed=True)) == {}
    assert drain.gate_drains(verdict([("n0", "ok"), ("n1", "ok")], ["FOO differs"])) == {}
    assert drain.gate_drains({}) == {}
    # every unit below the floor: the fabric, not a node
    fabric = verdict([("n0", "slow"), ("n1", "slow"), ("n2", "slow")], ["every pair is below the floor"])
    assert drain.gate_drains(fabric) == {}
    # a healthy unit between slow ones, and either end of a slow link of two nodes: undetermined
    mixed = verdict(
        [("n0", "ok"), ("n1", "undetermined"), ("n2", "slow"), ("n3", "ok")],
        ["node n1 could not be judged: ...", "node n2 is slow: ..."],
    )
    assert drain.gate_drains(mixed) == {"n2": "node n2 is slow: ..."}
    two = verdict([("n0", "undetermined"), ("n1", "undetermined")], ["the link n0 <-> n1 is slow: ..."])
    assert drain.gate_drains(two) == {}


def test_a_node_with_slow_devices_is_drained_naming_each() -> None:
    health = {
        "verdict": {
            "passed": False,
            "problems": [
                "node n1 device 2 is slow: a",
                "node n1 device 5 is slow: b",
                "node n10 device 1 is slow: c",
            ],
            "node_figures": [
                {"node": "n1", "device": 2, "verdict": "slow"},
                {"node": "n1", "device": 5, "verdict": "slow"},
                {"node": "n1", "device": 0, "verdict": "ok"},
                {"node": "n0", "device": 2, "verdict": "ok"},
            ],
        }
    }
    assert drain.gate_drains(health) == {"n1": "node n1 device 2 is slow: a; node n1 device 5 is slow: b"}


def test_drain_gate_reads_the_gates_verdict_and_drains_over_the_mesh(tmp_path: Path) -> None:
    folders = folders_of(tmp_path, "n0", "n1", "n2")
    job_dir = folders["n0"] / "G1"
    (job_dir / "output").mkdir(parents=True)
    line = "node n2 is slow: its best pair reached 0.1 GB/s busbw"
    health = verdict([("n0", "ok"), ("n1", "ok"), ("n2", "slow")], [line])
    (job_dir / "output" / "health.json").write_text(json.dumps(health))
    mesh = Mesh("n0", folders)
    assert drain.drain_gate(mesh, job_dir, str(folders["n0"]), "G1", "ops", check=True) == [
        f"would drain: n2 (health gate G1: {line})"
    ]
    assert drain.read(str(folders["n2"])) is None
    lines = drain.drain_gate(mesh, job_dir, str(folders["n0"]), "G1", "ops")
    assert lines == [f"drained: n2 (health gate G1: {line})"]
    found = drain.read(str(folders["n2"]))
    assert found is not None and found.reason == f"health gate G1: {line}"
    assert drain.read(str(folders["n1"])) is None
    assert drain.drain_gate(mesh, folders["n0"] / "none", str(folders["n0"]), "G2", "ops") == []
    down = Mesh("n0", folders, down=("n2",))
    assert drain.drain_gate(down, job_dir, str(folders["n0"]), "G1", "ops")[0].startswith("not drained: n2")


# --- who reads the record ---


def test_the_nodes_report_carries_its_drain_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "processes", lambda jobs_dir: {})
    root = str(tmp_path / "jobs")
    assert jobs.node_report(root)["drained"] is None
    made, _ = drain.drain(root, "bad fan", "ops")
    assert jobs.node_report(root)["drained"] == made.to_dict()


def test_a_drained_node_takes_no_new_claim_but_its_own_job_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs, "processes", lambda jobs_dir: {})
    root = str(tmp_path / "jobs")
    assert jobs.claim(root, "J1", ["n0"]) is None
    made, _ = drain.drain(root, "bad fan", "ops")
    assert jobs.claim(root, "J1") is None  # the running job renews its claim: a drain does not stop it
    jobs.release(root, "J1")
    refused = jobs.claim(root, "J2", ["n0"])
    assert refused == made
    answer = jobs.claim_one(remote.Mesh("n0"), "n0", "J2", root, ["n0"])
    assert answer["claimed"] is False and answer["drained"]["reason"] == "bad fan"
    drain.undrain(root)
    assert jobs.claim(root, "J2") is None


def test_a_start_that_claims_a_drained_node_is_refused_naming_it_and_the_undrain() -> None:
    answer = {"claimed": False, "node": "n1", "job": "", "nodes": [], "drained": {"reason": "bad fan"}}
    claimed, why = node_jobs.parse_claim(json.dumps(answer))
    assert claimed is False
    assert "n1 is drained" in why and "bad fan" in why and "jobs.yml -e undrain=n1" in why


def test_the_jobs_table_shows_each_drained_node_with_when_who_and_why() -> None:
    record = {"node": "n1", "reason": "bad fan", "since": "2026-11-26T10:00:00Z", "by": "ops@ctl"}
    reports: dict[str, Any] = {
        "n0": {"busy": [], "jobs": {}, "drained": None},
        "n1": {"busy": [], "jobs": {}, "drained": record},
        "n2": {"busy": ["J1"], "jobs": {"J1": {"nodes": ["n2"]}}, "drained": dict(record, node="n2")},
    }
    lines = node_jobs.table(reports, {"n3": "its container does not answer"})
    assert "n0: free" in lines
    assert "n1: drained since 2026-11-26T10:00:00Z by ops@ctl: bad fan" in lines and "n1: free" not in lines
    # a drained node that runs a job: busy with it (the job goes on), and drained
    assert "n2: busy: J1" in lines and "n2: drained since 2026-11-26T10:00:00Z by ops@ctl: bad fan" in lines
    assert [line for line in lines if line.startswith("n3")] == ["n3: down (its container does not answer)"]


def drain_output(answer: dict[str, Any], busy: list[str]) -> str:
    return f"{json.dumps(answer)}\n{json.dumps({'busy': busy, 'jobs': {}})}\n"


def test_what_the_user_reads_after_a_drain_or_an_undrain() -> None:
    record = {"node": "n1", "reason": "bad fan", "since": "T1", "by": "ops"}
    older = dict(record, reason="slow", since="T0")
    drained = node_jobs.drain_result(
        "n1", False, False, drain_output({"drained": record, "was": None, "changed": True}, ["J7"]), 0
    )
    assert drained["changed"] is True and drained["msg"].startswith("n1 drained: bad fan. It runs job J7:")
    assert "the job goes on" in drained["msg"]
    again = node_jobs.drain_result("n1", False, False, drain_output({"drained": record, "was": older}, []), 0)
    assert "(it was drained since T0 by ops: slow" in again["msg"] and "undrain=n1" in again["msg"]
    same = node_jobs.drain_result("n1", False, False, drain_output({"drained": record, "was": record}, []), 0)
    assert same["changed"] is False and "already: nothing changed" in same["msg"]
    check = node_jobs.drain_result("n1", False, True, drain_output({"drained": record, "was": None}, []), 0)
    assert check["changed"] is False and check["msg"].startswith("n1 would be drained: bad fan")
    gone = drain_output({"drained": None, "was": record}, [])
    undrained = node_jobs.drain_result("n1", True, False, gone, 0)
    assert (
        undrained["changed"] is True
        and "n1 undrained (it was drained since T1 by ops: bad fan)" in (undrained["msg"])
    )
    nothing = drain_output({"drained": None, "was": None}, [])
    not_drained = node_jobs.drain_result("n1", True, False, nothing, 0)
    assert not_drained == {"changed": False, "msg": "n1 is not drained: nothing to undrain"}
    error = '{"node": "n1", "error": "a drain needs a reason"}'
    refused = node_jobs.drain_result("n1", False, False, error, 1)
    assert refused == {"failed": True, "msg": "n1: a drain needs a reason"}
    down = node_jobs.drain_result("n1", False, False, "Error: No such container: n1\n", 1)
    assert (
        down["failed"] is True
        and "did not answer the drain" in down["msg"]
        and "No such container" in (down["msg"])
    )


# --- a restart's spares ---


class SpareMesh(Mesh):
    def probe(self, node: str) -> str:
        return "down" if node in self.down else "up"


def test_a_restart_passes_over_a_drained_spare_and_takes_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs, "processes", lambda jobs_dir: {})
    folders = folders_of(tmp_path, "n0", "n1", "s0", "s1")
    drain.drain(str(folders["s0"]), "bad fan", "ops")
    mesh = SpareMesh("n0", folders)
    supervisor: Any = SimpleNamespace(
        mesh=mesh, spec=SimpleNamespace(job_dir=str(folders["n0"] / "J1"), id="J1"), nodes=["n0", "n1"]
    )
    passed: list[str] = []
    assert recovery.spare_free(supervisor, "s0", passed) is False and passed == ["s0"]
    assert jobs.read_claim(str(folders["s0"])) is None  # the drained spare was not claimed
    assert recovery.spare_free(supervisor, "s1", passed) is True and passed == ["s0"]
    claimed = jobs.read_claim(str(folders["s1"]))
    assert claimed is not None and claimed.job == "J1"


# --- the controller's side (the ddp_jobs_drain action's logic), through a stand-in transport ---


class Server:
    """A node's server: answers ``output`` (or does not answer at all) and keeps the commands."""

    def __init__(self, output: str = "", rc: int = 0, unreachable: bool = False) -> None:
        self.output, self.rc, self.unreachable = output, rc, unreachable
        self.commands: list[str] = []

    def run(self, command: str) -> Done:
        self.commands.append(command)
        if self.unreachable:
            raise Unreachable("ssh: connect to host s0 port 22: Connection refused")
        return Done(self.rc, self.output, "")

    def put(self, local: str) -> str:
        raise AssertionError("nothing is copied")

    def close(self) -> None:
        pass


def test_the_controller_drains_in_the_nodes_container_and_says_what_it_did() -> None:
    record = {"node": "n1", "reason": "bad fan", "since": "T1", "by": "ops"}
    server = Server(drain_output({"drained": record, "was": None, "changed": True}, []))
    said: list[str] = []
    result = node_jobs.drain_node(
        server, "n1", "/workspace/jobs", False, "bad fan", "ops", False, said.append
    )
    assert result["changed"] is True and said == [result["msg"]]
    (command,) = server.commands
    inner = shlex.split(command)[-1]
    assert command.startswith("docker exec n1 /bin/bash -c ") and "--drain --reason 'bad fan'" in inner
    assert f"python -m {node_jobs.MODULE}" in inner  # then the node's report: is a job running there?
    down = node_jobs.drain_node(Server(unreachable=True), "n1", "/w", True, "", "ops", False, said.append)
    assert down["unreachable"] is True and "Connection refused" in down["msg"]


def test_the_plan_reads_every_nodes_record_through_one_node() -> None:
    record = {"node": "n1", "reason": "bad fan", "since": "T1", "by": "ops"}
    server = Server(json.dumps({"drained": {"n1": record}, "unknown": ["n2"]}) + "\n")
    warned: list[str] = []
    read = node_jobs.read_drained(server, "n0", "/workspace/jobs", ["n0", "n1", "n2"], warned.append)
    assert read["drained"] == {"n1": record} and read["unknown"] == ["n2"] and warned == []
    (command,) = server.commands
    assert command.startswith("docker exec n0 ") and "--show --nodes n0,n1,n2" in command
    failed = node_jobs.read_drained(Server("boom", rc=1), "n0", "/w", ["n0"], warned.append)
    assert "drained" not in failed and "could not be read through n0: boom" in warned[-1]
    gone = node_jobs.read_drained(Server(unreachable=True), "n0", "/w", ["n0"], warned.append)
    assert "drained" not in gone and "Connection refused" in warned[-1]


def test_after_a_gate_the_controller_says_which_nodes_were_drained() -> None:
    line = "drained: n2 (health gate G1: node n2 is slow: ...)"
    server = Server(json.dumps({"lines": [line], "changed": True}) + "\n")
    said: list[str] = []
    warned: list[str] = []
    plan = {"id": "G1", "job_dir": "/workspace/jobs/G1"}
    result = node_jobs.drain_after_gate(server, plan, "n0", "ops", False, said.append, warned.append)
    assert result == {"changed": True, "lines": [line]} and said == [line] and warned == []
    assert "--gate G1" in server.commands[0] and "--jobs-dir /workspace/jobs" in server.commands[0]
    quiet = node_jobs.drain_after_gate(Server("oops"), plan, "n0", "ops", False, said.append, warned.append)
    assert quiet == {"changed": False, "lines": []} and "gave no answer" in warned[-1]


def test_a_drain_and_an_undrain_are_slurms_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\n")
    asked: list[list[str]] = []

    def run(argv: list[str], **_: Any) -> Any:
        asked.append(argv)
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(queue.subprocess, "run", run)
    monkeypatch.setattr(drain, "SLURM_CONF", str(conf))
    monkeypatch.setattr(drain.socket, "gethostname", lambda: "node1")
    drain.drain(str(tmp_path), "bad fan", "alice@ctl")
    assert asked[-1] == [
        "scontrol", "update", "nodename=node1", "state=drain", "reason=bad fan (by alice@ctl)"
    ]  # fmt: skip
    drain.undrain(str(tmp_path))
    assert asked[-1] == ["scontrol", "update", "nodename=node1", "state=resume"]
    drain.undrain(str(tmp_path))  # not drained: nothing asked of Slurm
    drain.drain(str(tmp_path), "x", "a", check=True)
    assert len(asked) == 2
    conf.unlink()  # no Slurm on this node: nothing asked
    drain.drain(str(tmp_path), "bad fan", "alice@ctl")
    assert len(asked) == 2
