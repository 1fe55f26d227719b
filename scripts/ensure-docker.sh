#!/usr/bin/env bash
# Make sure a Docker engine answers: install it where dockerd is missing (scripts/install-tool.sh: docker.io with
# apt-get, docker or moby-engine with dnf, as root), and start the engine, with the service manager where there is
# one, else dockerd in the background.
set -euo pipefail

log=${DOCKERD_LOG:-/var/log/ddp-cluster-dockerd.log}

if docker info >/dev/null 2>&1; then
  echo "docker engine: running"
  exit 0
fi
need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "docker engine: $1 needs root; run 'sudo make docker' or start the engine yourself" >&2
    exit 1
  fi
}
if ! command -v dockerd >/dev/null 2>&1; then
  "$(dirname "$0")/install-tool.sh" dockerd
fi
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  need_root "starting docker"
  systemctl start docker
else
  need_root "starting dockerd"
  echo "docker engine: no service manager, starting dockerd in the background (log: $log)"
  nohup dockerd >"$log" 2>&1 </dev/null &
fi
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    echo "docker engine: running"
    exit 0
  fi
  sleep 1
done
echo "docker engine: did not answer within 60 s; see $log" >&2
exit 1
