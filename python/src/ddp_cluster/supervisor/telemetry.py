"""The job's telemetry, sampled by its supervisor: every ``telemetry_interval`` seconds each node of the job
runs one command (:func:`ddp_cluster.accelerators.telemetry.sample_script`: the job's processes' CPU and
memory, the devices' utilisation, memory, temperature, health, ECC errors and links), all nodes at once, and
its record goes to ``JOB/telemetry/NODE.jsonl`` on this node (the first).

A :class:`Sampler` runs in a thread of its own, so that a slow node or a hung vendor tool never holds the
supervisor's watch up (each command is bounded: ssh's connect timeout, the tools' own ``timeout``, the
whole command's). A device that turned bad during the job (:func:`~ddp_cluster.accelerators.telemetry.
device_faults`: its health no longer OK, new uncorrectable ECC errors, an NPU link down, a device its
vendor tool no longer lists) is kept as the sampler's :meth:`~Sampler.fault`, which the watch reads at its
next poll and ends the attempt with. A fault that kills the ranks at once ends the launcher before the next
sample: the watch then asks for one sample there and then (:meth:`~Sampler.check`, bounded) before it
judges the launcher's failure.

Standard library only: it runs in the node image beside the job.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_cluster.accelerators import telemetry
from ddp_cluster.supervisor.remote import COMMAND_TIMEOUT, POOL, pattern

FOLDER = "telemetry"
# Seconds one node's sample may take in all (its vendor tools are bounded on their own, see
# accelerators.telemetry.TOOL_TIMEOUT): the mesh's bound of a command.
SAMPLE_TIMEOUT = float(COMMAND_TIMEOUT)
# An NPU node's links are asked every this many samples (one hccn_tool per device costs more than the rest
# of a sample): a link that goes down is seen within LINKS_EVERY x telemetry_interval seconds.
LINKS_EVERY = 4
# Seconds the supervisor's end waits for a sample under way.
STOP_WAIT = 2.0
# Seconds a check (one sample when the launcher failed) may take beyond the sample's own bound (the mesh's
# command timeout) before the watch goes on without it: the launcher's failure is judged within
# SAMPLE_TIMEOUT + CHECK_GRACE seconds, whatever a node's tools do.
CHECK_GRACE = 3.0
UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")

# (node, command, timeout) -> what the command printed ('' when the node did not answer).
Runner = Callable[[str, str, float], str]


def file_name(node: str) -> str:
    """A node's telemetry file name: NODE.jsonl, any character outside [A-Za-z0-9_.-] replaced by '_'."""
    return UNSAFE_NAME.sub("_", node) + ".jsonl"


@dataclass(frozen=True)
class DeviceFault:
    """A device that turned bad during the job: where, which, and what its tools said."""

    node: str
    device: int
    problem: str
    at: float


