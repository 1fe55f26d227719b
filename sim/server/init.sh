#!/bin/sh
# Boot of a simulated server: what the service manager of a real one would start. Host keys are made at first
# boot and kept; /proc/sys is writable as on a real machine (Docker mounts it read-only in containers); ufw
# loads its rules; the Docker engine starts in the background; sshd is the main process, so stopping the engine
# (a test does) leaves the server reachable.
set -eu

mount -o remount,rw /proc/sys 2>/dev/null || echo "sim-server: /proc/sys stays read-only" >&2
ssh-keygen -A >/dev/null
mkdir -p /run/sshd

if [ ! -e /var/lib/ddp-sim/firewall-configured ]; then
  ufw default deny incoming >/dev/null
  ufw default allow outgoing >/dev/null
  ufw allow 22/tcp >/dev/null
  touch /var/lib/ddp-sim/firewall-configured
fi
ufw --force enable >/dev/null || echo "sim-server: ufw did not start" >&2

/opt/ddp-sim/ascend/dress.sh || echo "sim-server: the Ascend dressing failed" >&2

# A stale pid file from a killed server would stop the engine from starting again.
rm -f /var/run/docker.pid /run/docker/containerd/containerd.pid
nohup dockerd --host=unix:///var/run/docker.sock >/var/log/dockerd.log 2>&1 </dev/null &

exec /usr/sbin/sshd -D -e
