#!/bin/sh
# The build server's side of a server-to-server distribution (ddp_image_distribute with source; run over the
# controller's ssh session, which lives as long as the distribution): Docker's Distribution registry on this
# server's loopback, the image pushed into it, an ephemeral key authorized for nothing but a forward to that
# port, this server's host keys said for the others to pin; then it waits for the session's stdin to close and
# leaves nothing: registry stopped, key deauthorized, work directory removed (also on a signal or a lost session).
# Arguments: PORT STORAGE IMAGE REFERENCE REGISTRY_COMMAND PUBLIC_KEY KEY_COMMENT
set -u
port=$1 storage=$2 image=$3 reference=$4 command=$5 key=$6 comment=$7
keys=$HOME/.ssh/authorized_keys
work=$(mktemp -d /tmp/ddp-registry.XXXXXX) || exit 3
registry=
cleanup() {
  [ -n "$registry" ] && kill "$registry" 2>/dev/null && wait "$registry" 2>/dev/null
  [ -f "$keys" ] && sed -i "/ $comment\$/d" "$keys"
  docker rmi "$reference" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' HUP INT TERM PIPE
answers() {  # the registry's API on this machine's loopback port $1
  python3 -c 'import sys, urllib.request; urllib.request.urlopen("http://127.0.0.1:%s/v2/" % sys.argv[1], timeout=2)' \
    "$1" 2>/dev/null
}
say() { printf '%s\n' "$*"; }
found=$(command -v "$command" || command -v docker-registry || command -v registry) || {
  say "error: Docker's Distribution registry ($command) is not installed on this build server: the hosts stage installs it (apt-get install docker-registry), or install it by hand"
  exit 3
}
if python3 -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1])))' "$port" 2>/dev/null; then :; else
  say "error: port $port on the build server's loopback is taken, so the image registry cannot start there: set cluster_registry_port to a free port"
  exit 3
fi
mkdir -p "$storage" && chmod 0700 "$storage"
printf 'version: 0.1\nlog:\n  level: info\n  formatter: text\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:%s\n  headers:\n    X-Content-Type-Options: [nosniff]\n' "$storage" "$port" > "$work/config.yml"
"$found" serve "$work/config.yml" > "$work/registry.log" 2>&1 </dev/null &
registry=$!
tries=0
until answers "$port"; do
  tries=$((tries + 1))
  if ! kill -0 "$registry" 2>/dev/null || [ "$tries" -gt 150 ]; then
    say "error: the image registry did not start on the build server: $(tail -n 3 "$work/registry.log" | tr '\n' ' ')"
    exit 3
  fi
  sleep 0.2
done
docker tag "$image" "$reference" || { say "error: cannot tag $image as $reference on the build server"; exit 3; }
docker push "$reference" > "$work/push.log" 2>&1 || {
  say "error: the push of $reference on the build server failed: $(tail -n 2 "$work/push.log" | tr '\n' ' ')"
  exit 3
}
say "pushed: $(grep -c ': Pushed$' "$work/push.log")"
mkdir -p "$HOME/.ssh" && chmod 0700 "$HOME/.ssh"
sed -i "/ ddp-cluster-image-[0-9a-f]*\$/d" "$keys" 2>/dev/null
printf 'restrict,port-forwarding,permitopen="127.0.0.1:%s",command="/bin/false" %s\n' "$port" "$key" >> "$keys"
chmod 0600 "$keys"
for file in /etc/ssh/ssh_host_*_key.pub; do [ -r "$file" ] && say "hostkey: $(cut -d' ' -f1,2 "$file")"; done
say "ready"
cat > /dev/null
sed -n 's/.*http\.request\.method=GET.*http\.response\.written=\([0-9]*\).*/served: \1/p' "$work/registry.log"
