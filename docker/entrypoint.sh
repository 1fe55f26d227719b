#!/bin/sh
# Main process of a ddp-cluster node: sshd on the cluster's shared port (and Slurm's daemons, once configured).
# Host keys are made here, at first start, inside the container, and kept across restarts.
set -eu

port="${DDP_SSH_PORT:-12345}"
listen="${DDP_SSH_LISTEN_ADDRESS:-0.0.0.0}"

case "$port" in
  ''|*[!0-9]*) echo "ddp-node: DDP_SSH_PORT=$port is not a port number" >&2; exit 64 ;;
esac

# Only the host key types the mesh pins (DDP_SSH_HOST_KEY_TYPES, default ed25519), each made once: an RSA key costs
# a quarter of a second of CPU per node at its first start, for nothing when the mesh pins ed25519.
types="${DDP_SSH_HOST_KEY_TYPES:-ed25519}"
host_keys=""
for type in $types; do
  case "$type" in
    ed25519|ecdsa|rsa) ;;
    *) echo "ddp-node: DDP_SSH_HOST_KEY_TYPES names $type: use ed25519, ecdsa or rsa" >&2; exit 64 ;;
  esac
  key="/etc/ssh/ssh_host_${type}_key"
  [ -s "$key" ] || ssh-keygen -q -t "$type" -N '' -f "$key"
  host_keys="${host_keys}HostKey $key
"
done
mkdir -p /run/sshd /etc/ssh/sshd_config.d
# The mesh's shared ssh connections' sockets (ControlPath in the mesh's ssh_config): root's only.
mkdir -p /run/ddp-ssh && chmod 0700 /run/ddp-ssh
printf 'Port %s\nListenAddress %s\n%s' "$port" "$listen" "$host_keys" > /etc/ssh/sshd_config.d/10-ddp-cluster.conf
# The sshd the image build found (on PATH, or the distributions' /usr/sbin): sshd re-executes itself, so by its
# absolute path.
sshd=$(command -v sshd 2>/dev/null || echo /usr/sbin/sshd)
"$sshd" -t || { echo "ddp-node: sshd configuration is invalid ($sshd -t above)" >&2; exit 78; }
# Slurm's daemons, where site.yml has written the cluster's settings (a restarted node): in the background, so
# that sshd does not wait for them; their lines go to Slurm's log directory.
mkdir -p /var/log/slurm && /usr/local/sbin/ddp-slurm-start >> /var/log/slurm/ddp-slurm-start.log 2>&1 &
echo "ddp-node: sshd on $listen:$port"
exec "$sshd" -D -e
