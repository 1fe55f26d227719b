"""Why a job failed, read from its logs: ``ddp-cluster doctor RUN_DIR``.

Reads every log under a results directory (``runs/<job-id>/`` as train.yml lays it out: the ranks' logs, the
launcher's and the supervisor's, CANN's plogs, ``status.json``, and the job's own ``output/``) and matches the
messages that the tools of this field print for the failures users ask about most: HCCL's error codes, NCCL
and gloo timeouts, ssh and mpirun start-up failures in containers, a rank killed for memory, a package that
does not import, a node that went down. Each cause comes with its evidence (file and line) and the fix, most
likely first: a cause that makes the other ranks fail (a rank that died, a node gone) ranks above the timeouts
its peers then report.

The logs are the job's bytes: each file is read a line at a time (at most :data:`MAX_FILE_BYTES` of it, a
line's first :data:`MAX_READ_LINE` bytes), and what the doctor quotes of them (the evidence, a node or module
it names, a file's name) is shown, never obeyed (:func:`ddp_cluster.text.visible`).

Exit status: 0 when nothing was found to report, 1 when a cause is named, 2 when RUN_DIR cannot be read.
Standard library only (the controller runs it without torch).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddp_cluster import text
from ddp_cluster.job.status import read as read_status

# Files that are never logs, and the most of one file that is read (a plog rotates at about 20 MB).
# Sources a job shipped (-e script, -e workdir) are not logs: a comment can quote any message.
SKIPPED_SUFFIXES = (
    ".ckpt",
    ".pt",
    ".pth",
    ".png",
    ".gz",
    ".tar",
    ".npy",
    ".npz",
    ".so",
    ".py",
    ".pyc",
    ".ipynb",
)
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_LINE_CHARS = 300
# The most of one line that is matched (every message the signatures know is far shorter; a line longer is
# a progress bar's or a dump's, its rest skipped, never held).
MAX_READ_LINE = 64 * 1024
# A file with a NUL among its first bytes is no log (a binary the job left).
BINARY_PROBE = 4096


@dataclass(frozen=True)
class Signature:
    """A failure's message text, what it means and what to do. ``weight``: how likely it is the root cause
    when several signatures match (a rank that died makes its peers time out, not the other way round)."""

    id: str
    pattern: re.Pattern[str]
    cause: str
    fix: str
    weight: int


def _signature(id: str, pattern: str, cause: str, fix: str, weight: int) -> Signature:
    return Signature(id, re.compile(pattern, re.IGNORECASE), cause, fix, weight)


SIGNATURES: tuple[Signature, ...] = (
    _signature(
        "node-down",
        r"node (?P<node>\S+) stopped answering ssh",
        "node {node} went down during the job (its container or server stopped, or its network was cut); the "
        "other ranks' errors follow from it",
        "bring it back with `ansible-playbook site.yml`, then continue with `-e resume=true -e "
        "resume_from=JOB_ID`",
        100,
    ),
    _signature(
        "killed-oom",
        r"exited on signal 9 \(Killed\)|Signal 9 \(SIGKILL\) received|exitcode\s*:\s*-9\b|exit code:?\s+137\b"
        r"|Out of memory: Killed process|\"signal\": 9\b",
        "a rank was killed with signal 9 (SIGKILL, exit 137): most often the kernel's out-of-memory killer",
        "look for 'Out of memory' in `dmesg` on that node; lower --batch-size or cluster_nproc_per_node, "
        "use fewer "
        "--num-workers, or give the node more memory",
        95,
    ),
    _signature(
        "device-unusable",
        r"the job's device is (?P<device>\w+) \(DDP_DEVICE\) but",
        "a rank cannot use the job's device ({device})",
        "see the rank's line: install or mount what it names (torch_npu and the driver's libraries for npu, "
        "the "
        "NVIDIA Container Toolkit for cuda), or ask for `-e device=cpu` on purpose",
        92,
    ),
    _signature(
        "import-torch",
        # torch_npu 2.5.1 on registers for torch's autoload: where it cannot load, `import torch` fails.
        r"(?:(?:ModuleNotFoundError|ImportError): .*?|Failed to load the backend extension: )"
        r"\b(?P<module>torch_npu|torch)\b",
        "{module} does not import on the node",
        "torch_npu: install it with torch as a pair (training_image_requirements); check that the driver's "
        "libraries "
        "(libascend_hal.so) are mounted and on LD_LIBRARY_PATH; torch: check docker/requirements.txt and "
        "rebuild "
        "the image with site.yml",
        90,
    ),
    _signature(
        "import-cann",
        r"ImportError: (?P<library>lib(?:hccl|ascend\w*|acl\w*|ge_runner|runtime|graph"
        r"|register)\.so)\S*: cannot open",
        "CANN's library {library} is not found, so torch_npu cannot import",
        "use a base image with CANN installed and the driver mounted (npu_host checks the driver); the "
        "node's "
        "LD_LIBRARY_PATH must hold CANN's and the driver's lib64 directories (CANN's set_env.sh)",
        90,
    ),
    _signature(
        "hccl-EJ0001",
        r"EJ0001\b",
        "HCCL EJ0001: the NPU is still held by an earlier training process (HCCP could not start)",
        "stop the earlier job's processes on that server (`npu-smi info` lists them), wait 10 s, run again",
        88,
    ),
    _signature(
        "hccl-bind",
        r"EJ0003\b|EI0019\b|and port \d+ ha(?:ve|s) already been bound",
        "HCCL could not bind its host port (EJ0003/EI0019): another process holds a port of HCCL's range",
        "reserve HCCL's ports (net.ipv4.ip_local_reserved_ports, which npu_host sets from "
        "npu_host_hccl_ports) and "
        "stop the process holding them; HCCL_IF_BASE_PORT moves the range",
        86,
    ),
    _signature(
        "hccl-EI0004",
        r"EI0004\b",
        "HCCL EI0004: the rank table or a rank is invalid (a duplicated or missing device_id or rank_id, or "
        "a table "
        "that does not match the devices the ranks see)",
        "compare rank_table.json under nodes/<node>/ with ASCEND_RT_VISIBLE_DEVICES and the job's nodes; "
        "check the "
        "plan with `ddp-cluster ip-plan check` and let train.yml write the job's table",
        85,
    ),
    _signature(
        "hccl-EI0005",
        r"EI0005\b",
        "HCCL EI0005: the ranks called a collective with different arguments (shape, count or data type)",
        "make every rank run the same code on equally shaped tensors: the same script and image on every "
        "node, "
        "a DistributedSampler with drop_last, no rank-dependent branches around collectives",
        83,
    ),
    _signature(
        "address-in-use",
        r"Address already in use|EADDRINUSE",
        "a port the job needs is already taken (the master port or a launcher port)",
        "stop what holds it (`ss -ltnp` on that node) or choose other ports: cluster_master_port, "
        "cluster_launcher_ports",
        80,
    ),
    _signature(
        "ssh-host-key",
        r"Host key verification failed",
        "ssh between the nodes refused a host key: a node was recreated and its new key is not pinned yet",
        "run `ansible-playbook site.yml`, which pins every node's current host key again",
        78,
    ),
    _signature(
        "ssh-publickey",
        r"Permission denied \(publickey",
        "ssh between the nodes was refused: the cluster key is not authorized on a node",
        "run `ansible-playbook site.yml` to install the cluster key on every node again",
        78,
    ),
    _signature(
        "ssh-resolve",
        r"Could not resolve hostname (?P<host>[^\s:]+)",
        "node name {host} does not resolve inside the containers",
        "use inventory names the nodes know: site.yml writes them into every node's /etc/hosts (host "
        "network) or "
        "the cluster network resolves them (bridge); run site.yml after changing the inventory",
        76,
    ),
    _signature(
        "orte-daemons",
        r"ORTE was unable to reliably start one or more daemons",
        "mpirun could not start its daemon on another node (ssh, a name that does not resolve, or orted "
        "missing "
        "from PATH there)",
        "from the first node, `ssh NODE true` for every node of the job; look at the ssh error above this "
        "message",
        70,
    ),
    _signature(
        "import-module",
        r"ModuleNotFoundError: No module named '(?!torch)(?P<module>[^']+)'",
        "Python module {module} is missing on the node",
        "ship the whole project with -e workdir=DIR -e script=PATH (its own modules, config and data files), "
        "or add the package to docker/requirements.txt and run site.yml",
        65,
    ),
    _signature(
        "rank-exit",
        r"^rank (?P<rank>\d+) on node (?P<node>\S+) exited with code (?P<code>-?\d+) first$",
        "rank {rank} on node {node} exited with code {code} first; the other ranks' errors follow from it",
        "read that rank's own error at the end of its log (logs/rank.{rank}.log)",
        62,
    ),
    _signature(
        "hccl-EI0006",
        r"EI0006\b|wait socket establish timeout|Getting socket times out",
        "HCCL EI0006: the ranks' connections timed out: a rank exited or started late, device IPs are not "
        "in the "
        "same subnet, TLS settings differ, or the rank table does not match the ranks running",
        "look first for a rank that failed earlier (above); raise HCCL_CONNECT_TIMEOUT for slow starts; "
        "check "
        "`hccn_tool -i N -net_health -g` and `-tls -g` on every device and the job's rank_table.json",
        60,
    ),
    _signature(
        "hccl-EI0002",
        r"EI0002\b",
        "HCCL EI0002: a collective waited for a rank that never came (it failed or is much slower)",
        "look for the rank that failed first; raise HCCL_EXEC_TIMEOUT only when a rank is slow on purpose",
        58,
    ),
    _signature(
        "store-timeout",
        r"client socket has timed out after \d+ms while trying to connect"
        r"|Timed out after \d+ seconds waiting for "
        r"clients",
        "the ranks could not meet at the rendezvous (MASTER_ADDR:MASTER_PORT): a rank did not start, or the "
        "first "
        "node's master port is not reachable",
        "check that every rank started (their logs) and that the first node's master port is open to the "
        "others",
        55,
    ),
    _signature(
        "nccl-timeout",
        r"Watchdog caught collective operation timeout|ncclRemoteError|NCCL WARN NET/\w+ : Connection closed"
        r"|NCCL error.*(?:timeout|remote process exited)",
        "an NCCL collective timed out or lost its peer: a rank exited or hangs, or the network between the "
        "nodes "
        "failed",
        "look for the rank that failed first; check NCCL_SOCKET_IFNAME and that the nodes reach each other "
        "on it",
        50,
    ),
    _signature(
        "gloo-connection",
        r"Connection closed by peer|Connection reset by peer|Timed out waiting \d+ms for (?:recv"
        r"|send) operation"
        r"|gloo.*Connect timeout|Socket Timeout",
        "a gloo collective lost its peer or timed out: another rank exited or hangs, or the link between "
        "the nodes "
        "failed",
        "look for the rank that failed first; check GLOO_SOCKET_IFNAME and that the nodes reach each other "
        "on it",
        45,
    ),
    _signature(
        "job-timeout",
        r"the job did not finish within job_timeout=(?P<seconds>[\d.]+) s",
        "the job ran past job_timeout ({seconds} s)",
        "raise -e job_timeout=SECONDS, or look in the ranks' last lines for where it hung",
        40,
    ),
)


@dataclass(frozen=True)
class Evidence:
    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


@dataclass
class Finding:
    signature: Signature
    cause: str
    fix: str
    evidence: list[Evidence] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.signature.id,
            "cause": self.cause,
            "fix": self.fix,
            "evidence": [{"path": e.path, "line": e.line, "text": e.text} for e in self.evidence],
        }


def log_files(run_dir: Path) -> Iterator[Path]:
    """Every file that may hold a log, in a stable order; checkpoints, images and archives are skipped, and so
    is a health gate's run before the job (``preflight/``: it passed, or the job would not have started)."""
    for path in sorted(run_dir.rglob("*")):
        parts = path.relative_to(run_dir).parts
        skipped = ".incoming" in parts or parts[0] == "preflight"
        # never through a link: a job's link would show what it points at
        if (
            path.is_file()
            and not path.is_symlink()
            and not path.name.endswith(SKIPPED_SUFFIXES)
            and not skipped
        ):
            yield path


