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

from ddp_cluster.supervisor.remote import POOL, Mesh

MODULE = "ddp_cluster.supervisor.check"  # job.node_check.CHECK_MODULE
# The line of a node that did not answer (the controller's check names it and says what to do).
NO_ANSWER = "down: no answer over the mesh's ssh from {me}"


def decode(word: str) -> str:
    return base64.b64decode(word.encode()).decode()


def check_all(
    mesh: Mesh, nodes: Sequence[str], first: str, command: str, pool: ThreadPoolExecutor
) -> dict[str, str]:
    """Node -> its command's output: ``first`` on this node, ``command`` on the others, all at once."""
    others = [node for node in nodes if node != mesh.me]
    answers = mesh.run_on(others, command, pool) if others else {}
    said = {node: answers.get(node) or NO_ANSWER.format(me=mesh.me) for node in others}
    if mesh.me in nodes:
        said[mesh.me] = mesh.run(mesh.me, first)
    return {node: said[node] for node in nodes}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", required=True, help="the nodes to check, comma-separated")
    parser.add_argument("--first", required=True, help="this node's command, base64")
    parser.add_argument("--command", required=True, help="every other node's command, base64")
    args = parser.parse_args(argv)
    nodes = list(dict.fromkeys(node for node in args.nodes.split(",") if node))
    mesh = Mesh(socket.gethostname())
    try:
        with ThreadPoolExecutor(max_workers=min(POOL, max(1, len(nodes)))) as pool:
            answers = check_all(mesh, nodes, decode(args.first), decode(args.command), pool)
    finally:
        mesh.close()
    print(json.dumps({"answers": answers}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
