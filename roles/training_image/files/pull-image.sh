#!/bin/sh
# A server's side of the node image's distribution (ddp_image_distribute), run over the controller's ssh: the
# image pulled by the push's digest, its ID checked against the built image's, then named as the builder names
# it; nothing of the registry left (its name, its login, the tunnel).
# Arguments: PULLED (REGISTRY/NAME@sha256:...) IMAGE (NAME:TAG) IMAGE_ID, then, for a registry on the build
# server, PORT ADDRESS SSH_PORT USER HOST_KEYS (one "TYPE KEY" per line) of the tunnel to it over the cluster's
# network (the ephemeral key's forward, its host keys pinned), and REMOTE_PORT, the registry's port there when it
# is not PORT (a tier-1 server's cache); for the controller's registry, PORT alone: the port this session's
# ssh -R forwards to it. The login goes to PORT only once its listener is this pull's tunnel (exit 6 otherwise,
# naming the process that holds it).
# stdin: the registry's login (base64 of USER:PASSWORD; an empty line: this server's own docker login, for the
# user's registry), then, with a tunnel, its private key. Neither is ever in an argv: node containers on the
# host network share this server's loopback, not its processes' files.
set -u
pulled=$1 image=$2 expected=$3 port=${4:-} address=${5:-} ssh_port=${6:-} user=${7:-} known=${8:-}
remote_port=${9:-$port}
registry=${pulled%%/*}
work=$(mktemp -d /tmp/ddp-pull.XXXXXX) || exit 3
tunnel=
cleanup() { [ -n "$tunnel" ] && kill "$tunnel" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 1' HUP INT TERM PIPE
# The loopback's listeners' functions (answers, holder, taken, unheld, owned): the sender puts them here
# (ddp_cluster.image.distribute.with_listeners).
# @loopback listeners@
umask 077
IFS= read -r auth || auth=
if [ -n "$auth" ]; then
  mkdir "$work/docker"
  printf '{"auths": {"%s": {"auth": "%s"}}}\n' "$registry" "$auth" > "$work/docker/config.json"
  DOCKER_CONFIG=$work/docker
  export DOCKER_CONFIG
fi
if [ -n "$address" ]; then
  unheld "$port" "this pull's tunnel to the build server (ssh -L)"
  cat > "$work/key"
  printf '%s\n' "$known" | sed 's/^/ddp-image-build /' > "$work/known_hosts"
  set -- -N -i "$work/key" -o IdentitiesOnly=yes -o IdentityAgent=none -o BatchMode=yes \
    -o UserKnownHostsFile="$work/known_hosts" -o GlobalKnownHostsFile=/dev/null -o HostKeyAlias=ddp-image-build \
    -o StrictHostKeyChecking=yes -o ExitOnForwardFailure=yes -o ConnectTimeout=30 -o ServerAliveInterval=15 \
    -o ServerAliveCountMax=4 -p "$ssh_port" -L "127.0.0.1:$port:127.0.0.1:$remote_port"
  [ -n "$user" ] && set -- "$@" -l "$user"
  # shellcheck disable=SC2029  # -N: no remote command at all
  ssh "$@" "$address" 2> "$work/tunnel.err" &
  tunnel=$!
  if ! owned "$port" "$tunnel" "this pull's tunnel to the build server (ssh -L, pid $tunnel)"; then
    echo "tunnel: $(tail -n 3 "$work/tunnel.err" | tr '\n' ' ')" >&2
    exit 4
  fi
  # The controller holds the build server's gate until this line: this pull's handshakes with its sshd are over.
  echo "tunnel: up"
elif [ -n "$port" ]; then
  if ! owned "$port" ancestors "this session's sshd (the controller's ssh -R to its registry)"; then
    echo "tunnel: nothing answers on port $port of this server's loopback: the controller's ssh -R did not open it (is TCP forwarding allowed by this server's sshd?)" >&2
    exit 4
  fi
fi
docker pull "$pulled" || exit 1
got=$(docker image inspect --format '{{.Id}}' "$pulled") || exit 3
if [ "$got" != "$expected" ]; then
  docker rmi "$pulled" >/dev/null 2>&1
  echo "error: the image pulled by digest ($pulled) has the ID $got, not $expected, the ID of the image built ($image): the registry served another image; it was removed again and nothing was named $image"
  exit 5
fi
docker tag "$got" "$image" && docker rmi "$pulled" >/dev/null || exit 3
echo "pulled: $pulled"
echo "image_id: $got"
