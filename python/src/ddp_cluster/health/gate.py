"""The health gate, run on every rank of a job: ``python -m ddp_cluster.gate --output-dir DIR``.

``check.yml`` (and ``train.yml -e preflight=true``) start it like a training job: under the job's launcher,
with its environment, on its device and backend (gloo, nccl or hccl). Each rank reports its versions, its
visible device count and the variables that steer collectives; then all ranks run an all-reduce over a sweep
of sizes (nccl-tests' figures: time, algbw, busbw), check one all-reduce's sums, and the first rank of every
node runs an all-reduce with each of its two neighbours on a ring of the nodes, the ring's pairs measured in
two or three phases of disjoint pairs. Rank 0 judges (:func:`ddp_cluster.health.judge.verdict`), writes
``DIR/health.json`` and prints the report. The exit status is 0 whenever the measurements completed: the
verdict is in health.json (``ddp-cluster health`` exits 1 on a failed gate); a rank that cannot take part
fails like a job's rank.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import ddp_cluster
from ddp_cluster.errors import DdpClusterError
from ddp_cluster.files import write_atomic
from ddp_cluster.health import fabric
from ddp_cluster.health import judge as health
from ddp_cluster.runtime.config import requested_device
from ddp_cluster.runtime.device import Placement, announce_binding, select_placement, where
from ddp_cluster.runtime.distenv import DistEnv, resolve_dist_env
from ddp_cluster.runtime.finish import exit_process
from ddp_cluster.runtime.group import process_group
from ddp_cluster.text import plain

CANN_INFO = ("ascend_toolkit_install.info", "version=")
NPU_DRIVER_INFO = Path("/usr/local/Ascend/driver/version.info")
# cpu servers with one NIC per process: the interface of each local rank's device pairs, comma-separated.
GLOO_DEVICE_IFNAMES = "DDP_GLOO_DEVICE_IFNAMES"
# Operations a pair times after its probe, even past the time budget: its figure is the fastest of these and
# the probe, so one stall cannot decide it. This costs time only on pairs slower than half the budget.
PAIR_ITERATIONS = 2


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m ddp_cluster.gate", description=plain(__doc__).split("\n\n")[0]
    )
    p.add_argument("--output-dir", type=Path, required=True, help="where rank 0 writes health.json")
    p.add_argument(
        "--min-bytes", type=int, default=4096, help="smallest all-reduce of the sweep (default 4 KiB)"
    )
    p.add_argument(
        "--max-bytes", type=int, default=16 << 20, help="largest, and the pairs' size (default 16 MiB)"
    )
    p.add_argument("--factor", type=int, default=4, help="each size this many times the last (default 4)")
    p.add_argument(
        "--seconds-per-size", type=float, default=0.2, help="time spent timing each size (default 0.2)"
    )
    p.add_argument(
        "--max-iterations", type=int, default=20, help="most timed operations per size (default 20)"
    )
    p.add_argument("--fraction", type=float, default=0.5, help="a node or link below this x the median fails")
    p.add_argument(
        "--floor-gbps", type=float, default=0.0, help="a pair below this busbw fails (0: no floor)"
    )
    p.add_argument("--ignore", default="", help="comma-separated settings whose differences are accepted")
    p.add_argument("--dist-timeout", type=float, default=120.0, help="seconds a collective may wait")
    args = p.parse_args(argv)
    try:
        args.sizes = health.sweep_sizes(args.min_bytes, args.max_bytes, args.factor)
        args.thresholds = health.Thresholds(args.fraction, args.floor_gbps)
    except ValueError as error:
        p.error(str(error))
    if args.seconds_per_size <= 0 or args.max_iterations < 1:
        p.error("--seconds-per-size must be above 0 and --max-iterations at least 1")
    args.ignore = [name.strip() for name in args.ignore.split(",") if name.strip()]
    return args


def _read_value(path: Path, key: str) -> str | None:
    """The value after ``key`` on the first line of ``path`` that starts with it (CANN's and the driver's
    version files), None when absent."""
    try:
        for line in path.read_text(errors="replace").splitlines():
            if line.strip().startswith(key):
                return line.strip()[len(key) :].strip()
    except OSError:
        return None
    return None


def cann_version(toolkit: str, machine: str = "") -> str | None:
    """CANN's version from the toolkit's install info: in ``<arch>-linux/`` under the toolkit (the layout of
    the CANN 8 toolkit package, as Ascend's images install it), or at its top (older layouts)."""
    for directory in (Path(toolkit) / f"{machine or platform.machine()}-linux", Path(toolkit)):
        found = _read_value(directory / CANN_INFO[0], CANN_INFO[1])
        if found is not None:
            return found
    return None


def _command_first_line(argv: Sequence[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = result.stdout.strip().splitlines()
    return lines[0].strip() if result.returncode == 0 and lines else None


def _node_addresses(interface: str) -> list[str]:
    """The node's IPv4 addresses on ``interface`` (ip -o -4 addr), without prefix."""
    if not interface or shutil.which("ip") is None:
        return []
    result = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "dev", interface],
        capture_output=True,
        text=True,
        check=False,
        timeout=15,
    )
    return [field.split("/")[0] for line in result.stdout.splitlines() for field in line.split()[3:4]]


def versions(placement: Placement) -> dict[str, str | None]:
    """What this rank runs on: Python, torch, and where present torch_npu, CUDA, the GPU or NPU driver and
    CANN."""
    found: dict[str, str | None] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ddp_cluster": package_version(),
    }
    if importlib.util.find_spec("torch_npu") is not None:
        try:
            found["torch_npu"] = str(getattr(importlib.import_module("torch_npu"), "__version__", "unknown"))
        except Exception as error:  # the report says why it does not import; the device check fails the job
            found["torch_npu"] = f"does not import ({type(error).__name__})"
    if torch.version.cuda:
        found["cuda"] = torch.version.cuda
        found["gpu_driver"] = _command_first_line(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        )
    cann = cann_version(os.environ.get("ASCEND_TOOLKIT_HOME") or "/usr/local/Ascend/ascend-toolkit/latest")
    if cann is not None:
        found["cann"] = cann
    driver = _read_value(NPU_DRIVER_INFO, "Version=")
    if driver is not None:
        found["npu_driver"] = driver
    return found