def read_lines(path: Path) -> Iterator[str]:
    """The lines of a log, read a line at a time (see the module's text); none of a binary file's."""
    with path.open("rb") as handle:
        if b"\0" in handle.peek(BINARY_PROBE)[:BINARY_PROBE]:
            return
        for line in text.lines(handle, MAX_READ_LINE, MAX_FILE_BYTES):
            yield line.data.decode("utf-8", errors="replace").rstrip("\r")


def status_lines(path: Path) -> list[str]:
    """status.json as lines to match: its reason and exit status (its log tail repeats the ranks' logs)."""
    status = read_status(path)
    if status is None:
        return []
    lines = [f"reason: {status.reason}"]
    rank, node, code = status.failed_rank, status.failed_node, status.exit_code
    if status.signal == 9 or code == 137:
        lines.append(f'"signal": 9 (rank {rank} on node {node})')
    elif rank is not None and code is not None and code != 0:
        lines.append(f"rank {rank} on node {node} exited with code {code} first")
    return lines


def match_lines(relative: str, lines: Iterable[str], found: dict[str, Finding]) -> None:
    for number, line in enumerate(lines, start=1):
        for signature in SIGNATURES:
            match = signature.pattern.search(line)
            if match is None:
                continue
            # what the log says is quoted, shown never obeyed (its own control characters written out)
            values = {
                name: text.visible(value[:MAX_LINE_CHARS], newlines=False) if value else "?"
                for name, value in match.groupdict().items()
            }
            cause = signature.cause.format(**values)
            key = f"{signature.id}:{cause}"
            finding = found.setdefault(key, Finding(signature, cause, signature.fix.format(**values)))
            quoted = text.visible(line.strip()[:MAX_LINE_CHARS], newlines=False)
            finding.evidence.append(Evidence(text.visible(relative, newlines=False), number, quoted))


