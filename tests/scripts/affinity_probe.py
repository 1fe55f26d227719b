"""A user's script that reports where its rank may run: `affinity-probe {json}` with the node, the rank, the
local rank, os.sched_getaffinity and what `taskset -p` says of the rank's own process."""

import json
import os
import socket
import subprocess

taskset = subprocess.run(["taskset", "-cp", str(os.getpid())], capture_output=True, text=True, check=False)
report = {
    "node": socket.gethostname(),
    "rank": int(os.environ["RANK"]),
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "affinity": sorted(os.sched_getaffinity(0)),
    "taskset": taskset.stdout.strip() or taskset.stderr.strip(),
}
print("affinity-probe " + json.dumps(report), flush=True)