class Sampler:
    """Samples ``nodes()`` (the current attempt's) every ``interval`` seconds into ``job_dir/telemetry/``."""

    def __init__(
        self,
        job_dir: Path,
        nodes: Callable[[], Sequence[str]],
        accelerator: str,
        tag: str,
        interval: float,
        run: Runner,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.folder = job_dir / FOLDER
        self.nodes = nodes
        self.interval = interval
        self.run = run
        self.clock = clock
        self.commands = (
            telemetry.sample_script(pattern(tag), accelerator, links=True),
            telemetry.sample_script(pattern(tag), accelerator, links=False),
        )
        self.rounds = 0
        self.timeout = SAMPLE_TIMEOUT
        self._before: dict[str, telemetry.Sample] = {}  # each node's last sample (CPU use since then)
        self._first: dict[str, dict[int, dict[str, Any]]] = {}  # each device's first reading in the job
        self._fault: DeviceFault | None = None
        self._lock = threading.Lock()
        self._noting = threading.Lock()  # the periodic sample and a check note their readings in turn
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the thread ------------------------------------------------------------------------------------
    def start(self) -> Sampler:
        """Start sampling (once; a second call does nothing)."""
        if self.interval > 0 and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling; a sample under way is not waited for long (the thread is a daemon: it ends with
        the supervisor)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=STOP_WAIT)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.sample()
            except Exception as error:  # a sample that fails is lost, never the job
                print(f"telemetry: a sample failed: {error}", flush=True)
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    # --- one sample ------------------------------------------------------------------------------------
    def sample(self, links: bool | None = None) -> list[dict[str, Any]]:
        """Sample every node once, in parallel; the records written (one per node that answered and is still
        in the job). ``links``: ask the NPU links (None: every :data:`LINKS_EVERY` samples)."""
        nodes = list(self.nodes())
        if not nodes:
            return []
        if links is None:
            links = self.rounds % LINKS_EVERY == 0
            self.rounds += 1
        command = self.commands[0 if links else 1]
        with ThreadPoolExecutor(max_workers=min(POOL, len(nodes))) as pool:
            answers = list(pool.map(lambda node: self.run(node, command, self.timeout), nodes))
        at = self.clock()
        self.folder.mkdir(parents=True, exist_ok=True)
        written = []
        with self._noting:
            current = set(self.nodes())  # a node that left the job meanwhile (drained) is not noted
            for node, text in zip(nodes, answers, strict=True):
                sample = telemetry.read_sample(text)
                if sample is None or node not in current:
                    continue  # no answer: the liveness watch judges the node, not the telemetry
                written.append(self.note(node, at, sample))
        return written

    def check(self) -> DeviceFault | None:
        """The fault known, else one sample now (the links asked too) and the fault it found: what the watch
        asks when the launcher failed, as a device fault kills the ranks within milliseconds, before the next
        periodic sample. Bounded: it waits at most ``timeout`` + :data:`CHECK_GRACE` seconds for the sample
        (which goes on in a daemon thread past that, noting what it finds). None with the telemetry off."""
        if self.interval <= 0:
            return None
        if (found := self.fault()) is not None:
            return found
        worker = threading.Thread(target=self._check, name="telemetry-check", daemon=True)
        worker.start()
        worker.join(timeout=self.timeout + CHECK_GRACE)
        return self.fault()

    def _check(self) -> None:
        try:
            self.sample(links=True)
        except Exception as error:  # a check that fails finds nothing
            print(f"telemetry: a sample failed: {error}", flush=True)

    def note(self, node: str, at: float, sample: telemetry.Sample) -> dict[str, Any]:
        """One node's sample: its record appended to its file, its devices checked against their first
        reading."""
        record = telemetry.record(node, at, sample, self._before.get(node))
        self._before[node] = sample
        with open(self.folder / file_name(node), "a", encoding="utf-8") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")
        first = self._first.setdefault(node, {})
        faults = telemetry.device_faults(first, sample.devices, sample.listed, sample.said)
        for device in sample.devices:
            base = first.setdefault(int(device["index"]), dict(device))
            if base.get("link") is None and device.get("link") is not None:
                base["link"] = device["link"]  # its first sample that asked the links
        if faults:
            with self._lock:
                if self._fault is None or self._fault.node not in self.nodes():
                    index, problem = faults[0]
                    self._fault = DeviceFault(node, index, problem, at)
        return record

    # --- what the watch reads --------------------------------------------------------------------------
    def fault(self) -> DeviceFault | None:
        """The first device that turned bad, if one did (until :meth:`forget`), on a node still in the job
        (a sample that finished while its node was being drained found nothing for this attempt)."""
        with self._lock:
            if self._fault is not None and self._fault.node not in self.nodes():
                self._fault = None
            return self._fault

    def forget(self, node: str) -> None:
        """The fault found, and ``node``'s readings, forgotten: the node left the job (drained)."""
        with self._lock:
            self._fault = None
        self._before.pop(node, None)
        self._first.pop(node, None)
