"""A job's telemetry: what one sample of a node asks (:func:`sample_script`), what it answered
(:func:`read_sample`), the record written for it (:func:`record`) and whether a device turned bad
(:func:`device_faults`). Pure functions, no package imports beyond the kinds' own parsers: the supervisor
runs the script on every node (:mod:`ddp_cluster.supervisor.telemetry`), the tests run it on doubles.

The script is one ``sh`` command per node and sample, cheap on purpose (a few forks: ``pgrep``, the vendor
tool; ``/proc`` read with the shell's own ``read``). It prints sections, each opened by a line ``@@NAME``:

    @@uptime 12345.67           the node's /proc/uptime (the clock of the processes' CPU ticks)
    @@pagesize 4096
    @@procs                     one /proc/PID/stat line per process of the job (its command line holds JOB/)
    @@nvidia-smi                gpu: nvidia-smi --query-gpu=... --format=csv,noheader,nounits
    @@npu-smi                   npu: npu-smi info (the chip table: health, temperature, AICore, HBM)
    @@hccn                      npu: ``N link status: UP`` per device (hccn_tool -i N -link -g, all at once)
    @@tool-rc 0                 the vendor tool's exit status (124, 137: cut off by ``timeout``)

A record (one JSON line of ``JOB/telemetry/NODE.jsonl``)::

    {"time": epoch s, "node": NODE,
     "processes": {"count": n, "cpu_percent": % of one core (all the job's processes), "rss_mb": MiB},
     "devices": [{"index", "kind": "gpu"|"npu", "utilization_percent", "memory_used_mb", "memory_total_mb",
                  "temperature_c", "health": "ok"|"warning"|"alarm"|"critical"|"unknown",
                  "ecc_uncorrectable": int|None, "link": "up"|"down"|None, "problem": str|None}]}

``link`` is None where the sample did not ask (GPUs; an NPU sample between two that ask the links).

A device of the node's first sample in the job that a later sample's vendor tool no longer lists is a fault
too (a GPU that fell off the bus: nvidia-smi says ``Unable to determine the device handle for GPU ...: GPU is
lost`` instead of its row), unless the tool was cut off by its timeout (then the sample learnt nothing of the
devices).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddp_cluster.accelerators import gpu, npu

# The kernel's USER_HZ: /proc's CPU times are in these ticks; 100 on every Linux ABI the nodes run (x86_64,
# aarch64), whatever the kernel's own HZ.
CLOCK_TICKS = 100
# Seconds one vendor tool may take within a sample before it is cut off (a hung driver holds no sample up),
# and the seconds after which one that ignores SIGTERM is killed: a tool is gone TOOL_TIMEOUT + KILL_AFTER
# seconds after it started, whatever it does (none piles up on a node, sample after sample).
TOOL_TIMEOUT = 10
KILL_AFTER = 2
# timeout's exit status when it cut the tool off (SIGTERM obeyed: 124; SIGKILL after KILL_AFTER: 137).
CUT_OFF = ("124", "137")
HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"
# Health words that are no problem.
HEALTHY = ("ok",)
# Health words that are a problem (said in the record) but no fault that ends the job: npu-smi's Warning is
# its minor alarm (the npu-smi manual's "一般告警": the chip goes on working; Huawei's own fault handling
# leaves minor alarms alone), where Alarm, Critical and any other word (UNKNOWN, NA, Abnormal) are not
# healthy.
TOLERATED = ("ok", "warning")


def sample_script(pattern: str, accelerator: str, links: bool = True) -> str:
    """The ``sh`` command of one sample: ``pattern`` is pgrep's pattern of the job's processes (written so
    that it does not match this command itself: ``[/]workspace/jobs/ID/``); ``accelerator``: cpu, gpu, npu;
    ``links``: npu, each device's link asked too (one hccn_tool per device: the sampler asks every few
    samples, see supervisor.telemetry.LINKS_EVERY)."""
    limit = f'T="timeout -k {KILL_AFTER} {TOOL_TIMEOUT}"; command -v timeout >/dev/null 2>&1 || T=""'
    lines = [
        limit,
        'read -r up _ < /proc/uptime; echo "@@uptime $up"',
        'echo "@@pagesize $(getconf PAGESIZE 2>/dev/null || echo 4096)"',
        "echo @@procs",
        f"for p in $(pgrep -f -- {shlex.quote(pattern)}); do"
        ' { read -r s < "/proc/$p/stat" && echo "$s"; } 2>/dev/null; done',
    ]
    if accelerator == "gpu":
        lines += [
            "echo @@nvidia-smi",
            f"$T {shlex.join(gpu.TELEMETRY_ARGV)} 2>&1",
            'echo "@@tool-rc $?"',
        ]
    elif accelerator == "npu":
        lines += [
            "echo @@npu-smi",
            f'info=$($T {shlex.join(npu.TELEMETRY_ARGV)} 2>&1); rc=$?; printf "%s\\n" "$info"',
            'echo "@@tool-rc $rc"',
        ]
    if accelerator == "npu" and links:
        # Each device's link, for the devices npu-smi lists (a device row's first cell: its id and its name),
        # all at once: the links cost one tool's time bound, however many devices hang.
        lines += [
            "echo @@hccn",
            f"h=$(command -v hccn_tool || echo {HCCN_TOOL})",
            'if [ -x "$h" ]; then for i in $(printf "%s\\n" "$info" | awk -F"|" '
            '\'/Process id/{exit} {n = split($2, a, " ")}'
            " n > 1 && a[1] ~ /^[0-9]+$/ && a[2] !~ /^[0-9]+$/ {print a[1]}'); do"
            ' ( echo "$i $($T "$h" -i "$i" -link -g 2>&1 | head -n 1)" ) & done; wait; fi',
        ]
    return "\n".join(lines) + "\n"


@dataclass
class Process:
    """One process of the job, from its /proc/PID/stat: CPU ticks used (user + system), when it started
    (ticks after boot), its resident pages."""

    pid: int
    ticks: int
    started: int
    rss_pages: int


@dataclass
class Sample:
    """What one node answered (see the module's text)."""

    uptime: float | None = None
    page_size: int = 4096
    processes: list[Process] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)
    # Whether the vendor tool answered (a device it no longer lists is gone), and what it said besides its
    # devices' rows (nvidia-smi's ``... GPU is lost`` lines).
    listed: bool = False
    said: str = ""