def diagnose(run_dir: Path) -> list[Finding]:
    """Every cause found under run_dir, most likely first (then the one with more evidence)."""
    found: dict[str, Finding] = {}
    for path in log_files(run_dir):
        relative = str(path.relative_to(run_dir))
        lines = status_lines(path) if path.name == "status.json" else read_lines(path)
        match_lines(relative, lines, found)
    return sorted(found.values(), key=lambda f: (-f.signature.weight, -len(f.evidence), f.cause))


def render(run_dir: Path, findings: Sequence[Finding], width: int = 120) -> str:
    if not findings:
        return f"ddp-cluster doctor: {run_dir}: no known failure found in its logs"
    head = f"ddp-cluster doctor: {run_dir}: {len(findings)} likely cause(s), most likely first"
    columns = (("#", 2), ("cause", 40), ("evidence (file:line)", 42), ("fix", max(30, width - 90)))
    rows = [tuple(name for name, _ in columns)]
    for index, finding in enumerate(findings, start=1):
        more = len(finding.evidence) - 1
        evidence = textwrap.shorten(str(finding.evidence[0]), 160, placeholder=" ...")
        evidence += f" (and {more} more)" if more else ""
        rows.append((str(index), finding.cause, evidence, finding.fix))
    out = [head, ""]
    for row in rows:
        cells = [
            textwrap.wrap(text, w, break_on_hyphens=False) or [""]
            for text, (_, w) in zip(row, columns, strict=True)
        ]
        for depth in range(max(len(cell) for cell in cells)):
            parts = [
                (cell[depth] if depth < len(cell) else "").ljust(w)
                for cell, (_, w) in zip(cells, columns, strict=True)
            ]
            out.append("  ".join(parts).rstrip())
        out.append("")
    return "\n".join(out).rstrip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ddp-cluster doctor",
        description="Name the likely cause of a failed job from its logs (exit 1 when one is named, else 0).",
    )
    parser.add_argument("run_dir", type=Path, help="a job's results directory, runs/<job-id>/")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--width", type=int, default=120, help="width of the table (default 120)")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"ddp-cluster doctor: {args.run_dir} is not a directory: give runs/<job-id>/", file=sys.stderr)
        return 2
    findings = diagnose(args.run_dir)
    if args.json:
        report = {"run_dir": str(args.run_dir), "findings": [f.as_dict() for f in findings]}
        print(json.dumps(report, indent=2))
    else:
        print(render(args.run_dir, findings, args.width))
    return 1 if findings else 0
