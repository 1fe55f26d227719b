"""ddp_cluster.job.plan: the request and the inventory's records to a JobSpec, its paths and files; every
refusal names the variable a user sets. The launcher's command line is checked through the plan, as train.yml
makes it."""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_cluster import accelerators
from ddp_cluster.job import control, plan
from ddp_cluster.job import spec as job
from ddp_cluster.job.plan import Inventory, PlanError
from ddp_cluster.runtime import checkpoint_names

REPO = Path(__file__).resolve().parents[2]
SPECS = yaml.safe_load((REPO / "roles" / "ddp_job" / "meta" / "argument_specs.yml").read_text())
OPTIONS = SPECS["argument_specs"]["main"]["options"]
JOB_DIR = "/workspace/jobs/j1"
NPU_PLAN = {
    "product": "atlas-training",
    "netmask": "255.255.255.0",
    "servers": [
        {
            "host": "s0",
            "host_ip": "10.0.0.10",
            "device_ips": [f"192.168.10{d % 4}.{101 + d // 4}" for d in range(8)],
        },
        {
            "host": "s1",
            "host_ip": "10.0.0.11",
            "device_ips": [f"192.168.10{d % 4}.{111 + d // 4}" for d in range(8)],
        },
    ],
}


def request(**changes: Any) -> dict[str, Any]:
    """The role's variables as its defaults resolve them for `train.yml -e nodes=2`."""
    base: dict[str, Any] = {
        "nodes": "2",
        "launcher": "mpirun",
        "device": "cpu",
        "hccl_init": "rank_table",
        "script": "",
        "workdir": "",
        "workdir_max_mb": 64,
        "script_args": "--epochs 2",
        "resume": False,
        "resume_from": "",
        "timeout": "3600",
        "id": "j1",
        "nproc_per_node": 2,
        "master_port": 29501,
        "launcher_ports": "",
        "runs_dir": "runs",
        "env": {},
        "mpirun_args": [],
        "preflight": False,
        "kind": "train",
        "health_fraction": 0.5,
        "health_floor_gbps": 0,
        "health_min_bytes": 4096,
        "health_max_bytes": 65536,
        "health_factor": 4,
        "health_seconds_per_size": 0.2,
        "health_ignore": [],
        "health_timeout": 300,
        "poll": 0.5,
        "collect_timeout": 10,
    }
    return base | changes


def records(*nodes: str, **changes: Any) -> dict[str, Any]:
    return {
        node: {
            "interface": "eth0",
            "address": f"172.30.99.{10 + index}/24",
            "workspace": f"/var/lib/ddp-cluster/{node}/workspace",
            "container_workspace": "/workspace",
            "cpu_binding": "",
        }
        | changes
        for index, node in enumerate(nodes)
    }


def inventory(tmp_path: Path, nodes: tuple[str, ...] = ("s0", "s1"), **changes: Any) -> Inventory:
    fields: dict[str, Any] = {
        "nodes": nodes,
        "accelerator": "cpu",
        "records": records(*nodes),
        "cwd": str(tmp_path),
    }
    return Inventory(**(fields | changes))


def make(tmp_path: Path, inv: Inventory | None = None, **changes: Any) -> plan.Plan:
    return plan.make_plan(request(**changes), OPTIONS, inv or inventory(tmp_path))


def refused(tmp_path: Path, inv: Inventory | None = None, **changes: Any) -> str:
    with pytest.raises(PlanError) as error:
        make(tmp_path, inv, **changes)
    return str(error.value)


def exported(spec: job.JobSpec) -> dict[str, str]:
    """What the launcher exports to every rank: the names its command line holds (-x NAME, never a value),
    with their values in its environment (the spec's variables)."""
    argv = spec.launch_argv()
    names = [argv[i + 1] for i, part in enumerate(argv) if part == "-x"]
    assert not [name for name in names if "=" in name], "a value on mpirun's command line"
    return {name: spec.variables()[name] for name in names if name in spec.variables()}


def mca(argv: list[str], name: str) -> str:
    return next(argv[i + 2] for i, part in enumerate(argv) if part == "--mca" and argv[i + 1] == name)