def sections(text: str) -> dict[str, list[str]]:
    """The script's output by section name; a section's value after its name (``@@uptime 12.3``) is its
    first line."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in str(text or "").splitlines():
        if line.startswith("@@"):
            name, _, value = line[2:].partition(" ")
            current = found.setdefault(name, [])
            if value:
                current.append(value)
        elif current is not None:
            current.append(line)
    return found


def process(line: str) -> Process | None:
    """A /proc/PID/stat line; None when it is none (the process name, in parentheses, may hold spaces and
    parentheses: the fields after the last ')' are counted)."""
    head, _, rest = line.rpartition(")")
    fields = rest.split()
    pid = head.split(" (", 1)[0].strip()
    # fields[0] is the state (field 3): utime is field 14, stime 15, starttime 22, rss 24.
    if not pid.isdigit() or len(fields) < 22:
        return None
    try:
        return Process(int(pid), int(fields[11]) + int(fields[12]), int(fields[19]), int(fields[21]))
    except ValueError:
        return None


def read_sample(text: str) -> Sample | None:
    """A node's answer to :func:`sample_script`; None when it gave none (it did not answer: no uptime)."""
    parts = sections(text)
    try:
        uptime = float(parts.get("uptime", [""])[0])
    except (ValueError, IndexError):
        return None
    sample = Sample(uptime=uptime)
    page = parts.get("pagesize", [""])[0].strip()
    sample.page_size = int(page) if page.isdigit() else 4096
    sample.processes = [found for line in parts.get("procs", []) if (found := process(line))]
    rc = parts.get("tool-rc", [""])[0].strip()
    sample.listed = ("nvidia-smi" in parts or "npu-smi" in parts) and rc not in CUT_OFF
    if "nvidia-smi" in parts:
        sample.devices = gpu.gpu_telemetry("\n".join(parts["nvidia-smi"]))
        sample.said = "; ".join(gpu.tool_errors("\n".join(parts["nvidia-smi"])))
    if "npu-smi" in parts:
        sample.devices = npu.npu_telemetry("\n".join(parts["npu-smi"]))
        links = {}
        for line in parts.get("hccn", []):
            index, _, said = line.strip().partition(" ")
            if index.isdigit():
                links[int(index)] = npu.link_state(said)
        for device in sample.devices:
            device["link"] = links.get(int(device["index"]))
    for device in sample.devices:
        device["problem"] = problem(device)
    return sample


