#!/bin/sh
# The build server's side of a server-to-server distribution (ddp_image_distribute with source; run over the
# controller's ssh session, which lives as long as the distribution): Docker's Distribution registry on this
# server's loopback, taking only the password made for this distribution (the session's first line), the image
# pushed into it, its digest and ID said for the others to pull by and check, an ephemeral key authorized for
# nothing but a forward to that port, this server's host keys said for the others to pin; then it waits for the
# session's stdin to close and leaves nothing: registry stopped, key deauthorized, work directory (password,
# login) removed (also on a signal or a lost session).
# Arguments: PORT STORAGE IMAGE REFERENCE REGISTRY_COMMAND PUBLIC_KEY KEY_COMMENT
#
# With `proxy` first, a tier-1 server of a two-tier distribution: its registry is a pull-through cache of the
# build server's (Distribution's proxy.remoteurl), reached through this server's own tunnel to the build server;
# this server pulls the image through it (the build server sends each layer here, not to every server), then the
# key is authorized for a forward to the cache's port, and the servers assigned here pull from the cache. The
# cache takes the same password as the build server's registry; Distribution 2.8 logs in upstream only to token
# servers, so it reaches the build server's registry (basic logins) through a relay on PORT + 1 that it uses as
# its HTTP proxy: the relay takes only requests that carry the run's password as their proxy login and adds it
# as their login upstream (GET and HEAD only), so that nothing on this loopback reaches either without it.
# Arguments: proxy PORT STORAGE PULLED IMAGE IMAGE_ID REGISTRY_COMMAND PUBLIC_KEY KEY_COMMENT UP_PORT [ADDRESS
# SSH_PORT USER HOST_KEYS]: the cache on PORT, PULLED its REGISTRY/NAME@DIGEST, the source's registry on this
# loopback's UP_PORT: through the tunnel this script opens to the build server as pull-image.sh does, or, with no
# ADDRESS, the controller's registry that the controller's session forwards there (ssh -R). stdin: the password,
# the run's private key, then nothing until the end. It says `tunnel: up` once the tunnel answers, then pulled:, image_id:, hostkey: and
# ready, or error:.
# Every port that a login goes to (the registry, the relay, the tunnel to the source) is checked to be held by
# the process this script started for it, or by this session's sshd for the controller's ssh -R, first
# (`owned`); another holder is named in an error line and sent nothing (exit 6).
set -u
proxy=
if [ "$1" = proxy ]; then
  shift
  proxy=yes port=$1 storage=$2 pulled=$3 image=$4 expected=$5 command=$6 key=$7 comment=$8
  up=$9 address=${10:-} ssh_port=${11:-} user=${12:-} known=${13:-}
  reference=$pulled
else
  port=$1 storage=$2 image=$3 reference=$4 command=$5 key=$6 comment=$7
fi
keys=$HOME/.ssh/authorized_keys
here="build server"
[ -n "$proxy" ] && here="tier-1 server (a cache of the build server's registry)"
work=$(mktemp -d /tmp/ddp-registry.XXXXXX) || exit 3
registry= tunnel= relay=
cleanup() {
  [ -n "$registry" ] && kill "$registry" 2>/dev/null && wait "$registry" 2>/dev/null
  [ -n "$relay" ] && kill "$relay" 2>/dev/null
  [ -n "$tunnel" ] && kill "$tunnel" 2>/dev/null
  [ -f "$keys" ] && sed -i "/ $comment\$/d" "$keys"
  docker rmi "$reference" >/dev/null 2>&1
  # A cache holds nothing worth keeping: its store goes with it.
  [ -n "$proxy" ] && rm -rf "$storage"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' HUP INT TERM PIPE
# The loopback's listeners' functions (answers, holder, taken, unheld, owned): the sender puts them here
# (ddp_cluster.image.distribute.with_listeners).
# @loopback listeners@
say() { printf '%s\n' "$*"; }
umask 077
IFS= read -r secret || { say "error: the controller's session ended before it sent the registry's password"; exit 3; }
if [ -n "$proxy" ]; then
  while IFS= read -r line; do
    printf '%s\n' "$line" >> "$work/key"
    case $line in "-----END "*) break ;; esac
  done
  if [ -z "$address" ] && ! owned "$up" ancestors "this session's sshd (the controller's ssh -R to its registry)"; then
    say "error: the controller's registry does not answer on this server's loopback port $up (the session's ssh -R)"
    exit 4
  fi
