#!/bin/sh
# What ascend-docker-runtime's installer does to a server's Docker engine (install/process/docker_process.go,
# build/scripts/run_main.sh): the `ascend` runtime registered in /etc/docker/daemon.json and made the default
# runtime, then the engine told to reload (dockerd rereads its runtimes on SIGHUP). The runtime itself (the
# stand-in, sim/ascend/ascend-docker-runtime) and its base.list are put in place by dress.sh on every server;
# only the servers a test picks get it registered.
set -eu
runtime=/usr/local/Ascend/Ascend-Docker-Runtime/ascend-docker-runtime
python3 - "$runtime" <<'PY'
import json, sys
from pathlib import Path
path = Path("/etc/docker/daemon.json")
daemon = json.loads(path.read_text()) if path.exists() and path.read_text().strip() else {}
daemon.setdefault("runtimes", {})["ascend"] = {"path": sys.argv[1], "runtimeArgs": []}
daemon["default-runtime"] = "ascend"
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(json.dumps(daemon, indent=4) + "\n")
PY
kill -HUP "$(cat /var/run/docker.pid)"
