#!/bin/sh
# Main process of a ddp-cluster node: sshd on the cluster's shared port.
# Host keys are made here, at first start, inside the container, and kept across restarts.
set -eu

port="${DDP_SSH_PORT:-12345}"
listen="${DDP_SSH_LISTEN_ADDRESS:-0.0.0.0}"

case "$port" in
  ''|*[!0-9]*) echo "ddp-node: DDP_SSH_PORT=$port is not a port number" >&2; exit 64 ;;
esac

ssh-keygen -A >/dev/null
mkdir -p /run/sshd /etc/ssh/sshd_config.d
cat > /etc/ssh/sshd_config.d/10-ddp-cluster.conf <<CONF
Port $port
ListenAddress $listen
CONF
/usr/sbin/sshd -t || { echo "ddp-node: sshd configuration is invalid (sshd -t above)" >&2; exit 78; }
echo "ddp-node: sshd on $listen:$port"
exec /usr/sbin/sshd -D -e