def package_version() -> str:
    """This package's version and a digest of its sources: a node left on an older image stands out even
    when the version number is the same."""
    digest = hashlib.sha256()
    root = Path(ddp_cluster.__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return f"{ddp_cluster.__version__}+{digest.hexdigest()[:12]}"


def device_count(placement: Placement) -> int | None:
    """The devices this rank sees of the job's kind (None on cpu)."""
    if placement.index is None:
        return None
    return int(getattr(torch, placement.kind).device_count())


# What the gate sets for itself on nccl, so that NCCL says which transport it chose (into files of its own:
# the ranks' logs stay as they are); the user's own values are what the environment comparison sees.
NCCL_LOGGING = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
_users_environ: dict[str, str] = {}


def log_nccl_transport(directory: Path) -> None:
    """Make NCCL log its network choice into ``directory`` (nccl.HOST.PID.log), before the process group."""
    _users_environ.clear()
    _users_environ.update(os.environ)
    directory.mkdir(parents=True, exist_ok=True)
    os.environ.update(NCCL_LOGGING | {"NCCL_DEBUG_FILE": str(directory / "nccl.%h.%p.log")})


def node_fabric(env: DistEnv, placement: Placement, directory: Path | None) -> dict[str, Any] | None:
    """The first rank of a node: the transport NCCL chose (from its own log) and the node's InfiniBand/RoCE
    adapters; None on other ranks and other backends."""
    if env.local_rank != 0 or placement.backend != "nccl" or directory is None:
        return None
    text = fabric.read_nccl_logs(directory, f"nccl.*.{os.getpid()}.log")
    return {
        "node": os.environ.get("DDP_NODE_NAME") or platform.node(),
        "transport": fabric.parse_nccl_log(text).as_dict(),
        "hcas": [hca.as_dict() for hca in fabric.ib_devices()],
        "rdma_devices": fabric.has_rdma_devices(),
    }


def local_report(env: DistEnv, placement: Placement) -> dict[str, Any]:
    interface = os.environ.get("DDP_NETWORK_INTERFACE", "")
    return {
        "node": os.environ.get("DDP_NODE_NAME") or platform.node(),
        "rank": env.rank,
        "local_rank": env.local_rank,
        "node_rank": env.node_rank,
        "versions": versions(placement),
        "devices": device_count(placement),
        "variables": health.steering_variables(
            _users_environ or os.environ, interface, _node_addresses(interface)
        ),
    }


class Measure:
    """Timed all-reduces on the job's device: one warm-up, one probe that every rank of the group agrees on
    (the slowest rank's time), then as many operations as fit in the time budget, at least 1: their mean for
    the sweep (:meth:`allreduce`, as nccl-tests reports), the fastest for a pair (:meth:`fastest`)."""

    def __init__(self, placement: Placement, seconds_per_size: float, max_iterations: int) -> None:
        self.device = placement.device
        self.sync: Callable[[], None] = _synchronizer(placement.kind)
        self.seconds_per_size = seconds_per_size
        self.max_iterations = max_iterations

    def slowest(self, seconds: float, group: Any = None) -> float:
        value = torch.tensor([seconds], dtype=torch.float32, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
        return float(value.item())

    def _once(self, tensor: torch.Tensor, group: Any) -> float:
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        self.sync()
        return time.perf_counter() - start

    def _iterations(self, probe: float, at_least: int) -> int:
        return max(at_least, min(self.max_iterations, int(self.seconds_per_size / max(probe, 1e-6))))

    def allreduce(self, nbytes: int, group: Any = None) -> tuple[float, int]:
        """Seconds per all-reduce of ``nbytes`` (the group's slowest rank) and the operations timed."""
        tensor = torch.zeros(nbytes // 4, dtype=torch.float32, device=self.device)
        dist.all_reduce(tensor, group=group)
        self.sync()
        probe = self.slowest(self._once(tensor, group), group)
        iterations = self._iterations(probe, 1)
        self.sync()
        start = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(tensor, group=group)
        self.sync()
        return self.slowest((time.perf_counter() - start) / iterations, group), iterations

    def fastest(self, nbytes: int, group: Any = None, at_least: int = PAIR_ITERATIONS) -> tuple[float, int]:
        """A pair's figure: seconds of its fastest all-reduce of ``nbytes`` (the group's slowest rank's
        fastest), of the probe and the operations timed after it, as many as fit in the time budget and at
        least ``at_least``, each waited for; and that count. A stall (another process on the host's cores,
        the scheduler) slows some operations and is no property of the link; a slow link slows every one."""
        tensor = torch.zeros(nbytes // 4, dtype=torch.float32, device=self.device)
        dist.all_reduce(tensor, group=group)
        self.sync()
        times = [self._once(tensor, group)]
        iterations = self._iterations(self.slowest(times[0], group), at_least)
        times += [self._once(tensor, group) for _ in range(iterations)]
        return self.slowest(min(times), group), iterations

    def check_sums(self, world_size: int, rank: int) -> dict[str, Any]:
        """An all-reduce whose result is known: each rank adds rank + 1, so every element is n(n+1)/2."""
        tensor = torch.full((1024,), float(rank + 1), dtype=torch.float32, device=self.device)
        dist.all_reduce(tensor)
        expected = world_size * (world_size + 1) / 2
        ok = bool(torch.all(tensor == expected).item())
        return {"ok": ok, "expected": expected, "got": float(tensor[0].item())}


def _synchronizer(kind: str) -> Callable[[], None]:
    """Waits for the device's queued work: ``torch.<device>.synchronize`` of an accelerator's kind; on cpu the
    collectives return when done."""
    if kind == "cpu":
        return lambda: None
    synchronize: Callable[[], None] = getattr(torch, kind).synchronize
    return synchronize


def device_interface(local_rank: int, environ: Mapping[str, str] | None = None) -> str | None:
    """The interface this rank's gloo pairs use: the ``local_rank``-th of ``DDP_GLOO_DEVICE_IFNAMES`` (cpu
    servers with one NIC per process: what a device's own NIC is on npu and gpu), None when unset."""
    names = [name.strip() for name in (environ or os.environ).get(GLOO_DEVICE_IFNAMES, "").split(",")]
    names = [name for name in names if name]
    if not names:
        return None
    if local_rank >= len(names):
        raise DdpClusterError(
            f"{GLOO_DEVICE_IFNAMES}={','.join(names)} names {len(names)} interface(s), local rank"
            f" {local_rank} has none: name one per process of the node"
        )
    return names[local_rank]


def measure_pairs(
    measure: Measure, reports: Sequence[dict[str, Any]], rank: int, nbytes: int, backend: str = "gloo"
) -> list[dict[str, Any]]:
    """All-reduces between the same device (local rank) of neighbouring nodes on the ring: every device's
    own link, phase by phase; on nccl and hccl every device of a phase at once (each device has its own NIC,
    the collective library picks it), on gloo one device after the other (the host's cores carry every pair:
    see :func:`ddp_cluster.health.judge.pair_rounds`). A pair's figure is its fastest operation
    (:meth:`Measure.fastest`). Every rank takes part in making the groups and in the barriers, and receives
    every pair's figure."""
    by_node: dict[int, dict[int, dict[str, Any]]] = {}
    for report in reports:
        by_node.setdefault(int(report["node_rank"]), {}).setdefault(int(report["local_rank"]), report)
    order = [by_node[index] for index in sorted(by_node)]
    devices = sorted(set.intersection(*(set(node) for node in order))) if order else []
    pairs = health.ring_pairs(len(order))
    mine = next(report for report in reports if int(report["rank"]) == rank)
    interface = device_interface(int(mine["local_rank"])) if backend == "gloo" else None
    groups: dict[tuple[int, int], Any] = {}
    saved = os.environ.get("GLOO_SOCKET_IFNAME")
    try:
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface  # read when each gloo group is made
        for index, (a, b) in enumerate(pairs):
            for device in devices:
                members = [int(order[a][device]["rank"]), int(order[b][device]["rank"])]
                # Every rank makes every group (torch's use_local_synchronization hangs gloo's second group).
                group = dist.new_group(members)
                if rank in members:
                    groups[(index, device)] = group
    finally:
        if interface is not None:
            if saved is None:
                os.environ.pop("GLOO_SOCKET_IFNAME", None)
            else:
                os.environ["GLOO_SOCKET_IFNAME"] = saved
    rows: list[dict[str, Any]] = []
    for batch in health.pair_rounds(len(order), devices, together=backend != "gloo"):
        for index, device in batch:
            if (index, device) in groups:
                a, b = pairs[index]
                seconds, iterations = measure.fastest(nbytes, groups[(index, device)])
                row = health.allreduce_row(nbytes, seconds, 2, iterations)
                rows.append(
                    {"a": order[a][device]["node"], "b": order[b][device]["node"], "device": device, **row}
                )
        dist.barrier()
    everyone: list[list[dict[str, Any]]] = [[] for _ in reports]
    dist.all_gather_object(everyone, rows)
    seen: dict[tuple[str, str, int], dict[str, Any]] = {}
    for found in everyone:
        for row in found:
            seen.setdefault((row["a"], row["b"], row["device"]), row)
    return [
        seen[key]
        for device in devices
        for a, b in pairs
        if (key := (order[a][device]["node"], order[b][device]["node"], device)) in seen
    ]


def run_gate(
    args: argparse.Namespace, env: DistEnv, placement: Placement, nccl_logs: Path | None = None
) -> dict[str, Any] | None:
    started = time.perf_counter()
    reports: list[dict[str, Any]] = [{} for _ in range(env.world_size)]
    dist.all_gather_object(reports, local_report(env, placement))
    measure = Measure(placement, args.seconds_per_size, args.max_iterations)
    sweep = []
    for nbytes in args.sizes:
        seconds, iterations = measure.allreduce(nbytes)
        sweep.append(health.allreduce_row(nbytes, seconds, env.world_size, iterations))
    check = measure.check_sums(env.world_size, env.rank)
    checks: list[dict[str, Any]] = [{} for _ in range(env.world_size)]
    dist.all_gather_object(checks, check)
    wrong = [rank for rank, result in enumerate(checks) if not result["ok"]]
    pairs = measure_pairs(measure, reports, env.rank, args.sizes[-1], placement.backend)
    fabrics: list[dict[str, Any] | None] = [None for _ in range(env.world_size)]
    dist.all_gather_object(fabrics, node_fabric(env, placement, nccl_logs))
    if env.rank != 0:
        return None
    nodes = list(dict.fromkeys(str(report["node"]) for report in sorted(reports, key=lambda r: r["rank"])))
    result: dict[str, Any] = {
        "job": os.environ.get("DDP_JOB_ID", ""),
        "nodes": nodes,
        "world_size": env.world_size,
        "backend": placement.backend,
        "device": placement.kind,
        "launcher": os.environ.get("DDP_LAUNCHER", env.launcher),
        "thresholds": {"fraction": args.thresholds.fraction, "floor_gbps": args.thresholds.floor_gbps},
        "ignore": args.ignore,
        "reports": reports,
        "sweep": sweep,
        "check": {
            "ok": not wrong,
            "expected": check["expected"],
            "wrong_ranks": wrong,
            "got": [checks[rank]["got"] for rank in wrong],
        },
        "pairs": pairs,
        "fabric": [found for found in fabrics if found is not None],
    }
    result["seconds"] = round(time.perf_counter() - started, 3)
    result["verdict"] = health.verdict(result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    env: DistEnv | None = None
    try:
        env = resolve_dist_env()
        announce_binding(env)
        placement = select_placement(requested_device(), "auto", env)
        nccl_logs = args.output_dir / "nccl" if placement.backend == "nccl" else None
        if nccl_logs is not None:
            log_nccl_transport(nccl_logs)
        with process_group(env, placement, args.dist_timeout):
            result = run_gate(args, env, placement, nccl_logs)
    except DdpClusterError as error:
        print(f"ddp_cluster.gate: {where(env)}: error: {error}", file=sys.stderr, flush=True)
        return 2
    if result is not None:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(args.output_dir / health.HEALTH_FILE, (json.dumps(result, indent=2) + "\n").encode())
        print(health.render(result), flush=True)
    return 0


if __name__ == "__main__":
    exit_process(main())  # no interpreter finalization after the collectives (see ddp_cluster.runtime.finish)