# --- the request, as a user types it ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"nodes": ""}, "nodes is required: run train.yml -e nodes=N"),
        ({"nodes": "0"}, "nodes=0 is not a whole number of 1 or more"),
        ({"nodes": "-1"}, "nodes=-1 is not a whole number of 1 or more"),
        ({"nodes": "two"}, "nodes=two is not a whole number of 1 or more"),
        ({"nodes": "3"}, "nodes=3 is more than the 2 nodes of the inventory (nodes: s0, s1)"),
        ({"launcher": "horovodrun"}, "launcher=horovodrun must be mpirun, torchrun or torch_npu_run"),
        (
            {"launcher": "torch_npu_run"},
            "launcher=torch_npu_run needs torch_npu: it is for npu clusters (this one is cpu)",
        ),
        ({"device": "gpu"}, "device=gpu must be cpu, cuda or npu"),
        ({"hccl_init": "table"}, "cluster_hccl_init=table must be rank_table or master_addr"),
        ({"timeout": "soon"}, "job_timeout=soon must be a whole number of seconds above 0"),
        ({"resume": "maybe"}, "resume=maybe must be true or false"),
        ({"id": "a/b"}, "job_id='a/b' is not a job id: a job id is letters, digits, _ . and -"),
        (
            {"script": "/nonexistent/train.py"},
            "script=/nonexistent/train.py does not exist on the controller",
        ),
        ({"workdir": "proj"}, "workdir=proj needs the script to run in it: add -e script=PATH"),
        ({"health_fraction": 2}, "ddp_job_health_fraction=2 must be a number above 0 and at most 1"),
        (
            {"health_max_bytes": 1024},
            "ddp_job_health_max_bytes=1024 must be at least ddp_job_health_min_bytes=4096",
        ),
        ({"health_factor": "x"}, "ddp_job_health_factor=x must be a whole number"),
        ({"mpirun_args": "--oversubscribe"}, "ddp_job_mpirun_args must be a list"),
        ({"nproc_per_node": "many"}, "nproc_per_node='many' must be a whole number"),
        ({"results_max_gb": -1}, "results_max_gb=-1 must be above 0"),
        ({"results_max_gb": 0}, "results_max_gb=0 must be above 0"),
        ({"stop_grace": 0}, "stop_grace=0 must be"),
        ({"stop_grace": 60}, "stop_grace=60 must be"),
    ],
)
def test_a_bad_request_is_refused_naming_what_the_user_sets(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    assert message in refused(tmp_path, **changes)
    assert not (tmp_path / "runs").exists()


def test_every_problem_is_named_at_once(tmp_path: Path) -> None:
    said = refused(tmp_path, launcher="horovodrun", device="gpu", timeout="soon")
    assert said.count(";") == 2 and said.endswith(".")


def test_a_job_planned_for_the_first_n_nodes_from_their_records(tmp_path: Path) -> None:
    inv = inventory(tmp_path, ("s0", "s1", "s2"), records={**records("s0", "s1"), "s2": {"address": ""}})
    made = make(tmp_path, inv, nodes="2", script_args="--epochs 2 --label 'a b'")
    spec = made.spec
    assert (spec.id, spec.nodes, spec.world_size, spec.job_dir) == ("j1", ("s0", "s1"), 4, JOB_DIR)
    assert spec.networks == ("172.30.99.0/24",) and spec.script_args == ("--epochs", "2", "--label", "a b")
    assert made.run_dir == str(tmp_path / "runs" / "j1")
    assert made.host_dirs == {
        "s0": "/var/lib/ddp-cluster/s0/workspace/jobs/j1",
        "s1": "/var/lib/ddp-cluster/s1/workspace/jobs/j1",
    }
    assert made.first == "s0" and made.lines()[0].startswith(
        "job j1: mpirun on s0, s1, 2 process(es) per node"
    )


def test_a_node_site_yml_has_not_recorded_or_without_an_address_is_named_with_the_fix(tmp_path: Path) -> None:
    missing = refused(tmp_path, inventory(tmp_path, records=records("s0")))
    assert "s1: site.yml has not recorded this node" in missing and "ansible-playbook site.yml" in missing
    bare = refused(
        tmp_path,
        inventory(tmp_path, records={**records("s0"), "s1": {"interface": "eth9", "workspace": "/w"}}),
    )
    assert (
        "s1: its cluster interface eth9 had no IPv4 address" in bare and "cluster_network_interface" in bare
    )


def test_the_records_are_read_from_one_file_per_node(tmp_path: Path) -> None:
    for node, data in records("s0", "s1").items():
        (tmp_path / f"{node}.json").write_text(json.dumps(data))
    assert plan.read_records(tmp_path) == records("s0", "s1")
    (tmp_path / "s2.json").write_text("{")
    with pytest.raises(PlanError, match=r"s2\.json cannot be read"):
        plan.read_records(tmp_path)


def test_each_nodes_network_and_binding_come_from_its_record(tmp_path: Path) -> None:
    recorded = records("s0", "s1")
    recorded["s1"] |= {"address": "10.1.2.3/16", "cpu_binding": "0=0-23;1=24-47"}
    made = make(tmp_path, inventory(tmp_path, records=recorded))
    assert made.spec.networks == ("172.30.99.0/24", "10.1.0.0/16")
    argv = made.spec.launch_argv()
    assert mca(argv, "btl_tcp_if_include") == mca(argv, "oob_tcp_if_include") == "172.30.99.0/24,10.1.0.0/16"
    assert made.lines()[2].endswith(
        "(cluster_cpu_binding numa; device=CPUs): s0 (unbound); s1 0=0-23;1=24-47"
    )


def test_a_job_id_is_made_from_the_time_and_kept_for_the_job_after_its_gate(tmp_path: Path) -> None:
    now = time.mktime((2026, 11, 24, 10, 0, 0, 0, 0, -1)) - time.timezone
    gate = make(tmp_path, inventory(tmp_path, now=now), id="", kind="preflight")
    assert gate.base_id.startswith("20261124-100000-") and gate.spec.id == gate.base_id + "-preflight"
    assert (
        gate.run_dir.endswith(f"runs/{gate.base_id}/preflight")
        and gate.spec.program()[1] == "ddp_cluster.gate"
    )
    after = inventory(tmp_path, previous=gate.to_dict(), gate_passed=gate.spec.id)
    job_plan = make(tmp_path, after, id="", preflight=True)
    assert job_plan.spec.id == gate.base_id and job_plan.preflight


def test_preflight_asked_where_no_gate_ran_starts_nothing(tmp_path: Path) -> None:
    assert "preflight=true but no health gate ran for job j1: pass it on the command line" in refused(
        tmp_path, preflight="true"
    )


def test_a_script_is_shipped_by_its_file_name_and_run_through_ddp_cluster_run(tmp_path: Path) -> None:
    (tmp_path / "train_me.py").write_text("print('hi')\n")
    for launcher in ("mpirun", "torchrun"):
        made = make(tmp_path, script="train_me.py", launcher=launcher)
        argv = made.spec.launch_argv()
        assert argv[argv.index("ddp_cluster.run") - 1 :] == [
            "-m",
            "ddp_cluster.run",
            f"{JOB_DIR}/train_me.py",
            "--epochs",
            "2",
        ]
        assert argv[argv.index("--wdir") + 1] == JOB_DIR and made.script == str(tmp_path / "train_me.py")


def test_a_project_is_packed_once_checked_and_is_the_ranks_working_directory(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    (project / "src" / "train.py").write_text("print('hi')\n")
    made = make(
        tmp_path, workdir="proj", script="src/train.py", launcher="torchrun", kind="preflight", id="p1"
    )
    archive = tmp_path / "runs" / "p1" / plan.WORKDIR_ARCHIVE
    assert made.packed["files"] == 1 and not made.packed["reused"] and archive.is_file()
    assert not made.spec.workdir and made.spec.script == ""  # the gate runs no project
    packed_at = archive.stat().st_mtime_ns
    again = make(tmp_path, inventory(tmp_path, previous=made.to_dict(), gate_passed="p1-preflight"),
                 workdir="proj", script="src/train.py", id="p1", preflight=True)  # fmt: skip
    assert again.packed["reused"] and archive.stat().st_mtime_ns == packed_at
    argv = again.spec.launch_argv()
    assert argv[argv.index("--wdir") + 1] == "/workspace/jobs/p1/workdir"
    assert argv[argv.index("ddp_cluster.run") + 1] == "/workspace/jobs/p1/workdir/src/train.py"
    plan.write_files(again)
    with tarfile.open(again.bundle) as bundle:
        assert sorted(bundle.getnames()) == ["job.json", "workdir/src/train.py"]
    assert "as packed for its health gate" in again.lines()[0]
    assert "must be a path inside workdir=" in refused(tmp_path, workdir="proj", script="../x.py")


def a_run(runs: Path, job_id: str, cluster: str, *checkpoints: tuple[str, bytes]) -> list[Path]:
    """An earlier run on the controller: its plan.json (naming its cluster) and its fetched checkpoints."""
    (runs / job_id).mkdir(parents=True)
    (runs / job_id / "plan.json").write_text(json.dumps({"id": job_id, "cluster": cluster}))
    paths = []
    for relative, data in checkpoints:
        path = runs / job_id / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        paths.append(path)
    return paths


def ours(text: str) -> bytes:
    """A checkpoint as the package's entrypoint writes it: our header, then the payload."""
    return checkpoint_names.header(text.encode()) + text.encode()


def plain(text: str) -> bytes:
    """A checkpoint as a user's plain torch.save writes it: a zip archive."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", text.encode() * 50)
    return buffer.getvalue()


def test_resume_takes_the_newest_whole_checkpoint_by_progress_among_this_clusters_runs(
    tmp_path: Path,
) -> None:
    """Training progress (epoch, step from the name) orders the checkpoints, never mtime: a newer one cut
    short, or one from another cluster, is passed over; the plan names what it passed over and why."""
    runs, here = tmp_path / "runs", inventory(tmp_path, cluster="local")
    assert "resume=true but no earlier run of cluster 'local' under" in refused(tmp_path, here, resume=True)
    [old] = a_run(runs, "a", "local", ("checkpoints/epoch-00001.ckpt", ours("a1")))  # laid out before output/
    [good] = a_run(runs, "b", "local", ("output/checkpoints/epoch-00002.step-000000050.ckpt", ours("b2")))
    cut = ours("c3" * 40)[:-3]
    [truncated] = a_run(runs, "c", "local", ("output/checkpoints/epoch-00003.ckpt", cut))
    a_run(runs, "d", "sim", ("output/checkpoints/epoch-00009.ckpt", ours("d9")))  # another cluster's
    [future] = a_run(runs, "e", "local", ("output/checkpoints/epoch-00002.ckpt", ours("e2")))
    # a node's copy, newer, is not the run's checkpoint
    a_run(runs, "f", "local", ("nodes/n1/output/checkpoints/epoch-00008.ckpt", ours("f8")))
    for path in (old, good, truncated):
        os.utime(path, (1000, 1000))
    os.utime(future, (4e9, 4e9))  # written with a clock years ahead: decides nothing
    made = make(tmp_path, here, resume="true")
    assert made.resume_checkpoint == str(good) and made.spec.resume
    [passed] = made.resume_skipped
    assert passed.startswith(f"checkpoint {truncated} is truncated or padded")
    assert f"passed over newer checkpoint(s): {passed}" in "\n".join(made.lines())
    assert json.loads(json.dumps(made.to_dict()))["cluster"] == "local"  # what the next resume looks for
    # another cluster's run is taken only when named
    assert make(tmp_path, inventory(tmp_path, cluster="sim"), resume=True).resume_checkpoint.endswith(
        "d/output/checkpoints/epoch-00009.ckpt"
    )
    named = make(tmp_path, here, resume=True, resume_from="a")
    assert named.resume_checkpoint == str(old) and named.spec.resume
    assert "--resume" in named.spec.program()
    said = refused(tmp_path, here, resume=True, resume_from="c")
    assert (
        "resume=true but run c under" in said and f"passed over: checkpoint {truncated} is truncated" in said
    )


def test_resume_of_a_users_script_takes_its_plain_checkpoints_the_entrypoint_does_not(tmp_path: Path) -> None:
    runs, here = tmp_path / "runs", inventory(tmp_path, cluster="local")
    (tmp_path / "train.py").write_text("print('mine')\n")
    [entrypoints] = a_run(runs, "a", "local", ("output/checkpoints/epoch-00002.ckpt", ours("a2")))
    [users] = a_run(runs, "b", "local", ("output/checkpoints/epoch-00004.ckpt", plain("b4")))
    [cut] = a_run(runs, "c", "local", ("output/checkpoints/epoch-00005.ckpt", plain("c5")[:-30]))
    script = make(tmp_path, here, resume=True, script="train.py")
    assert script.resume_checkpoint == str(users)
    assert script.spec.resume_from == f"{script.spec.job_dir}/output/checkpoints/epoch-00004.ckpt"
    assert exported(script.spec)["DDP_RESUME_FROM"] == script.spec.resume_from
    assert script.resume_skipped[0].startswith(f"checkpoint {cut} is not a whole zip archive")
    entrypoint = make(tmp_path, here, resume=True)
    assert entrypoint.resume_checkpoint == str(entrypoints)
    assert "written by a user's script (no ddp_cluster header)" in entrypoint.resume_skipped[1]


def test_the_gate_runs_the_jobs_launcher_and_environment_with_its_own_settings(tmp_path: Path) -> None:
    for launcher in ("mpirun", "torchrun"):
        job_argv = make(tmp_path, launcher=launcher, env={"NCCL_DEBUG": "INFO"}).spec.launch_argv()
        gate = make(
            tmp_path, launcher=launcher, env={"NCCL_DEBUG": "INFO"}, kind="check", health_ignore=["torch"]
        )
        gate_argv = gate.spec.launch_argv()
        program = gate_argv[gate_argv.index("ddp_cluster.gate") - 1 :]
        assert program[:4] == ["-m", "ddp_cluster.gate", "--output-dir", f"{gate.spec.job_dir}/output"]
        assert program[-2:] == ["--ignore", "torch"] and "--max-bytes" in program
        assert (
            gate_argv[: gate_argv.index("ddp_cluster.gate") - 1]
            == job_argv[: job_argv.index("ddp_cluster.train") - 1]
        )
        assert gate.spec.timeout == 300 and exported(gate.spec)["NCCL_DEBUG"] == "INFO"


def test_an_npu_job_gets_its_own_rank_table_and_its_gate_the_ping_targets(tmp_path: Path) -> None:
    inv = inventory(tmp_path, accelerator="npu", npu_plan=NPU_PLAN, visible={"s0": "", "s1": "0,1,2,3"})
    made = make(tmp_path, inv, device="npu", nodes="2", nproc_per_node=2)
    table = json.loads(made.rank_table)
    assert table["server_count"] == "2" and table["server_list"][0]["server_id"] == "10.0.0.10"
    assert exported(made.spec)["RANK_TABLE_FILE"] == f"{JOB_DIR}/rank_table.json"
    gate = make(tmp_path, inv, device="npu", nproc_per_node=2, kind="check")
    assert [(t["device"], t["peer"], t["address"]) for t in gate.ping["s0"]] == [
        (0, "s1", "192.168.100.111"),
        (1, "s1", "192.168.101.111"),
    ]
    assert not made.ping and not make(tmp_path, inv, device="npu", hccl_init="master_addr").rank_table
    bad = inventory(tmp_path, accelerator="npu", npu_plan=NPU_PLAN, visible={"s0": "2,3,4,5", "s1": ""})
    assert "the job's rank table cannot be made" in refused(tmp_path, bad, device="npu", nproc_per_node=4)


def test_each_device_pings_its_counterpart_on_the_next_server() -> None:
    ips = {name: [f"192.168.10{d}.{n}" for d in range(3)] for n, name in enumerate("abc", start=1)}
    npu = {"servers": [{"host": name, "device_ips": addresses} for name, addresses in ips.items()]}
    targets = plan.ping_targets(npu, ["a", "b", "c"], 2, {"a": "", "b": "1,2", "c": ""})
    assert [(t["device"], t["peer"], t["peer_device"], t["address"]) for t in targets["a"]] == [
        (0, "b", 1, "192.168.101.2"),
        (1, "b", 2, "192.168.102.2"),
    ]
    assert [t["address"] for t in targets["c"]] == ["192.168.100.1", "192.168.101.1"]
    assert plan.ping_targets(npu, ["a"], 2, {}) == {"a": []}
    with pytest.raises(PlanError, match="b has no address for device 1 in the device-IP plan"):
        plan.ping_targets(
            {"servers": [{"host": "a", "device_ips": ["x"] * 3}, {"host": "b", "device_ips": ["y"]}]},
            ["a", "b"],
            3,
            {},
        )


def test_the_files_written_hold_the_spec_the_script_and_the_plan(tmp_path: Path) -> None:
    (tmp_path / "train_me.py").write_text("print('hi')\n")
    made = make(tmp_path, script="train_me.py")
    plan.write_files(made)
    with tarfile.open(made.bundle) as bundle:
        assert sorted(bundle.getnames()) == ["job.json", "train_me.py"]
        spec = job.JobSpec.from_dict(json.loads(bundle.extractfile("job.json").read()))  # type: ignore[union-attr]
    assert spec == made.spec
    assert job.JobSpec.from_dict(plan.load(Path(made.run_dir))["spec"]) == made.spec


def test_argument_specs_hold_the_jobspecs_choices() -> None:
    """argument_specs is the one type/choice check in YAML: its choices are the spec's."""
    assert OPTIONS["ddp_job_launcher"]["choices"] == list(job.LAUNCHERS)
    assert OPTIONS["ddp_job_device"]["choices"] == list(accelerators.DEVICE_BACKEND)
    assert OPTIONS["ddp_job_kind"]["choices"] == list(job.KINDS)
    assert OPTIONS["ddp_job_hccl_init"]["choices"] == list(job.HCCL_INITS)
    # Every field of the spec a user sets is an option of the role; the rest are the plan's own.
    derived = {"id", "job_dir", "nodes", "networks", "accelerator", "workdir", "resume"}
    derived |= {"spares", "recovery", "restart", "resume_from", "start_id"}  # the plan's and the supervisor's
    fields = set(job.JobSpec.__dataclass_fields__) - derived
    assert {f"ddp_job_{name}" for name in fields} <= set(OPTIONS), fields - {n[8:] for n in OPTIONS}
    assert {"ddp_job_id", "ddp_job_nodes", "ddp_job_workdir", "ddp_job_resume"} <= set(OPTIONS)


def test_what_the_request_leaves_out_takes_the_default_argument_specs_states(tmp_path: Path) -> None:
    cluster = {"nproc_per_node": 2, "device": "cpu", "hccl_init": "rank_table", "master_port": 29501}
    made = plan.make_plan({"nodes": "2", "id": "j1", **cluster}, OPTIONS, inventory(tmp_path))
    default = {name.removeprefix("ddp_job_"): spec.get("default") for name, spec in OPTIONS.items()}
    assert (made.spec.launcher, made.spec.timeout, made.spec.poll) == (
        default["launcher"],
        default["timeout"],
        default["poll"],
    )
    assert (made.collect_timeout, made.spec.max_restarts, made.run_dir) == (
        default["collect_timeout"],
        default["max_restarts"],
        str(tmp_path / default["runs_dir"] / "j1"),
    )


# --- a job id names one job ---


def test_a_job_id_whose_run_exists_is_refused_naming_it_and_nothing_is_written(tmp_path: Path) -> None:
    first = make(tmp_path)
    plan.write_files(first)
    run = tmp_path / "runs" / "j1"
    written = {path: path.stat().st_mtime_ns for path in run.rglob("*")}
    said = refused(tmp_path)
    assert f"job_id=j1 was used before: {run} holds its run, and a job id names one job" in said
    assert "Pick another job_id, or leave job_id out (a fresh one is made)" in said
    assert "-e attach=j1" in said and "-e resume=true -e resume_from=j1" in said
    assert {path: path.stat().st_mtime_ns for path in run.rglob("*")} == written
    for kind in ("preflight", "check"):  # a gate under a used id is refused before it runs
        assert "job_id=j1 was used before" in refused(tmp_path, kind=kind)
    # attach follows it without a plan of its own: the run is read, not refused
    assert control.attach_plan(tmp_path / "runs", "j1")["attach"] is True


def test_an_empty_run_directory_does_not_hold_the_id(tmp_path: Path) -> None:
    (tmp_path / "runs" / "j1").mkdir(parents=True)
    assert make(tmp_path).spec.id == "j1"
    (tmp_path / "runs" / "j1" / "notes.txt").write_text("mine")
    assert "job_id=j1 was used before" in refused(tmp_path)


def test_the_job_after_its_own_gate_shares_the_gates_id_and_no_other_job_does(tmp_path: Path) -> None:
    gate = make(tmp_path, kind="preflight", id="p1")
    plan.write_files(gate)
    assert (tmp_path / "runs" / "p1" / "preflight" / plan.PLAN_FILE).is_file()
    after = inventory(tmp_path, previous=gate.to_dict(), gate_passed="p1-preflight")
    assert make(tmp_path, after, id="p1", preflight=True).spec.id == "p1"
    other_gate = inventory(tmp_path, previous={**gate.to_dict(), "base_id": "p2"}, gate_passed="p2-preflight")
    assert "job_id=p1 was used before" in refused(tmp_path, other_gate, id="p1")
    assert "job_id=p1 was used before" in refused(tmp_path, id="p1")  # a later run: no gate of its own


# --- drained nodes: the first N undrained ---

DRAINED = {"reason": "bad fan", "since": "2026-11-26T10:00:00Z", "by": "ops@ctl"}


def test_the_plan_takes_the_first_undrained_nodes_and_says_which_it_skipped(tmp_path: Path) -> None:
    nodes = ("s0", "s1", "s2", "s3")
    inv = inventory(tmp_path, nodes, drained={"s0": DRAINED, "s3": DRAINED})
    made = make(tmp_path, inv, nodes="2")
    assert list(made.spec.nodes) == ["s1", "s2"] and made.first == "s1"
    assert dict(made.skipped) == {"s0": "drained since 2026-11-26T10:00:00Z by ops@ctl: bad fan"}
    line = next(line for line in made.lines() if "skipped" in line)
    assert "s0 (drained since 2026-11-26T10:00:00Z by ops@ctl: bad fan)" in line and "undrain=NODE" in line
    assert "s3" not in line  # beyond the job's nodes: not passed over
    assert make(tmp_path, inventory(tmp_path, nodes), nodes="2").skipped == {}


def test_the_spares_are_the_undrained_nodes_after_the_jobs(tmp_path: Path) -> None:
    nodes = ("s0", "s1", "s2", "s3", "s4")
    inv = inventory(tmp_path, nodes, drained={"s1": DRAINED, "s3": DRAINED})
    made = make(tmp_path, inv, nodes="2", max_restarts="1")
    assert list(made.spec.nodes) == ["s0", "s2"] and list(made.spec.spares) == ["s4"]


def test_too_few_undrained_nodes_is_refused_naming_the_drained_ones_and_the_undrain(tmp_path: Path) -> None:
    inv = inventory(tmp_path, ("s0", "s1", "s2"), drained={"s1": DRAINED})
    said = refused(tmp_path, inv, nodes="3")
    assert "nodes=3 but only 2 of the inventory's 3 nodes are undrained (s0, s2)" in said
    assert "s1 (drained since 2026-11-26T10:00:00Z by ops@ctl: bad fan)" in said
    assert "jobs.yml -e undrain=NODE" in said and "Nothing was started" in said
    assert not (tmp_path / "runs" / "j1").exists()


def test_nodes_whose_drain_state_is_unknown_are_named(tmp_path: Path) -> None:
    made = make(tmp_path, inventory(tmp_path, drain_unknown=("s1", "s9")))
    assert list(made.spec.nodes) == ["s0", "s1"]
    assert any("could not read whether s1 is drained" in line for line in made.lines())


def test_the_playbooks_fact_is_small_the_actions_read_the_whole_plan_from_its_file(tmp_path: Path) -> None:
    # Every task of the job templates the fact on every node: on many nodes the whole plan (the spec, its
    # environment, an npu rank table) would be templated thousands of times; the actions read plan.json once.
    nodes = tuple(f"s{index}" for index in range(40))
    made = make(tmp_path, inventory(tmp_path, nodes), nodes="32", nproc_per_node=8)
    plan.write_files(made)
    whole = made.to_dict()
    path = str(Path(made.run_dir, plan.PLAN_FILE))
    fact = plan.fact(whole, path)
    assert set(fact) == {*plan.FACT_KEYS, "detach", "check_each", "plan_path"}
    assert fact["nodes"] == list(nodes[:32]) and fact["first"] == "s0" and fact["run_dir"] == made.run_dir
    assert len(json.dumps(fact)) < len(json.dumps(whole)) / 3
    read = plan.whole(fact)
    assert read == {**json.loads(Path(path).read_text()), "plan_path": path}
    assert read["spec"] == whole["spec"] and read["host_dirs"] == whole["host_dirs"]
    # What a task sets on the fact for one call (train.yml's follow of the standby) stays over the file's.
    assert plan.whole({**fact, "attach": True, "follow": True})["follow"] is True
    assert plan.whole({**fact, "attach": True})["attach"] is True
    # A plan given whole (no file) is taken as it is; a file that is gone is an error the action names.
    assert plan.whole({"id": "j1", "first": "s0"}) == {"id": "j1", "first": "s0"}
    with pytest.raises(OSError):
        plan.whole({**fact, "plan_path": str(tmp_path / "gone.json")})


def test_a_plans_line_counts_many_nodes_and_names_a_few() -> None:
    assert plan.named(["s0", "s1"]) == "s0, s1"
    assert plan.named([f"s{index}" for index in range(1152)]) == "1152 nodes (s0, s1, ..., s1151)"


def test_in_check_mode_the_fact_names_a_plan_outside_runs(tmp_path: Path) -> None:
    made = make(tmp_path)
    whole = made.to_dict()
    checked = plan.made_fact(made, whole, check=True)
    try:
        assert not Path(made.run_dir).exists()  # check mode writes nothing under runs/
        assert plan.whole(checked)["spec"] == whole["spec"]
    finally:
        Path(checked["plan_path"]).unlink()
    assert plan.made_fact(made, whole, check=False)["plan_path"] == f"{made.run_dir}/{plan.PLAN_FILE}"
    attached = plan.attached_fact({"ansible_facts": {"_ddp_job_plan": {**whole, "attach": True}}})
    path = f"{made.run_dir}/{plan.PLAN_FILE}"
    assert attached["ansible_facts"]["_ddp_job_plan"] == plan.fact({**whole, "attach": True}, path)


NOT_CONVERGED = "unreachable in containers: Connection refused (site.yml, 2026-11-26T13:00:00Z)"


def test_a_node_site_yml_did_not_converge_is_passed_over_and_named(tmp_path: Path) -> None:
    nodes = ("s0", "s1", "s2", "s3")
    inv = inventory(tmp_path, nodes, unconverged={"s1": NOT_CONVERGED}, drained={"s0": DRAINED})
    made = make(tmp_path, inv, nodes="2", max_restarts="1")
    assert list(made.spec.nodes) == ["s2", "s3"] and list(made.spec.spares) == []
    said = "\n".join(made.lines())
    assert "skipped drained node(s): s0 (drained since" in said and "s1" not in said.split("skipped s1")[0]
    assert (
        "skipped s1 (not converged by the last site.yml: unreachable in containers: Connection refused"
        " (site.yml, 2026-11-26T13:00:00Z); run site.yml again for it)"
    ) in said


def test_an_unconverged_node_is_no_spare(tmp_path: Path) -> None:
    inv = inventory(tmp_path, ("s0", "s1", "s2"), unconverged={"s2": NOT_CONVERGED})
    made = make(tmp_path, inv, nodes="2", max_restarts="1")
    assert list(made.spec.nodes) == ["s0", "s1"] and list(made.spec.spares) == [] and made.skipped == {}


def test_too_few_converged_nodes_is_refused_naming_them_and_site_yml(tmp_path: Path) -> None:
    inv = inventory(tmp_path, ("s0", "s1"), unconverged={"s1": NOT_CONVERGED})
    said = refused(tmp_path, inv, nodes="2")
    assert (
        "nodes=2 but only 1 of the inventory's 2 undrained nodes were converged by the last site.yml (s0)"
    ) in said
    assert f"not converged: s1 ({NOT_CONVERGED}). Run site.yml again for them" in said
    assert "Nothing was started" in said