fi
if [ -n "$proxy" ] && [ -n "$address" ]; then
  unheld "$up" "this server's tunnel to the build server (ssh -L)"
  printf '%s\n' "$known" | sed 's/^/ddp-image-build /' > "$work/known_hosts"
  set -- -N -i "$work/key" -o IdentitiesOnly=yes -o IdentityAgent=none -o BatchMode=yes \
    -o UserKnownHostsFile="$work/known_hosts" -o GlobalKnownHostsFile=/dev/null -o HostKeyAlias=ddp-image-build \
    -o StrictHostKeyChecking=yes -o ExitOnForwardFailure=yes -o ConnectTimeout=30 -o ServerAliveInterval=15 \
    -o ServerAliveCountMax=4 -p "$ssh_port" -L "127.0.0.1:$up:127.0.0.1:$up"
  [ -n "$user" ] && set -- "$@" -l "$user"
  # shellcheck disable=SC2029  # -N: no remote command at all
  ssh "$@" "$address" 2> "$work/tunnel.err" < /dev/null &
  tunnel=$!
  if ! owned "$up" "$tunnel" "this server's tunnel to the build server (ssh -L, pid $tunnel)"; then
    say "tunnel: $(tail -n 3 "$work/tunnel.err" | tr '\n' ' ')"
    exit 4
  fi
  say "tunnel: up"
fi
if [ -n "$proxy" ]; then
  relay_port=$((port + 1))
  unheld "$relay_port" "the relay to the build server's registry"
  # The relay (see the header): stdlib only, the password on its stdin.
  printf '%s\n' "$secret" | python3 -c '
import base64, http.client, http.server, socketserver, sys
port, upstream = int(sys.argv[1]), int(sys.argv[2])
login = "Basic " + base64.b64encode(("ddp-cluster:" + sys.stdin.readline().rstrip("\n")).encode()).decode()
dropped = {"connection", "proxy-connection", "keep-alive", "proxy-authorization", "proxy-authenticate", "te",
           "trailer", "transfer-encoding", "upgrade", "host", "authorization"}


class Relay(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def relay(self):
        self.close_connection = True
        if self.headers.get("Proxy-Authorization") != login:
            self.send_response(407)
            self.send_header("Proxy-Authenticate", "Basic realm=\"ddp-cluster-image\"")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = self.path.split("://", 1)[-1]
        path = "/" + path.split("/", 1)[1] if "/" in path else "/"
        headers = {key: value for key, value in self.headers.items() if key.lower() not in dropped}
        headers["Authorization"] = login
        upstream_connection = http.client.HTTPConnection("127.0.0.1", upstream, timeout=300)
        upstream_connection.request(self.command, path, headers=headers)
        answer = upstream_connection.getresponse()
        self.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in dropped:
                self.send_header(key, value)
        self.send_header("Connection", "close")
        self.end_headers()
        while self.command != "HEAD":
            chunk = answer.read(1 << 20)
            if not chunk:
                break
            self.wfile.write(chunk)
        upstream_connection.close()

    do_GET = do_HEAD = relay


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


Server(("127.0.0.1", port), Relay).serve_forever()
' "$relay_port" "$up" > "$work/relay.log" 2>&1 &
  relay=$!
  if ! owned "$relay_port" "$relay" "the relay to the build server's registry (pid $relay)"; then
    say "error: the relay to the build server's registry did not start on port $relay_port: $(tail -n 3 "$work/relay.log" | tr '\n' ' ')"
    exit 3
  fi
fi
found=$(command -v "$command" || command -v docker-registry || command -v registry) || {
  say "error: Docker's Distribution registry ($command) is not installed on this $here: the hosts stage installs it (apt-get install docker-registry), or install it by hand"
  exit 3
}
unheld "$port" "the image registry of this $here"
# Distribution's htpasswd takes bcrypt only: this server's libcrypt makes it (the password on stdin, not in
# an argv). Cost 4: the password is 128 random bits, and the registry checks it on every request.
printf '%s' "$secret" | python3 -c 'import ctypes, ctypes.util, secrets, sys
abc = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
lib = ctypes.CDLL(ctypes.util.find_library("crypt") or "libcrypt.so.1")
lib.crypt.restype = ctypes.c_char_p
lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
salt = "".join(secrets.choice(abc) for _ in range(21)) + secrets.choice(".Oeu")
hashed = lib.crypt(sys.stdin.read().encode(), ("$2b$04$" + salt).encode()) or b""
if not hashed.startswith(b"$2b$04$") or len(hashed) != 60:
    sys.exit(1)
print("ddp-cluster:" + hashed.decode())' > "$work/htpasswd" 2>/dev/null || {
  say "error: cannot make the image registry's password on the $here: its libcrypt has no bcrypt (install libxcrypt: libcrypt1 on Debian and Ubuntu)"
  exit 3
}
mkdir "$work/docker"
printf '{"auths": {"127.0.0.1:%s": {"auth": "%s"}}}\n' "$port" "$(printf 'ddp-cluster:%s' "$secret" | base64 | tr -d '\n')" \
  > "$work/docker/config.json"
