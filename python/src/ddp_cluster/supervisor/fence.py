"""One supervisor per job, by construction: a generation that a supervisor wins on a majority of the job's
voters before it acts, and that every node checks before it obeys.

Every node keeps, in the job's directory, ``supervisor.json``: ``{"generation": G, "node": N, "at": T}``, the
newest generation it granted and to whom (none: generation 0, the start's: the job's first node holds it). A
supervisor that is about to restart the job (after a lost node) or to take it over (the standby, its first
node unheard) first asks every voter for generation G+1 (G: the newest it knows). A node grants it, under a
lock, only when G+1 is above the generation it holds (or the same node asks again for the one it holds): two
supervisors that ask for the same generation never both get one node. The asker **wins** with:

- more than half of the voters; or
- exactly half and no refusal, when it already holds the job (the first node, or the supervisor of the last
  generation): with an even split the side that ran the job keeps it; the other side wins a tie only when
  every voter that did not answer is proven gone (its name no longer resolves, or its address does not route:
  the container or the server is no more), never on silence alone.

The voters are the job's nodes, plus its first spare when they are even (an odd count has no tie): both sides
of a cut compute the same set from the job's plan. A supervisor that loses steps down: it stops its ranks on
its own node, changes nothing elsewhere, writes in its status who holds the job (the controller follows the
job there), and ends without releasing the job's claims (they are the new supervisor's).

Between two elections, every command a supervisor sends to another node that changes the job there
(checkpoint copies and their prunes, the sweep of the job's processes) is prefixed with :func:`guard`: the
node runs it only while no newer generation than the sender's was granted there. A supervisor cut off from
a majority learns it at its next election (its restart), and its commands are refused meanwhile wherever the
new supervisor has been.

    python -m ddp_cluster.supervisor.fence --job-dir JOB --ask G --node N    # one JSON line: granted or not
    python -m ddp_cluster.supervisor.fence --job-dir JOB --holds G --node N  # exit 0 while not superseded

Standard library only (it runs in the node image's Python, beside the job).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_cluster.files import write_atomic

RECORD = "supervisor.json"
LOCK = ".supervisor.lock"
# Seconds a grant waits for the record's lock: a holder reads and writes one small file.
LOCK_WAIT = 5.0
MODULE = "ddp_cluster.supervisor.fence"
NODE_ENV = "/etc/ddp-cluster/env.sh"
# What ssh says when a node is proven gone, not merely silent: its name no longer resolves (a container that
# is no more leaves the network's names), or its address does not route (no host answers for it).
GONE_SIGNS = ("Could not resolve hostname", "No route to host", "Name or service not known")


@dataclass(frozen=True)
class Held:
    """The generation a node granted, and to whom ('' and 0: none granted: the start's)."""

    generation: int = 0
    node: str = ""


def read(job_dir: Path) -> Held:
    """This node's record; an absent or unreadable one is generation 0 (the start's)."""
    try:
        return parse_record((job_dir / RECORD).read_text(encoding="utf-8"))
    except OSError:
        return Held()


def parse_record(text: str) -> Held:
    """A record's text (:data:`RECORD`, this node's or another's) as the Held it says; anything else is
    generation 0 (the start's)."""
    try:
        data = json.loads(text)
    except ValueError:
        return Held()
    if not isinstance(data, Mapping):
        return Held()
    generation = data.get("generation", 0)
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        generation = 0
    return Held(generation, str(data.get("node") or ""))


@contextlib.contextmanager
def _locked(job_dir: Path, wait: float) -> Iterator[None]:
    job_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle = os.open(job_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{job_dir / LOCK} did not come free within {wait:g} s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(handle)


def ask(job_dir: Path, generation: int, node: str, wait: float = LOCK_WAIT) -> dict[str, Any]:
    """Grant ``generation`` to ``node`` here when it is newer than the one granted (or the same node's):
    ``{"granted": bool, "generation": G, "node": N}`` with what this node holds after."""
    with _locked(job_dir, wait):
        held = read(job_dir)
        if generation > held.generation or (generation == held.generation and node == held.node):
            data = {"generation": generation, "node": node, "at": round(time.time(), 3)}
            write_atomic(job_dir / RECORD, (json.dumps(data) + "\n").encode())
            return {"granted": True, "generation": generation, "node": node}
        return {"granted": False, "generation": held.generation, "node": held.node}


def holds(job_dir: Path, generation: int, node: str) -> bool:
    """Whether (``generation``, ``node``) is not superseded here: nothing newer was granted to another."""
    held = read(job_dir)
    return held.generation < generation or (held.generation == generation and held.node in ("", node))


def guard(job_dir: str, generation: int, node: str) -> str:
    """The shell prefix that runs what follows it on a node only while (``generation``, ``node``) is not
    superseded there (``&&`` ends it)."""
    return (
        f"python -m {MODULE} --job-dir {shlex.quote(job_dir)} --holds {generation}"
        f" --node {shlex.quote(node)} && "
    )


def voters(nodes: Sequence[str], spares: Sequence[str]) -> list[str]:
    """Who votes: the job's nodes, plus its first spare when they are even (no tie then)."""
    return list(dict.fromkeys([*nodes, *(spares[:1] if len(nodes) % 2 == 0 else [])]))


@dataclass
class Election:
    """What an ask for ``generation`` on ``voters`` came to."""

    generation: int
    voters: list[str]
    granted: list[str] = field(default_factory=list)
    refused: dict[str, Held] = field(default_factory=dict)
    silent: list[str] = field(default_factory=list)
    won: bool = False

    def winner(self) -> str:
        """The node that holds the newest generation among the refusals ('' when none refused)."""
        if not self.refused:
            return ""
        return max(self.refused.values(), key=lambda held: held.generation).node

    def describe(self) -> str:
        said = f"generation {self.generation}: {len(self.granted)} of {len(self.voters)} voters granted it"
        if self.refused:
            said += "; refused by " + ", ".join(
                f"{node} (holds generation {held.generation} of {held.node or 'the start'})"
                for node, held in sorted(self.refused.items())
            )
        if self.silent:
            said += f"; no answer from {', '.join(self.silent)}"
        return said


def judge(election: Election, holder: bool, gone: Callable[[str], bool]) -> Election:
    """Whether ``election`` is won (see the module): a majority; or exactly half, nothing refused, and either
    ``holder`` (this supervisor ran the job) or every silent voter ``gone``."""
    votes, count = len(election.granted), len(election.voters)
    # a newer generation granted somewhere: a newer election was held (a majority at one generation is one
    # asker's alone: each node grants it once; a refusal at the same generation does not undo a majority)
    newer = any(held.generation > election.generation for held in election.refused.values())
    if newer or votes == 0:
        election.won = False
    elif 2 * votes > count:
        election.won = True
    elif 2 * votes == count and not election.refused:
        election.won = holder or all(gone(node) for node in election.silent)
    else:
        election.won = False
    return election


def ask_command(job_dir: str, generation: int, node: str) -> str:
    return (
        f". {NODE_ENV} && python -m {MODULE} --job-dir {shlex.quote(job_dir)} --ask {generation}"
        f" --node {shlex.quote(node)}"
    )


def parse(answer: str) -> Held | bool | None:
    """A node's answer to :func:`ask_command`: True when granted, the Held that refused it, None when none."""
    for line in reversed(answer.splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, Mapping) and "granted" in data:
            if data["granted"] is True:
                return True
            generation = data.get("generation")
            generation = generation if isinstance(generation, int) and not isinstance(generation, bool) else 0
            return Held(generation, str(data.get("node") or ""))
    return None


def elect(
    run_on: Callable[[Sequence[str], str], Mapping[str, str]],
    job_dir: str,
    me: str,
    generation: int,
    voting: Sequence[str],
    holder: bool,
    gone: Callable[[str], bool],
    unheard: Sequence[str] = (),
) -> Election:
    """Ask every voter at once (``run_on``: node -> output, '' where it did not answer) and judge it; the
    voters in ``unheard`` (taken for lost already: a frozen one would hold the asker until its command's
    bound) are silent without being asked."""
    election = Election(generation, list(voting))
    asked = [node for node in voting if node not in unheard]
    answers = run_on(asked, ask_command(job_dir, generation, me)) if asked else {}
    for node in voting:
        found = parse(answers.get(node, ""))
        if found is True:
            election.granted.append(node)
        elif isinstance(found, Held):
            election.refused[node] = found
        else:
            election.silent.append(node)
    return judge(election, holder, gone)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--job-dir", type=Path, required=True)
    parser.add_argument("--node", required=True)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--ask", type=int, help="grant this generation to --node here, if it is newer")
    action.add_argument("--holds", type=int, help="exit 0 while this generation of --node is not superseded")
    args = parser.parse_args(argv)
    if args.holds is not None:
        if holds(args.job_dir, args.holds, args.node):
            return 0
        held = read(args.job_dir)
        print(
            f"superseded: {args.node}'s generation {args.holds} of the job's supervisor is older than"
            f" generation {held.generation} of {held.node} on this node: refused",
            file=sys.stderr,
        )
        return 3
    try:
        answer = ask(args.job_dir, args.ask, args.node)
    except (OSError, TimeoutError) as error:
        print(json.dumps({"error": str(error)}))
        return 1
    print(json.dumps(answer, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
