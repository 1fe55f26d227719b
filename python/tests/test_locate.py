"""ddp_cluster.supervisor.locate: which node runs a job's supervisor, asked from any node through the mesh
(a stand-in mesh here: each node's status.json as text). No containers."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_cluster.job.status import Status
from ddp_cluster.supervisor import locate as locating
from ddp_cluster.supervisor.locate import JobNotFound, Located, locate, mesh_nodes
from ddp_cluster.supervisor.remote import Mesh


class FakeMesh(Mesh):
    """The other nodes' status.json of the job, as ``cat`` prints it ('' where there is none)."""

    def __init__(self, me: str, texts: dict[str, str]) -> None:
        super().__init__(me)
        self.texts = texts
        self.asked: list[str] = []

    def run(self, node: str, command: str) -> str:
        self.asked.append(node)
        assert "status.json" in command
        return self.texts.get(node, "")


def status_text(state: str, updated: float, nodes: list[str], supervisor: str = "") -> str:
    return Status(state=state, updated=updated, nodes=tuple(nodes), supervisor_node=supervisor).dumps()


def write_status(jobs_dir: Path, job: str, text: str) -> None:
    (jobs_dir / job).mkdir(parents=True, exist_ok=True)
    (jobs_dir / job / "status.json").write_text(text)


def test_the_job_s_supervisor_here_answers_without_asking_the_others(tmp_path: Path) -> None:
    write_status(tmp_path, "j1", status_text("running", 10.0, ["n0", "n1"], "n0"))
    mesh = FakeMesh("n0", {})
    assert locate("j1", str(tmp_path), mesh, ["n0", "n1", "n2"]) == Located("n0", ["n0", "n1"], True)
    assert mesh.asked == []


def test_a_job_elsewhere_is_found_on_the_node_that_holds_its_status(tmp_path: Path) -> None:
    mesh = FakeMesh("n0", {"n2": status_text("running", 10.0, ["n2", "n3"], "n2")})
    assert locate("j1", str(tmp_path), mesh, ["n0", "n1", "n2", "n3"]) == Located("n2", ["n2", "n3"], False)
    assert sorted(mesh.asked) == ["n1", "n2", "n3"]


def test_the_node_that_took_the_job_over_wins_over_the_old_first_node(tmp_path: Path) -> None:
    # n0 was the first node, lost and back: its status is stale; n1 took the job over and writes since.
    write_status(tmp_path, "j1", status_text("running", 10.0, ["n0", "n1"], "n0x"))
    mesh = FakeMesh("n0", {"n1": status_text("running", 50.0, ["n1", "n2"], "n1")})
    assert locate("j1", str(tmp_path), mesh, ["n0", "n1", "n2"]) == Located("n1", ["n1", "n2"], False)


def test_a_live_status_wins_over_an_ended_one_written_later(tmp_path: Path) -> None:
    mesh = FakeMesh(
        "n9",
        {
            "n0": status_text("failed", 90.0, ["n0", "n1"]),
            "n1": status_text("running", 50.0, ["n1", "n2"]),
        },
    )
    assert locate("j1", str(tmp_path), mesh, ["n0", "n1", "n2"]).first == "n1"


def test_an_ended_job_here_is_still_found_here_when_no_other_node_has_it(tmp_path: Path) -> None:
    write_status(tmp_path, "j1", status_text("succeeded", 10.0, ["n0", "n1"]))
    mesh = FakeMesh("n0", {})
    assert locate("j1", str(tmp_path), mesh, ["n0", "n1"]) == Located("n0", ["n0", "n1"], True)
    assert mesh.asked == ["n1"]


def test_torn_or_foreign_status_text_is_no_answer(tmp_path: Path) -> None:
    mesh = FakeMesh("n0", {"n1": '{"state": "runn', "n2": '{"state": 7}', "n3": "ssh: connect refused"})
    with pytest.raises(JobNotFound):
        locate("j1", str(tmp_path), mesh, ["n0", "n1", "n2", "n3"])


def test_no_node_with_the_job_says_where_to_look(tmp_path: Path) -> None:
    said = r"no node has job j1 \(asked 3 node\(s\) from n0\).*jobs.yml lists"
    with pytest.raises(JobNotFound, match=said):
        locate("j1", str(tmp_path), FakeMesh("n0", {}), ["n0", "n1", "n2"])


@pytest.mark.parametrize("job", ["", "../etc", "a b", "-rf", "j/1"])
def test_a_job_id_that_is_no_job_id_is_refused_before_anything_is_asked(tmp_path: Path, job: str) -> None:
    mesh = FakeMesh("n0", {})
    with pytest.raises(JobNotFound, match="is not a job id"):
        locate(job, str(tmp_path), mesh, ["n0", "n1"])
    assert mesh.asked == []


def test_the_mesh_s_nodes_come_from_its_ssh_configuration(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("# Managed by ddp-cluster\nHost node0 node1 node2\n    Port 2222\n    User root\n")
    assert mesh_nodes(config) == ["node0", "node1", "node2"]
    assert mesh_nodes(tmp_path / "absent") == []


def test_without_nodes_the_mesh_s_configuration_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host n0 n1\n")
    monkeypatch.setattr(locating, "MESH_CONFIG", config)
    mesh = FakeMesh("n0", {"n1": status_text("running", 1.0, ["n1"])})
    assert locate("j1", str(tmp_path), mesh).first == "n1"
    assert mesh.asked == ["n1"]