def problem(device: Mapping[str, Any]) -> str | None:
    """What is wrong with a device now (its health, uncorrectable ECC errors, its link down), or None."""
    said = []
    health = str(device.get("health") or "")
    if health and health not in HEALTHY:
        said.append(f"health {health}")
    ecc = device.get("ecc_uncorrectable")
    if isinstance(ecc, int) and ecc > 0:
        said.append(f"{ecc} uncorrectable ECC error(s)")
    if device.get("link") == "down":
        said.append("link down")
    return "; ".join(said) or None


def cpu_percent(sample: Sample, before: Sample | None) -> float:
    """The job's processes' CPU use (% of one core) since ``before`` (the node's last sample); a process
    ``before`` did not see counts from its start, and with no ``before`` each process since its start."""
    assert sample.uptime is not None
    earlier = {item.pid: item.ticks for item in before.processes} if before else {}
    since = before.uptime if before and before.uptime is not None else None
    total = 0.0
    for item in sample.processes:
        started = item.started / CLOCK_TICKS
        if since is not None and item.pid in earlier:
            used, span = item.ticks - earlier[item.pid], sample.uptime - since
        elif since is not None and started >= since:
            used, span = item.ticks, sample.uptime - since
        else:
            used, span = item.ticks, sample.uptime - started
        if span > 0 and used >= 0:
            total += 100.0 * used / CLOCK_TICKS / span
    return round(total, 2)


def record(node: str, at: float, sample: Sample, before: Sample | None) -> dict[str, Any]:
    """The telemetry record of one node's sample (see the module's text)."""
    rss = sum(item.rss_pages for item in sample.processes) * sample.page_size / 2**20
    return {
        "time": round(at, 3),
        "node": node,
        "processes": {
            "count": len(sample.processes),
            "cpu_percent": cpu_percent(sample, before),
            "rss_mb": round(rss, 1),
        },
        "devices": [dict(device) for device in sample.devices],
    }


TOOLS = {"gpu": "nvidia-smi", "npu": "npu-smi"}


def device_faults(
    first: Mapping[int, Mapping[str, Any]],
    devices: Sequence[Mapping[str, Any]],
    listed: bool = True,
    said: str = "",
) -> list[tuple[int, str]]:
    """The devices that turned bad since ``first`` (each device's first reading in the job): (index, what)
    for a health that was ok (or only a warning, :data:`TOLERATED`) and is neither, uncorrectable ECC errors
    that grew, a link that was up and is down, and, when the vendor tool answered (``listed``), a device it
    no longer lists (``said``: what the tool printed instead, quoted). A device bad from its first reading
    is not one (the health gate and the node checks judge a node before a job; the telemetry names it in its
    records)."""
    found = []
    present = {int(device["index"]) for device in devices}
    for index, then in sorted(first.items()) if listed else ():
        if index not in present:
            tool = TOOLS.get(str(then.get("kind")), "the vendor tool")
            found.append((index, f"no longer listed by {tool}" + (f" ({said[:300]})" if said else "")))
    for device in devices:
        index = int(device["index"])
        then = first.get(index, device)
        said_now = []
        health = str(device.get("health") or "")
        if str(then.get("health") or "") in TOLERATED and health and health not in TOLERATED:
            said_now.append(f"health {health} ({TOOLS.get(str(device.get('kind')), 'the vendor tool')})")
        ecc, before = device.get("ecc_uncorrectable"), then.get("ecc_uncorrectable")
        if isinstance(ecc, int) and ecc > (before if isinstance(before, int) else 0):
            grown = ecc - (before if isinstance(before, int) else 0)
            said_now.append(f"{grown} new uncorrectable ECC error(s) ({ecc} since the driver loaded)")
        if then.get("link") == "up" and device.get("link") == "down":
            said_now.append("link down (hccn_tool)")
        if said_now:
            found.append((index, "; ".join(said_now)))
    return sorted(found)
