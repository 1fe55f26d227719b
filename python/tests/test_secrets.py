"""A job's secrets (secret_env): names checked and values found on the controller before anything is written,
no value in the plan, the spec or mpirun's command line, the file every other node gets (0600 in a 0700
directory), the masking of what status.json quotes, and the ranks' wrapper that reads the file."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from test_plan import OPTIONS, inventory, request

from ddp_cluster.errors import DdpClusterError
from ddp_cluster.job import plan, secrets
from ddp_cluster.job.spec import JobSpec, JobSpecError
from ddp_cluster.runtime import secrets as rank_secrets
from ddp_cluster.supervisor.loop import STATUS_FILE, StatusFile, Supervisor
from ddp_cluster.supervisor.remote import Mesh

TOKEN = "tok-3f9a-secret-value"


# --- names and values ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("HF_TOKEN", ["HF_TOKEN"]),
        ("HF_TOKEN, WANDB_API_KEY,", ["HF_TOKEN", "WANDB_API_KEY"]),
        (["HF_TOKEN", "WANDB_API_KEY"], ["HF_TOKEN", "WANDB_API_KEY"]),
        ("", []),
        ([], []),
    ],
)
def test_secret_env_is_a_list_or_a_comma_string_of_names(value: Any, names: list[str]) -> None:
    assert secrets.parse_names(value) == (names, [])


def test_secret_env_of_another_form_is_refused() -> None:
    assert secrets.parse_names({"A": "b"})[1] == [
        "secret_env={'A': 'b'} must be names of variables, a list or a comma-separated string"
    ]


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("HF-TOKEN", "secret_env: 'HF-TOKEN' is not a variable name"),
        ("1TOKEN", "secret_env: '1TOKEN' is not a variable name"),
        ("X=1;cmd", "secret_env: 'X=1;cmd' is not a variable name"),
        ("MASTER_ADDR", "secret_env: MASTER_ADDR is set by the job's launcher"),
        ("RANK", "secret_env: RANK is set by the job's launcher"),
        ("DDP_JOB_DIR", "secret_env: DDP_JOB_DIR is set by the job's launcher"),
        ("OMPI_MCA_x", "secret_env: OMPI_MCA_x is set by the job's launcher"),
        ("NCCL_DEBUG", "secret_env: NCCL_DEBUG is also a key of ddp_job_env"),
    ],
)
def test_a_name_that_cannot_carry_a_secret_is_refused_naming_it(name: str, said: str) -> None:
    problems = secrets.name_problems([name], env={"NCCL_DEBUG": "INFO"})
    assert len(problems) == 1 and problems[0].startswith(said)


def test_a_name_given_twice_is_refused() -> None:
    assert secrets.name_problems(["A", "A"]) == ["secret_env names A twice"]


def test_a_value_the_controller_lacks_is_refused_naming_it() -> None:
    with pytest.raises(secrets.SecretError) as error:
        secrets.values(["SET", "UNSET", "EMPTY"], {"SET": "x", "EMPTY": ""})
    assert str(error.value).startswith(
        "secret_env names UNSET, EMPTY but the controller's environment has no value for them:"
        " export UNSET=..."
    )
    assert secrets.values(["SET"], {"SET": "x", "OTHER": "y"}) == {"SET": "x"}


def test_a_start_delivers_the_plans_secrets_and_an_attach_none() -> None:
    facts = {"spec": {"secret_env": ["HF_TOKEN"]}}
    environ = {"HF_TOKEN": TOKEN, "HOME": "/root"}
    assert secrets.for_start(facts, environ) == {"HF_TOKEN": TOKEN}
    assert secrets.for_start({**facts, "attach": True}, environ) == {}
    assert secrets.for_start({"spec": {}}, environ) == {}
    with pytest.raises(secrets.SecretError, match="HF_TOKEN"):
        secrets.for_start(facts, {})


# --- masking ---------------------------------------------------------------------------------------------
def test_values_of_four_characters_or_more_are_masked_longest_first() -> None:
    text = f"token={TOKEN} short=abc prefix={TOKEN[:8]}"
    assert secrets.mask(text, [TOKEN, "abc", TOKEN[:8]]) == "token=*** short=abc prefix=***"
    assert secrets.mask("nothing here", []) == "nothing here"


def test_a_status_keeps_its_shape_with_every_string_masked() -> None:
    data = {"log_tail": [f"rank 0 {TOKEN}", "ok"], "progress": {"line": TOKEN, "epoch": 2}, "rc": None}
    assert secrets.mask_all(data, [TOKEN]) == {
        "log_tail": ["rank 0 ***", "ok"],
        "progress": {"line": "***", "epoch": 2},
        "rc": None,
    }


def test_a_log_holding_nul_bytes_and_a_large_secret_are_masked() -> None:
    big = "k" * 60_000 + TOKEN  # a key of 60 KB: under the bound, masked whole
    text = f"\0\0binary-looking\0 {big} then {TOKEN}\0"
    assert secrets.mask(text, [big, TOKEN]) == "\0\0binary-looking\0 *** then ***\0"
    assert secrets.values(["KEY"], {"KEY": big}) == {"KEY": big}


def test_secrets_larger_than_every_node_can_mask_with_are_refused_naming_the_largest() -> None:
    environ = {"SMALL": TOKEN, "KEY": "k" * (secrets.MAX_BYTES + 1)}
    with pytest.raises(secrets.SecretError) as error:
        secrets.values(["SMALL", "KEY"], environ)
    said = str(error.value)
    assert said.startswith("secret_env: the values of SMALL, KEY come to ")
    assert f"(KEY alone is {secrets.MAX_BYTES + 1} characters)" in said and "pass its path" in said
    assert secrets.MAX_BYTES < 1 << 20  # what server.pack and supervisor.sync read of secrets.json


def test_a_secret_of_several_lines_is_masked_line_by_line_as_logs_show_it() -> None:
    key = "-----BEGIN KEY-----\nline-one-of-key\nline-two-of-key\n-----END KEY-----"
    assert secrets.mask("rank 0: line-two-of-key", [key]) == "rank 0: ***"
    assert secrets.mask(f"whole: {key}", [key]) == "whole: ***"


def test_the_forms_a_node_masks_are_each_value_and_its_json_escaped_form() -> None:
    quoted = 'pa"ss\\word'
    assert secrets.forms([quoted, "abc"]) == [b'pa\\"ss\\\\word', b'pa"ss\\word']


def test_a_secrets_file_is_read_within_its_bound(tmp_path: Path) -> None:
    (tmp_path / secrets.FILE).write_text(json.dumps({"A": "x" * (secrets.MAX_BYTES + 10)}))
    assert secrets.read(tmp_path) == {}  # never written so large by a start (values refuses it)
    (tmp_path / secrets.FILE).write_bytes(secrets.dumps({"A": TOKEN}))
    assert secrets.read(tmp_path) == {"A": TOKEN}


# --- the plan and the spec: names only -------------------------------------------------------------------
def test_the_plan_refuses_bad_and_missing_secrets_before_writing_anything(tmp_path: Path) -> None:
    inv = inventory(tmp_path, env_names=frozenset({"HF_TOKEN"}))
    cases = {
        "HF-TOKEN": "secret_env: 'HF-TOKEN' is not a variable name",
        "RANK": "secret_env: RANK is set by the job's launcher",
        "HF_TOKEN,WANDB_KEY": "secret_env names WANDB_KEY but the controller's environment has no value",
    }
    for value, said in cases.items():
        with pytest.raises(plan.PlanError) as error:
            plan.make_plan(request(secret_env=value), OPTIONS, inv)
        assert said in str(error.value)
    with pytest.raises(plan.PlanError, match="secret_env: NCCL_DEBUG is also a key of ddp_job_env"):
        plan.make_plan(request(secret_env="NCCL_DEBUG", env={"NCCL_DEBUG": "INFO"}), OPTIONS, inv)
    assert not (tmp_path / "runs").exists()


def test_plan_json_and_job_json_hold_the_names_and_never_a_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    (tmp_path / "train.py").write_text("print('hi')\n")
    inv = inventory(tmp_path, env_names=frozenset({"HF_TOKEN"}))
    gate = plan.make_plan(request(secret_env="HF_TOKEN", kind="check"), OPTIONS, inv)
    assert gate.spec.secret_env == ()  # the gate runs no user code
    made = plan.make_plan(request(secret_env="HF_TOKEN", script="train.py"), OPTIONS, inv)
    plan.write_files(made)
    assert made.spec.secret_env == ("HF_TOKEN",)
    run_dir = Path(made.run_dir)
    with tarfile.open(run_dir / "job.tar.gz") as bundle:
        job_json = bundle.extractfile("job.json").read().decode()  # type: ignore[union-attr]
    for text in ((run_dir / "plan.json").read_text(), job_json, json.dumps(made.to_dict())):
        assert "HF_TOKEN" in text and TOKEN not in text


def test_the_spec_refuses_a_secret_the_launcher_or_env_sets(tmp_path: Path) -> None:
    base = JobSpec(
        id="j1",
        job_dir="/workspace/jobs/j1",
        nodes=("n0",),
        nproc_per_node=1,
        launcher="mpirun",
        device="cpu",
        networks=("10.0.0.0/24",),
        timeout=60,
    ).to_dict()
    for secret_env, env, said in (
        (["MASTER_PORT"], {}, "MASTER_PORT is set by the job's launcher"),
        (["X"], {"X": "1"}, "X is also a key of ddp_job_env"),
        (["a-b"], {}, "'a-b' is not a variable name"),
    ):
        with pytest.raises(JobSpecError, match=said):
            JobSpec.from_dict(base | {"secret_env": secret_env, "env": env})
    assert JobSpec.from_dict(base | {"secret_env": ["HF_TOKEN"]}).secret_env == ("HF_TOKEN",)


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_mpiruns_command_line_names_the_ranks_variables_and_holds_no_value(launcher: str) -> None:
    spec = JobSpec.from_dict(
        {
            "id": "j1",
            "job_dir": "/workspace/jobs/j1",
            "nodes": ["n0", "n1"],
            "nproc_per_node": 1,
            "launcher": launcher,
            "device": "cpu",
            "networks": ["10.0.0.0/24"],
            "timeout": 60,
            "env": {"WANDB_MODE": "offline-value-xyz"},
            "secret_env": ["HF_TOKEN"],
        }
    )
    argv = spec.launch_argv()
    named = [argv[index + 1] for index, part in enumerate(argv) if part == "-x"]
    assert "WANDB_MODE" in named and "MASTER_ADDR" in named and "DDP_JOB_DIR" in named
    assert not [name for name in named if "=" in name]
    assert "HF_TOKEN" not in argv  # a secret reaches a rank through JOB/secrets.json, not mpirun
    assert not [part for part in argv if "offline-value-xyz" in part]


# --- the supervisor: the file the other nodes get, the launcher's environment, the masked status -----------
def job_dir_with_secrets(tmp_path: Path, **changes: Any) -> tuple[Path, JobSpec]:
    job_dir = tmp_path / "jobs" / "j1"
    job_dir.mkdir(parents=True)
    (job_dir / secrets.FILE).write_bytes(secrets.dumps({"HF_TOKEN": TOKEN}))
    fields: dict[str, Any] = {
        "id": "j1",
        "job_dir": str(job_dir),
        "nodes": [socket.gethostname()],
        "nproc_per_node": 1,
        "launcher": "mpirun",
        "device": "cpu",
        "networks": ["172.23.0.0/16"],
        "timeout": 60,
        "poll": 0.1,
        "secret_env": ["HF_TOKEN"],
    }
    return job_dir, JobSpec.from_dict(fields | changes)


def test_the_launcher_gets_the_variables_in_its_environment_and_status_json_masks_the_secret(
    tmp_path: Path,
) -> None:
    job_dir, spec = job_dir_with_secrets(tmp_path, env={"PLAIN": "plain-value"})
    # A rank that prints the secret (its wrapper read it) and the variable mpirun exported, then fails.
    printed = f"echo rank 0 says {TOKEN} and $PLAIN in $DDP_JOB_DIR; exit 1"
    code = Supervisor(spec=spec, job_dir=job_dir, launcher=["sh", "-c", printed]).run()
    text = (job_dir / STATUS_FILE).read_text()
    status = json.loads(text)
    assert code == 1 and status["state"] == "failed"
    assert f"rank 0 says *** and plain-value in {job_dir}" in status["launcher_tail"]
    assert TOKEN not in text


def test_the_status_file_masks_what_it_is_given(tmp_path: Path) -> None:
    status = StatusFile(tmp_path / "status.json", started=0.0, masked=[TOKEN, "abc"])
    status.write(state="running", progress=f"step 3 {TOKEN} abc")
    assert json.loads((tmp_path / "status.json").read_text())["progress"] == "step 3 *** abc"


def test_every_other_node_gets_the_secrets_0600_in_a_0700_job_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_dir, spec = job_dir_with_secrets(tmp_path)
    bundle = tmp_path / "bundle.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(job_dir / secrets.FILE, arcname="job.json")  # any member stands for the job's files
    (job_dir / "job.tar.gz").write_bytes(bundle.read_bytes())
    supervisor = Supervisor(spec=spec, job_dir=job_dir, launcher=["true"])
    data = supervisor.files_for_others()

    def send(_node: str, command: str, stdin: bytes, _timeout: float) -> str:  # the other node: a shell here
        done = subprocess.run(["/bin/sh", "-c", command], input=stdin, capture_output=True, check=False)
        return done.stderr.decode() if done.returncode else ""

    other = tmp_path / "other" / "jobs" / "j1"
    other.parent.mkdir(parents=True)
    other.mkdir(mode=0o755)  # made before by another step: the hand-out closes it
    mesh = Mesh("this-node")
    monkeypatch.setattr(mesh, "send", send)
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert mesh.give(["node1"], data, other, pool) is None
    assert stat.S_IMODE(other.stat().st_mode) == 0o700
    assert stat.S_IMODE((other / secrets.FILE).stat().st_mode) == 0o600
    assert json.loads((other / secrets.FILE).read_text()) == {"HF_TOKEN": TOKEN}
    assert (other / "job.tar.gz").is_file()


# --- the ranks' wrapper ----------------------------------------------------------------------------------
def test_the_wrapper_reads_the_secrets_into_the_environment_and_is_quiet_without_them(tmp_path: Path) -> None:
    assert rank_secrets.FILE == secrets.FILE
    environ = {"DDP_JOB_DIR": str(tmp_path)}
    assert rank_secrets.load_secrets(environ) == []  # a job without secrets
    assert rank_secrets.load_secrets({}) == []  # outside a job
    (tmp_path / secrets.FILE).write_bytes(secrets.dumps({"HF_TOKEN": TOKEN, "B": "x"}))
    assert rank_secrets.load_secrets(environ) == ["B", "HF_TOKEN"]
    assert environ["HF_TOKEN"] == TOKEN
    (tmp_path / secrets.FILE).write_text('["not", "a mapping"]')
    with pytest.raises(DdpClusterError, match="are not a JSON object of names to strings"):
        rank_secrets.load_secrets(environ)


def test_a_users_script_under_the_wrapper_reads_the_secret(
    tmp_path: Path, base_environ: dict[str, str]
) -> None:
    (tmp_path / secrets.FILE).write_bytes(secrets.dumps({"HF_TOKEN": TOKEN}))
    script = tmp_path / "show.py"
    script.write_text("import os\nprint(os.environ['HF_TOKEN'] == " + repr(TOKEN) + ")\n")
    env = base_environ | {"DDP_JOB_DIR": str(tmp_path)}  # alone: rank 0 of 1
    env.pop("HF_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "-m", "ddp_cluster.run", str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


@pytest.mark.torch  # the entrypoint's run imports torch
def test_the_entrypoint_reads_the_secrets_before_anything_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddp_cluster.errors import DistEnvError
    from ddp_cluster.runtime import train

    (tmp_path / secrets.FILE).write_bytes(secrets.dumps({"HF_TOKEN": TOKEN}))
    monkeypatch.setenv("DDP_JOB_DIR", str(tmp_path))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    seen: list[str | None] = []

    def resolve() -> Any:  # the first thing the entrypoint does after reading the secrets
        seen.append(os.environ.get("HF_TOKEN"))
        raise DistEnvError("stop here")

    monkeypatch.setattr(train, "resolve_dist_env", resolve)
    try:
        assert train.main(["--output-dir", str(tmp_path / "output")]) == 2
    finally:
        os.environ.pop("HF_TOKEN", None)
    assert seen == [TOKEN]
