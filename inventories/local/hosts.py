#!/usr/bin/env python3
"""Local inventory: N "nodes", each a container on this machine's Docker engine.

The node count is the one setting: DDP_LOCAL_NODES (default 2), e.g.
`DDP_LOCAL_NODES=16 ansible-playbook site.yml`. Every node's tasks run on this machine (connection local);
each node is the container named after it.
"""

import json
import os
import sys

DEFAULT_NODES = 2
MAX_NODES = 64


def node_count() -> int:
    raw = os.environ.get("DDP_LOCAL_NODES", str(DEFAULT_NODES))
    try:
        count = int(raw)
    except ValueError:
        sys.exit(f"DDP_LOCAL_NODES={raw!r} is not a whole number: set it to the node count, 1 to {MAX_NODES}")
    if not 1 <= count <= MAX_NODES:
        sys.exit(f"DDP_LOCAL_NODES={count} is out of range: set it to 1 to {MAX_NODES}")
    return count


def inventory() -> dict[str, object]:
    hosts = [f"node{index}" for index in range(node_count())]
    return {
        "nodes": {"hosts": hosts},
        "_meta": {
            "hostvars": {
                host: {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                }
                for host in hosts
            }
        },
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--host":
        print(json.dumps({}))
    else:
        print(json.dumps(inventory(), indent=2))
