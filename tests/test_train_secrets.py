"""A secret through ``-e secret_env=NAME`` on the local cluster (2 nodes, a user's script in a project): its
value, taken from the controller's environment, reaches every rank (the script checks its hash); while the
job runs it is on no command line (``ps`` on both nodes and on the host, a ``ddp_job_env`` value neither) and
in no file that other users can read (the job's directory 0700, secrets.json 0600, nothing in /tmp); after
the job it is in no file of the run (plan.json, status.json, the logs, every file under runs/ID, the
archives' members) nor in train.yml's output, and the value a rank printed is masked in the collected
logs."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from conftest import LOCAL_INVENTORY, REPO, PlaybookResult, node_exec

RUNS = REPO / "runs"
PLAYBOOK = str(REPO / ".venv" / "bin" / "ansible-playbook")
NODES = ("node0", "node1")
NAME = "E2E_SECRET_TOKEN"
MASK = "***"
SCRIPT = '''\
"""Checks the secret and a ddp_job_env value against their hashes (argv holds no value), prints the hash on
every rank and the value once, then holds the ranks until the test has looked at the nodes."""

import hashlib
import os
import sys
import time

import torch.distributed as dist


def digest(name):
    return hashlib.sha256(os.environ[name].encode()).hexdigest()


rank = int(os.environ["RANK"])
assert digest("E2E_SECRET_TOKEN") == sys.argv[1], f"rank {rank}: E2E_SECRET_TOKEN is not the controller's"
assert digest("E2E_PLAIN") == sys.argv[2], f"rank {rank}: E2E_PLAIN is not ddp_job_env's"
dist.init_process_group("gloo")
print(f"secret-script rank {rank} sha256 {sys.argv[1]}", flush=True)
if rank == 0:
    print(f"secret-script value {os.environ['E2E_SECRET_TOKEN']}", flush=True)
deadline = time.time() + 180
while not os.path.exists("release") and time.time() < deadline:
    time.sleep(0.2)
dist.barrier()
dist.destroy_process_group()
'''
RANKS_WITHIN = 240  # the plan, the node checks, the start and mpirun's wire-up on a shared 2-core machine


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def holding(node: str, text: str) -> list[str]:
    """The files under the job's directory and /tmp on ``node`` that hold ``text`` (given on grep's input, so
    that no command line holds it)."""
    done = subprocess.run(
        ["docker", "exec", "-i", node, "sh", "-c", "grep -rlF -f - /workspace/jobs /tmp 2>/dev/null; true"],
        input=text + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return sorted(done.stdout.split())


def contents(path: Path) -> list[tuple[str, bytes]]:
    """A file's bytes, and those of an archive's members (gzip, tar.gz) as well."""
    data = path.read_bytes()
    found = [(str(path), data)]
    if path.name.endswith((".tar.gz", ".tgz", ".tar")):
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                if member.isfile() and (extracted := tar.extractfile(member)) is not None:
                    found.append((f"{path}:{member.name}", extracted.read()))
    elif path.name.endswith(".gz"):
        found.append((f"{path}:gunzipped", gzip.decompress(data)))
    return found


def files_written_since(root: Path, since: float, skip: Path) -> list[Path]:
    found = []
    for folder, dirs, names in os.walk(root):
        if Path(folder).is_relative_to(skip) or folder.count(os.sep) > 64:
            dirs[:] = []  # another test's tree, or one nested too deep for a walk that looks for recent files
            continue
        for name in names:
            path = Path(folder, name)
            try:
                info = path.lstat()
                if stat.S_ISREG(info.st_mode) and info.st_mtime >= since and info.st_size < 64 * 2**20:
                    found.append(path)
            except OSError:
                continue
    return found


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_a_secret_reaches_every_rank_and_no_command_line_file_or_log(
    local_cluster: PlaybookResult, tmp_path: Path, launcher: str
) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    plain = f"plain-{uuid.uuid4().hex}"
    job = f"test-secrets-{launcher}-{uuid.uuid4().hex[:6]}"
    job_dir = f"/workspace/jobs/{job}"
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(SCRIPT)
    extra = {
        "job_id": job,
        "nodes": 2,
        "launcher": launcher,
        "workdir": str(project),
        "script": "train.py",
        "script_args": f"{sha256(token)} {sha256(plain)}",
        "secret_env": NAME,
        "ddp_job_env": {"E2E_PLAIN": plain},
    }
    output = tmp_path / "train.out"
    started = time.time()
    with output.open("w") as out:
        process = subprocess.Popen(
            [PLAYBOOK, "-i", str(LOCAL_INVENTORY), "train.yml", "-e", json.dumps(extra)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=os.environ | {NAME: token, "ANSIBLE_NOCOLOR": "1"},
            start_new_session=True,
        )
    try:
        # The ranks run on both nodes (they hold until released).
        rank_marker = f"{job_dir}/workdir/train.py"
        count = f"pgrep -fc '[{rank_marker[0]}]{rank_marker[1:]}' || true"
        deadline = time.time() + RANKS_WITHIN
        while time.time() < deadline and process.poll() is None:
            counts = [node_exec(node, count).stdout.strip() for node in NODES]
            if all(count not in ("", "0") for count in counts):
                break
            time.sleep(1)
        assert process.poll() is None, output.read_text()[-5000:]
        ranks_at = time.time() - started

        # No command line holds a value: the nodes' processes (mpirun, its daemons, ranks, supervisor, ssh
        # sessions) and the host's (ansible, docker exec).
        for node in NODES:
            listing = node_exec(node, "ps -eo user,args").stdout
            assert rank_marker in listing, listing
            assert token not in listing and plain not in listing, f"{node}: a value on a command line"
        host = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
        assert token not in host and plain not in host, "a value on a command line of the host"

        # Files: the secret is only in the job's directory (mode 0700), secrets.json 0600 on each node, and
        # the printed value in rank 0's log there; nothing in /tmp.
        for node in NODES:
            modes = node_exec(node, f"stat -c '%a %n' {job_dir} {job_dir}/secrets.json").stdout.split("\n")
            assert modes[:2] == [f"700 {job_dir}", f"600 {job_dir}/secrets.json"], (node, modes)
            found = holding(node, token)
            assert f"{job_dir}/secrets.json" in found, (node, found)
            assert all(path.startswith(f"{job_dir}/") for path in found), (node, found)
            assert not {f"{job_dir}/job.json", f"{job_dir}/status.json"} & set(found), (node, found)
        home = Path.home() / ".ansible"
        for root in (Path("/tmp"), home):
            for path in files_written_since(root, started, skip=tmp_path):
                try:
                    read = contents(path)
                except (OSError, tarfile.TarError, EOFError, gzip.BadGzipFile):
                    continue  # gone, or being written by another test
                for where, data in read:
                    assert token.encode() not in data, f"the value in {where} on the controller"

        for node in NODES:
            node_exec(node, f"touch {job_dir}/workdir/release")
        process.wait(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 15)
            process.wait(timeout=60)
    said = output.read_text()
    elapsed = time.time() - started
    print(f"secret job ({launcher}): ranks ran after {ranks_at:.0f} s, train.yml ended after {elapsed:.0f} s")
    assert process.returncode == 0, said[-5000:]
    assert token not in said and plain not in said, "train.yml's output holds a value"

    run = RUNS / job
    assert NAME in (run / "plan.json").read_text()  # the name, not the value
    assert json.loads((run / "status.json").read_text())["state"] == "succeeded"
    logs = ""
    for path in sorted(path for path in run.rglob("*") if path.is_file() and not path.is_symlink()):
        for where, data in contents(path):
            assert token.encode() not in data, f"the secret's value in {where}"
            if "log" in where:
                logs += data.decode("utf-8", "replace")
    for rank in (0, 1):
        assert f"secret-script rank {rank} sha256 {sha256(token)}" in logs, logs[-3000:]
    assert f"secret-script value {MASK}" in logs, logs[-3000:]
    # once collected, no node keeps the values
    for node in NODES:
        assert node_exec(node, f"test ! -e {job_dir}/secrets.json", check=False).returncode == 0, node


PLANTER = '''\
"""An earlier job that leaves a sitecustomize.py in the image's site-packages: every later Python on the node
would run it first and write its environment (a later job's secrets) where this job's owner reads it."""

import os
import site

rank = int(os.environ.get("RANK", "0"))
if rank == 0:
    with open(os.path.join(site.getsitepackages()[0], "sitecustomize.py"), "w") as handle:
        handle.write(
            "import os\\nif 'E2E_SECRET_TOKEN' in os.environ:\\n"
            f"    open({os.environ['E2E_STOLEN']!r}, 'w').write(repr(dict(os.environ)))\\n"
        )
'''
VICTIM = """\
import os

assert os.environ["E2E_SECRET_TOKEN"]
print("victim ran", flush=True)
"""


def test_a_sitecustomize_a_job_leaves_is_removed_before_the_next_job_reads_its_secrets(
    local_cluster: PlaybookResult, tmp_path: Path
) -> None:
    stolen = f"/tmp/stolen-{uuid.uuid4().hex[:8]}"
    token = f"tok-{uuid.uuid4().hex}"
    project = tmp_path / "project"
    project.mkdir()
    (project / "plant.py").write_text(PLANTER)
    (project / "victim.py").write_text(VICTIM)
    planted = node_exec("node0", "ls /opt/venv/lib/python3*/site-packages/sitecustomize.py", check=False)
    assert planted.returncode != 0, "a sitecustomize.py on node0 before the test"

    def train(script: str, **extra: object) -> str:
        request = {
            "nodes": 1,
            "workdir": str(project),
            "script": script,
            "ddp_job_env": {"E2E_STOLEN": stolen},
        }
        done = subprocess.run(
            [PLAYBOOK, "-i", str(LOCAL_INVENTORY), "train.yml", "-e", json.dumps(request | extra)],
            cwd=REPO,
            capture_output=True,
            text=True,
            env=os.environ | {NAME: token, "ANSIBLE_NOCOLOR": "1"},
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-5000:]
        return done.stdout

    train("plant.py")
    assert node_exec("node0", "ls /opt/venv/lib/python3*/site-packages/sitecustomize.py").returncode == 0
    said = train("victim.py", secret_env=NAME)
    assert "undone what an earlier job left: removed /opt/venv/lib/python3" in said, said[-3000:]
    assert "site-packages/sitecustomize.py (the image has none there)" in said, said[-3000:]
    assert node_exec("node0", f"test ! -e {stolen}", check=False).returncode == 0, (
        "the next job's secrets read"
    )
    gone = node_exec("node0", "ls /opt/venv/lib/python3*/site-packages/sitecustomize.py", check=False)
    assert gone.returncode != 0
