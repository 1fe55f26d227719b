"""The check before a job, made by its first node for every node: one call from the controller, whatever the
node count (the ``ddp_job_node`` action runs this module in the first node's container).

This node runs its own command (``--first``: it also looks at the master port and the listen backlog) in its
shell; every other node runs ``--command`` over the mesh, all at once (:meth:`Mesh.run_on`: ssh sessions on
the mesh's shared connections, or past ``TREE_ABOVE`` nodes down the tree of relays). One JSON line comes
back, ``{"answers": {node: what its command printed}}``; a node that did not answer gets
:data:`NO_ANSWER`'s line, which the controller's check (:func:`ddp_cluster.job.node_check.problems`) turns
into the node's problem and its fix.

    python -m ddp_cluster.supervisor.check --nodes N1,N2,... --first B64 --command B64

Standard library only (the node's Python).
"""

from __future__ import annotations

import argparse
import base64
import json
import socket
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ddp_cluster.supervisor.remote import COMMAND_TIMEOUT, FRESH, POOL, Mesh

MODULE = "ddp_cluster.supervisor.check"  # job.node_check.CHECK_MODULE
# The line of a node that did not answer (the controller's check names it and says what to do), with ssh's
# own words where a second try gives them (a changed host key, a refused connection, a timeout).
NO_ANSWER = "down: no answer over the mesh's ssh from {me}"
# The first node's own line when its check did not end within the mesh's command bound.
NO_ANSWER_HERE = "down: its own check did not answer within {seconds} s"


def decode(word: str) -> str:
    return base64.b64decode(word.encode()).decode()


def reason(mesh: Mesh, node: str) -> str:
    """Why ``node`` does not answer, in ssh's words ('' when it does now): a login of its own (not the shared
    connection, which may be the one that hangs), bounded."""
    return mesh.send(node, "true", b"", mesh.ssh_timeout + 5, FRESH)


def check_all(
    mesh: Mesh, nodes: Sequence[str], first: str, command: str, pool: ThreadPoolExecutor
) -> dict[str, str]:
    """Node -> its command's output: ``first`` on this node, ``command`` on the others, all at once. A node
    whose answer lacks the command's last word (``up``) is tried once more on a fresh ssh login
    (:meth:`Mesh.send`), for ssh's reason."""
    others = [node for node in nodes if node != mesh.me]
    answers = mesh.run_on(others, command, pool) if others else {}
    silent = [node for node in others if "up" not in (answers.get(node) or "").splitlines()]

    def why(node: str) -> str:
        said = reason(mesh, node)
        return NO_ANSWER.format(me=mesh.me) + (f": {said}" if said else " (it answers now: try again)")

    reasons = dict(zip(silent, pool.map(why, silent), strict=True))
    said = {node: reasons.get(node) or answers.get(node) or "" for node in others}
    if mesh.me in nodes:
        said[mesh.me] = mesh.run(mesh.me, first) or NO_ANSWER_HERE.format(seconds=COMMAND_TIMEOUT)
    return {node: said[node] for node in nodes}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", required=True, help="the nodes to check, comma-separated")
    parser.add_argument("--me", default="", help="this node's name in the plan (default: its hostname)")
    parser.add_argument("--first", required=True, help="this node's command, base64")
    parser.add_argument("--command", required=True, help="every other node's command, base64")
    args = parser.parse_args(argv)
    nodes = list(dict.fromkeys(node for node in args.nodes.split(",") if node))
    mesh = Mesh(args.me or socket.gethostname())
    try:
        with ThreadPoolExecutor(max_workers=min(POOL, max(1, len(nodes)))) as pool:
            answers = check_all(mesh, nodes, decode(args.first), decode(args.command), pool)
    finally:
        mesh.close()
    print(json.dumps({"answers": answers}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