mkdir -p "$storage" && chmod 0700 "$storage"
printf 'version: 0.1\nlog:\n  level: info\n  formatter: text\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:%s\n  headers:\n    X-Content-Type-Options: [nosniff]\nauth:\n  htpasswd:\n    realm: ddp-cluster-image\n    path: %s\n' \
  "$storage" "$port" "$work/htpasswd" > "$work/config.yml"
if [ -n "$proxy" ]; then
  # A name, not a loopback address: Go's HTTP client sends no loopback address through a proxy.
  printf 'proxy:\n  remoteurl: http://ddp-image-source\n' >> "$work/config.yml"
  # Its login in its environment, never in an argv.
  (
    unset NO_PROXY no_proxy
    HTTP_PROXY="http://ddp-cluster:$secret@127.0.0.1:$relay_port"
    export HTTP_PROXY
    exec "$found" serve "$work/config.yml"
  ) > "$work/registry.log" 2>&1 </dev/null &
else
  "$found" serve "$work/config.yml" > "$work/registry.log" 2>&1 </dev/null &
fi
registry=$!
if ! owned "$port" "$registry" "the image registry of this $here (pid $registry)"; then
  say "error: the image registry did not start on the $here: $(tail -n 3 "$work/registry.log" | tr '\n' ' ')"
  exit 3
fi
if [ -n "$proxy" ]; then
  # This server's own copy, through its cache: the build server sends each layer once, to the cache.
  DOCKER_CONFIG=$work/docker docker pull "$pulled" > "$work/pull.log" 2>&1 || {
    say "error: the pull of $pulled through this server's cache failed: $(tail -n 2 "$work/pull.log" | tr '\n' ' ')"
    exit 1
  }
  cat "$work/pull.log"
  got=$(docker image inspect --format '{{.Id}}' "$pulled") || exit 3
  if [ "$got" != "$expected" ]; then
    docker rmi "$pulled" >/dev/null 2>&1
    say "error: the image pulled by digest ($pulled) has the ID $got, not $expected, the ID of the image built ($image): the registry served another image; it was removed again and nothing was named $image"
    exit 5
  fi
  docker tag "$got" "$image" && docker rmi "$pulled" >/dev/null || exit 3
  say "pulled: $pulled"
  say "image_id: $got"
else
  docker tag "$image" "$reference" || { say "error: cannot tag $image as $reference on the build server"; exit 3; }
  DOCKER_CONFIG=$work/docker docker push "$reference" > "$work/push.log" 2>&1 || {
    say "error: the push of $reference on the build server failed: $(tail -n 2 "$work/push.log" | tr '\n' ' ')"
    exit 3
  }
  say "pushed: $(grep -c ': Pushed$' "$work/push.log")"
  # The others pull by this digest and check that they got this ID.
  say "digest: $(sed -n 's/^[^ ]*: digest: \(sha256:[0-9a-f]*\) size: [0-9]*$/\1/p' "$work/push.log" | tail -n 1)"
  say "image_id: $(docker image inspect --format '{{.Id}}' "$image")"
fi
mkdir -p "$HOME/.ssh" && chmod 0700 "$HOME/.ssh"
sed -i "/ ddp-cluster-image-[0-9a-f]*\$/d" "$keys" 2>/dev/null
printf 'restrict,port-forwarding,permitopen="127.0.0.1:%s",command="/bin/false" %s\n' "$port" "$key" >> "$keys"
chmod 0600 "$keys"
for file in /etc/ssh/ssh_host_*_key.pub; do [ -r "$file" ] && say "hostkey: $(cut -d' ' -f1,2 "$file")"; done
say "ready"
cat > /dev/null
sed -n 's/.*http\.request\.method=GET.*http\.response\.written=\([0-9]*\).*/served: \1/p' "$work/registry.log"
