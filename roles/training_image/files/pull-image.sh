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
# --- the loopback's listeners: the same lines in pull-image.sh and registry-source.sh (a unit test holds them
# equal, and holder's program equal to ddp_cluster.image.distribute.HOLDER_CHECK). A job on the host network
# can listen on a loopback port first and answer HTTP as a registry would: no login goes to a port before
# holder has found that the process meant to (a tunnel, the relay, a registry; `ancestors`: this session's
# sshd, whose ssh -R it is) holds its listener.
answers() {  # the registry's API on this machine's loopback port $1 (401 without a login: it answers)
  python3 -c 'import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen("http://127.0.0.1:%s/v2/" % sys.argv[1], timeout=2)
except urllib.error.HTTPError:
    pass' "$1" 2>/dev/null
}
holder() {  # who holds the listener 127.0.0.1:$1 reaches, against $2... (PIDs, or ancestors): 0 they do,
  # 1 nothing listens, 2 another process (said), 3 cannot tell (said)
  python3 -c 'import os, re, socket, struct, sys
port, ours = int(sys.argv[1]), set()
for word in sys.argv[2:]:
    pid = os.getppid() if word == "ancestors" else int(word)
    ours.add(pid)
    while word == "ancestors" and pid > 1:
        try:
            with open("/proc/%d/status" % pid) as status:
                pid = int(re.search(r"^PPid:\s+(\d+)", status.read(), re.M).group(1))
        except (OSError, AttributeError, ValueError):
            break
        ours.add(pid)
loopback = "%08X" % struct.unpack("=I", socket.inet_aton("127.0.0.1"))
mapped = socket.inet_pton(socket.AF_INET6, "::ffff:127.0.0.1")
mapped = "".join("%08X" % word for word in struct.unpack("=4I", mapped))
reach = {loopback, "0" * 8, "0" * 32, mapped}
inodes = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        with open(table) as lines:
            rows = [line.split() for line in lines][1:]
    except OSError:
        if table.endswith("tcp"):
            print("cannot read %s, where the listening sockets are" % table)
            sys.exit(3)
        continue
    for row in rows:
        address, _, hexport = row[1].partition(":")
        if row[3] == "0A" and int(hexport, 16) == port and address in reach:
            inodes.add(row[9])
if not inodes:
    sys.exit(1)


def sockets(pid):
    try:
        names = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return set()
    found = set()
    for name in names:
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, name))
        except OSError:
            continue
        if link.startswith("socket:["):
            found.add(link[8:-1])
    return found


def read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def describe(pid):
    line = " ".join(word for word in read("/proc/%d/cmdline" % pid).split("\0") if word)
    line = "".join(char if char.isprintable() else "?" for char in line)[:120]
    container = re.search(r"docker[-/]([0-9a-f]{12})", read("/proc/%d/cgroup" % pid))
    return "pid %d (%s)%s" % (pid, line or "?", " in container " + container.group(1) if container else "")


held = set()
for pid in ours:
    held |= sockets(pid) & inodes
strangers = inodes - held
if not strangers:
    sys.exit(0)
said = sorted(describe(int(entry)) for entry in os.listdir("/proc")
              if entry.isdigit() and int(entry) not in ours and sockets(int(entry)) & strangers)
hidden = "a process that uid %d cannot see (of another user, or in another PID namespace)" % os.getuid()
print(", ".join(said[:3]) or hidden)
sys.exit(2)' "$@" 2>&1
}
taken() {  # port $1 is not ours ($2: holder's status, $3: what it said, $4: what should hold it): exit 6
  if [ "$2" = 2 ]; then who="is taken by $3, not by $4"; else who="cannot be checked ($3)"; fi
  echo "error: port $1 on the server's loopback $who: nothing was sent to it, the registry's password included. Stop that process (ss -ltnp 'sport = :$1' shows it) or set cluster_registry_port to a free port"
  exit 6
}
unheld() {  # port $1 has no listener yet, or $2 (what is to listen there) is refused (taken)
  said=$(holder "$1"); held=$?
  [ "$held" = 1 ] || taken "$1" "$held" "$said" "$2"
}
owned() {  # until $2 (a PID, or ancestors), named $3, holds port $1's listener and it answers: 0; another
  # holder: refused at once (taken); 1 once $2 has ended or the bound passed (30 s; 2 s for ancestors, whose
  # ssh -R sshd bound before it ran this script)
  tries=0 bound=150
  [ "$2" = ancestors ] && bound=10
  while :; do
    said=$(holder "$1" "$2"); held=$?
    case $held in
      0) answers "$1" && return 0 ;;
      1) ;;
      *) taken "$1" "$held" "$said" "$3" ;;
    esac
    tries=$((tries + 1))
    if { [ "$2" != ancestors ] && ! kill -0 "$2" 2>/dev/null; } || [ "$tries" -gt "$bound" ]; then return 1; fi
    sleep 0.2
  done
}
# --- end of the loopback's listeners
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
