#!/usr/bin/env python3
"""Inventory of DDP_VIRTUAL_SERVERS virtual servers (default 2) for the controller benchmark: vs0, vs1, ... at
10.64.0.1, 10.64.0.2, ... (contiguous, so the peers collapse to a few networks as on a real rack), reached
through the ddp_virtual connection (bench/plugins/connection) and, for commands the controller runs itself
over ssh, the ssh stand-in bin/ssh. The cluster's settings are group_vars/ beside this file (the sim's shape).
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIRST = ipaddress.ip_address("10.64.0.1")


def inventory(count: int) -> dict[str, object]:
    hosts = [f"vs{index}" for index in range(count)]
    return {
        "all": {"children": ["nodes"]},
        "nodes": {
            "hosts": hosts,
            "vars": {
                "ansible_connection": "ddp_virtual",
                "ansible_python_interpreter": "/usr/bin/python3",
                "ansible_ssh_executable": str(HERE / "bin" / "ssh"),
                "ansible_user": "root",
            },
        },
        "_meta": {
            "hostvars": {host: {"ansible_host": str(FIRST + index)} for index, host in enumerate(hosts)}
        },
    }


def main() -> int:
    count = int(os.environ.get("DDP_VIRTUAL_SERVERS", "2"))
    if "--host" in sys.argv:
        print("{}")
        return 0
    print(json.dumps(inventory(count)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
