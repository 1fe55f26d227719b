#!/bin/sh
# A server's side of a server-to-server pull (ddp_image_distribute with source): the ephemeral private key on
# stdin into a 0700 work directory, a tunnel to the build server's registry over the cluster's network with its
# host keys pinned, the pull from this server's own loopback (no engine setting), then nothing left.
# Arguments: PORT ADDRESS SSH_PORT USER REFERENCE IMAGE HOST_KEYS (one "TYPE KEY" per line)
set -u
port=$1 address=$2 ssh_port=$3 user=$4 reference=$5 image=$6 known=$7
work=$(mktemp -d /tmp/ddp-pull.XXXXXX) || exit 3
tunnel=
cleanup() { [ -n "$tunnel" ] && kill "$tunnel" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 1' HUP INT TERM PIPE
answers() {  # the registry's API on this machine's loopback port $1
  python3 -c 'import sys, urllib.request; urllib.request.urlopen("http://127.0.0.1:%s/v2/" % sys.argv[1], timeout=2)' \
    "$1" 2>/dev/null
}
umask 077
cat > "$work/key"
printf '%s\n' "$known" | sed 's/^/ddp-image-build /' > "$work/known_hosts"
set -- -N -i "$work/key" -o IdentitiesOnly=yes -o IdentityAgent=none -o BatchMode=yes \
  -o UserKnownHostsFile="$work/known_hosts" -o GlobalKnownHostsFile=/dev/null -o HostKeyAlias=ddp-image-build \
  -o StrictHostKeyChecking=yes -o ExitOnForwardFailure=yes -o ConnectTimeout=30 -o ServerAliveInterval=15 \
  -o ServerAliveCountMax=4 -p "$ssh_port" -L "127.0.0.1:$port:127.0.0.1:$port"
[ -n "$user" ] && set -- "$@" -l "$user"
# shellcheck disable=SC2029  # -N: no remote command at all
ssh "$@" "$address" 2> "$work/tunnel.err" &
tunnel=$!
tries=0
until answers "$port"; do
  tries=$((tries + 1))
  if ! kill -0 "$tunnel" 2>/dev/null || [ "$tries" -gt 150 ]; then
    echo "tunnel: $(tail -n 3 "$work/tunnel.err" | tr '\n' ' ')" >&2
    exit 4
  fi
  sleep 0.2
done
docker pull "$reference" && docker tag "$reference" "$image" && docker rmi "$reference" >/dev/null
