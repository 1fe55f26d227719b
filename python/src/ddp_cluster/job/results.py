"""Where a job's logs are, on the node and in its results, in one place; the results laid out there.

On a node, mpirun (``--output-filename JOB/logs``, OpenMPI 4.x) writes each of its processes' output to
``JOB/logs/1/rank.N/stdout`` ("1": the first, and only, job of that mpirun); with torchrun those processes are
the nodes' agents and each worker's own output is torchrun's ``JOB/logs/torchrun/<run>/attempt_A/<local rank>/
stdout.log`` (then ``stderr.log``). The supervisor reads them there (:func:`mpirun_log`), and
``python -m ddp_cluster.job.results`` lays the nodes' archives out under ``runs/<job-id>/`` (:func:`lay_out`):

    runs/<job-id>/<first node's output/...>   metrics.jsonl, summary.json, health.json, checkpoints/
    runs/<job-id>/nodes/<node>/...            every node's job directory
    runs/<job-id>/logs/rank.R.log             each rank's log (R: the global rank)
    runs/<job-id>/logs/agent.N.log            torchrun / torch_npu_run: node N's agent
    runs/<job-id>/status.json                 the supervisor's last status

Standard library only: the supervisor runs it in the node image, the controller without torch.

    python -m ddp_cluster.job.results RUN_DIR FIRST_NODE NODE,NODE,... [PROCESSES_PER_NODE (torchrun only)]
"""

from __future__ import annotations

import re
import shutil
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

LOGS = "logs"
# OpenMPI's first job of an mpirun is number 1: its per-process files are logs/1/rank.N/stdout.
MPIRUN_LOG = re.compile(r"^logs/[^/]+/rank\.(\d+)/stdout$")
WORKER_LOG = re.compile(r"^logs/torchrun/[^/]+/attempt_(\d+)/(\d+)/stdout\.log$")


def mpirun_log(job_dir: Path | str, process: int) -> Path:
    """The output file of mpirun's process ``process`` (a rank, or with torchrun a node's agent), on the node
    where it ran."""
    return Path(job_dir) / LOGS / "1" / f"rank.{process}" / "stdout"


def find_mpirun_log(job_dir: Path, process: int) -> Path | None:
    """The output file of mpirun's process ``process`` if it is on this node, whatever mpirun's job number."""
    matches = sorted((job_dir / LOGS).glob(f"*/rank.{process}/stdout"))
    return matches[0] if matches else None


def rank_log_name(rank: int) -> str:
    return f"rank.{rank}.log"


def agent_log_name(node_index: int) -> str:
    return f"agent.{node_index}.log"


def worker_logs(node_dir: Path, node_index: int, nproc: int, logs: Path) -> None:
    """Each torchrun worker's log of its last attempt (stdout, then stderr) as logs/rank.R.log,
    R = node index x processes per node + local rank."""
    latest: dict[int, tuple[int, Path]] = {}
    for path in node_dir.glob(f"{LOGS}/torchrun/*/attempt_*/*/stdout.log"):
        if match := WORKER_LOG.match(path.relative_to(node_dir).as_posix()):
            attempt, local = int(match.group(1)), int(match.group(2))
            if attempt >= latest.get(local, (-1, path))[0]:
                latest[local] = (attempt, path)
    for local, (_, stdout) in sorted(latest.items()):
        stderr = stdout.with_name("stderr.log")
        text = stdout.read_bytes() + (stderr.read_bytes() if stderr.exists() else b"")
        (logs / rank_log_name(node_index * nproc + local)).write_bytes(text)


def lay_out(run_dir: Path, first: str, nodes: Sequence[str], torchrun_nproc: int | None = None) -> list[str]:
    """Unpack each node's archive (``run_dir/.incoming/<node>.tar.gz``) under ``run_dir`` (see the module's
    text); returns the nodes whose archive did not come back."""
    incoming = run_dir / ".incoming"
    logs = run_dir / LOGS
    logs.mkdir(parents=True, exist_ok=True)
    missing = []
    for index, node in enumerate(nodes):
        archive = incoming / f"{node}.tar.gz"
        if not archive.exists():
            missing.append(node)
            continue
        target = run_dir / "nodes" / node
        with tarfile.open(archive) as tar:
            tar.extractall(target, filter="data")
        for path in sorted(target.glob(f"{LOGS}/*/rank.*/stdout")):
            if match := MPIRUN_LOG.match(path.relative_to(target).as_posix()):
                process = int(match.group(1))
                name = agent_log_name(process) if torchrun_nproc else rank_log_name(process)
                shutil.copyfile(path, logs / name)
        if torchrun_nproc:
            worker_logs(target, index, torchrun_nproc, logs)
        if node == first and (target / "output").is_dir():
            for item in (target / "output").iterdir():
                destination = run_dir / item.name
                if destination.exists():
                    shutil.rmtree(destination) if destination.is_dir() else destination.unlink()
                shutil.move(str(item), destination)
            (target / "output").rmdir()
        status = target / "status.json"
        if node == first and status.exists():
            shutil.copyfile(status, run_dir / "status.json")
    shutil.rmtree(incoming, ignore_errors=True)
    return missing


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (3, 4):
        print(__doc__.rstrip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    nproc = int(args[3]) if len(args) == 4 else None
    for node in lay_out(Path(args[0]), args[1], args[2].split(","), nproc):
        print(f"{node}: no archive came back", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
