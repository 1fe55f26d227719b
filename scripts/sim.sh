#!/usr/bin/env bash
# The simulated cluster: `sim.sh up` starts SIM_SERVERS (default 2, up to 8) servers sim-server0... on the
# bridge network ddp-sim (172.30.99.0/24, server N at .10+N), each with its own Docker engine, image store,
# network namespace, sshd on port 22 (root by key only) and ufw on; `sim.sh down` removes them, their image
# stores and the controller's access to them. Both sim inventories (inventories/sim, inventories/sim-ascend) use
# these servers; see "Rehearse a real inventory on the sim" in README.md. `sim.sh standins` builds only the
# vendors' stand-ins (the CANN and NGC base images, the torch_npu wheel), which `up` builds too unless
# SIM_STANDINS=0: the sim's tests build them beside the first stages, which do not need them.
set -euo pipefail
cd "$(dirname "$0")/.."

SERVERS=${SIM_SERVERS:-2}
NETWORK=ddp-sim
SUBNET=172.30.99.0/24
PREFIX=172.30.99.
FIRST_OCTET=10
BASE_IMAGE=${BASE_IMAGE:-ddp-cluster/base:bookworm}
SERVER_IMAGE=ddp-cluster/sim-server:bookworm
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
# Stand-ins of the vendors' published base images (sim/cann/Dockerfile, sim/ngc/Dockerfile) and of torch_npu's wheel.
CANN_IMAGE=ddp-cluster/cann-standin:8.2.rc1-910b-py3.11
NGC_IMAGE=ddp-cluster/ngc-standin:26.10-py3
TORCH_NPU_WHEELHOUSE=build/sim/torch-npu-standin
# CANN 8.2.rc1's runtime pip packages, as its Dockerfile lists them (pip: its `pip install --upgrade pip`).
CANN_PIP_PACKAGES="pip attrs cython numpy==1.24.0 decorator sympy cffi pyyaml pathlib2 psutil protobuf==3.20 scipy requests absl-py"
# The controller's access to the servers: its key, the servers' pinned host keys, the ssh settings for them.
ACCESS_DIR=${HOME}/.ddp-cluster/sim-servers
SSH_CONFIG=${HOME}/.ssh/config
INCLUDE_MARK="# ddp-cluster sim servers (make sim-down removes this line and the next)"
INCLUDE_LINE="Include ${ACCESS_DIR}/ssh_config"
LABEL=ddp-cluster.sim-server

log() { echo "sim: $*"; }
die() { echo "sim: $*" >&2; exit 1; }

address_of() { echo "${PREFIX}$((FIRST_OCTET + $1))"; }

check_count() {
  case "$SERVERS" in
    '' | *[!0-9]*) die "SIM_SERVERS=$SERVERS is not a whole number: set it to 1 to 8" ;;
  esac
  [ "$SERVERS" -ge 1 ] && [ "$SERVERS" -le 8 ] || die "SIM_SERVERS=$SERVERS is out of range: set it to 1 to 8"
}

# Build an image from a context of only the named paths (they include the Dockerfile) (the repository's .dockerignore
# is the node image's); leading `--build-arg NAME=VALUE` pairs go to docker build.
build_image() {
  local image=$1 dockerfile=$2
  shift 2
  local args=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
  while [ "${1:-}" = --build-arg ]; do
    args+=("$1" "$2")
    shift 2
  done
  log "building $image"
  tar -c "$@" | DOCKER_BUILDKIT=0 docker build -q "${args[@]}" \
    -f "$dockerfile" -t "$image" - 2> >(grep -v -e DEPRECATED -e BuildKit -e environment-variable -e '^$' >&2) >/dev/null
}

ensure_network() {
  if ! docker network inspect "$NETWORK" >/dev/null 2>&1; then
    docker network create --driver bridge --subnet "$SUBNET" --label "$LABEL=1" "$NETWORK" >/dev/null \
      || die "could not create the network $NETWORK ($SUBNET): is the subnet taken by another network?"
  fi
}

ensure_key() {
  install -d -m 0700 "$ACCESS_DIR"
  [ -f "$ACCESS_DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C ddp-cluster-sim-controller -f "$ACCESS_DIR/id_ed25519"
}

start_server() {
  local index=$1 name="sim-server$1" address
  address=$(address_of "$index")
  if [ "$(docker inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ]; then
    log "$name ($address): running"
  elif docker inspect "$name" >/dev/null 2>&1; then
    log "$name ($address): starting again"
    docker start "$name" >/dev/null
  else
    log "$name ($address): creating"
    # Not --privileged (runc cannot apply CAP_SYS_RESOURCE here): every other capability, no seccomp or AppArmor
    # profile, every device allowed, cgroups writable, so that its own dockerd runs containers.
    docker run -d --name "$name" --hostname "$name" --network "$NETWORK" --ip "$address" \
      --cap-add ALL --cap-drop SYS_RESOURCE --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
      --device-cgroup-rule 'a *:* rwm' -v /sys/fs/cgroup:/sys/fs/cgroup:rw -v "$name-docker:/var/lib/docker" \
      --tmpfs /run --tmpfs /tmp --label "$LABEL=1" "$SERVER_IMAGE" >/dev/null
  fi
  docker exec -i "$name" sh -c 'umask 077; cat > /root/.ssh/authorized_keys' <"$ACCESS_DIR/id_ed25519.pub"
}

wait_server() {
  local name="sim-server$1"
  for _ in $(seq 1 90); do
    if docker exec "$name" sh -c 'docker info >/dev/null 2>&1 && test -s /etc/ssh/ssh_host_ed25519_key.pub'; then
      return 0
    fi
    sleep 1
  done
  docker exec "$name" tail -n 20 /var/log/dockerd.log >&2 || true
  die "$name: its Docker engine did not answer within 90 s (its log above)"
}

write_access() {
  local known="$ACCESS_DIR/known_hosts.new" name address
  : >"$known"
  for name in $(docker ps --filter "label=$LABEL" --format '{{.Names}}' | sort); do
    address=$(docker inspect -f "{{(index .NetworkSettings.Networks \"$NETWORK\").IPAddress}}" "$name")
    # Read through the engine (the console of a real server), never accepted blindly over the network.
    echo "$address,$name $(docker exec "$name" cut -d' ' -f1,2 /etc/ssh/ssh_host_ed25519_key.pub)" >>"$known"
  done
  mv "$known" "$ACCESS_DIR/known_hosts"
  cat >"$ACCESS_DIR/ssh_config" <<CONF
# Written by scripts/sim.sh: how this machine reaches the simulated servers (host keys pinned).
Host ${PREFIX}*
  User root
  IdentityFile ${ACCESS_DIR}/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile ${ACCESS_DIR}/known_hosts
  StrictHostKeyChecking yes
  HostKeyAlgorithms ssh-ed25519
  BatchMode yes
  ConnectTimeout 10
CONF
  # The docker CLI's ssh:// connections (the mesh play) read only ~/.ssh/config.
  install -d -m 0700 "$(dirname "$SSH_CONFIG")"
  touch "$SSH_CONFIG"
  if ! grep -qxF "$INCLUDE_LINE" "$SSH_CONFIG"; then
    { echo "$INCLUDE_MARK"; echo "$INCLUDE_LINE"; cat "$SSH_CONFIG"; } >"$SSH_CONFIG.ddp-sim" && mv "$SSH_CONFIG.ddp-sim" "$SSH_CONFIG"
    chmod 0600 "$SSH_CONFIG"
  fi
}

# Every running server as an inventory of its own, for clusters of more than the two that inventories/sim and
# inventories/sim-ascend list: `-i inventories/sim -i build/sim/hosts.yml` (their group_vars still apply).
write_inventory() {
  local name index
  mkdir -p build/sim
  {
    echo "# Written by scripts/sim.sh: every simulated server that is running. Use it beside a sim inventory:"
    echo "#   ansible-playbook -i inventories/sim -i build/sim/hosts.yml site.yml"
    echo "all:"
    echo "  children:"
    echo "    nodes:"
    echo "      hosts:"
    for name in $(docker ps --filter "label=$LABEL" --format '{{.Names}}' | sort -V); do
      index=${name#sim-server}
      echo "        $name:"
      echo "          ansible_host: $(address_of "$index")"
      echo "          npu_device_ip_seed: 192.168.100.$((101 + 10 * index))"
    done
  } >build/sim/hosts.yml.new
  mv build/sim/hosts.yml.new build/sim/hosts.yml
}

# Download wheels for CPython 3.11 on this machine's architecture into DIR, once: a marker names what was asked
# for, and a changed request downloads afresh (into a temporary directory moved into place when complete).
download_wheels() {
  local dir=$1 machine marker
  shift
  machine=$(uname -m)
  marker=".complete-$(echo "$machine $*" | sha256sum | cut -c1-16)"
  [ -f "$dir/$marker" ] && return 0
  log "downloading wheels into $dir: $*"
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp"
  "${PYTHON:-python3}" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
    --python-version 3.11 --implementation cp --abi cp311 \
    --platform "manylinux_2_28_$machine" --platform "manylinux2014_$machine" --platform "manylinux_2_17_$machine" \
    --dest "$dir.tmp" "$@" || die "could not download $* into $dir"
  touch "$dir.tmp/$marker"
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
}

# The base-image stand-ins are rebuilt on every sim-up (Docker's layer cache makes an unchanged one take seconds:
# the CPython build in the CANN one takes minutes only the first time).
build_cann_standin() {
  # shellcheck disable=SC2086
  download_wheels build/sim/cann-wheels $CANN_PIP_PACKAGES
  build_image "$CANN_IMAGE" sim/cann/Dockerfile sim/cann/Dockerfile sim/cann/ascend-toolkit sim/cann/nnal build/sim/cann-wheels
}

build_ngc_standin() {
  download_wheels build/sim/ngc-wheels "torch==$TORCH_VERSION" numpy
  build_image "$NGC_IMAGE" sim/ngc/Dockerfile --build-arg "TORCH_VERSION=$TORCH_VERSION" sim/ngc build/sim/ngc-wheels
}

# torch_npu's stand-in as a wheel in a wheelhouse, as real nodes get torch_npu (it is tiny: rebuilt every time,
# written beside and moved into place, so a reader never sees half a file).
build_torch_npu_wheel() {
  log "building the torch_npu stand-in wheel into $TORCH_NPU_WHEELHOUSE"
  "${PYTHON:-python3}" sim/cann/make-torch-npu-wheel.py --version "$TORCH_VERSION" "$TORCH_NPU_WHEELHOUSE" >/dev/null \
    || die "could not build the torch_npu stand-in wheel"
}

standins() {
  build_cann_standin
  build_ngc_standin
  build_torch_npu_wheel
}

up() {
  check_count
  scripts/ensure-docker.sh >/dev/null
  scripts/build-base-image.sh "$BASE_IMAGE" >/dev/null
  build_image "$SERVER_IMAGE" sim/server/Dockerfile sim/server sim/ascend tests/doubles/hccn_tool tests/doubles/npu-smi
  [ "${SIM_STANDINS:-1}" = 0 ] || standins
  ensure_network
  ensure_key
  local index
  for index in $(seq 0 $((SERVERS - 1))); do
    start_server "$index"
  done
  for index in $(seq 0 $((SERVERS - 1))); do
    wait_server "$index"
  done
  write_access
  write_inventory
  log "$SERVERS server(s) up: $(for index in $(seq 0 $((SERVERS - 1))); do printf 'sim-server%s=%s ' "$index" "$(address_of "$index")"; done)"
}

down() {
  local names
  names=$(docker ps -a --filter "label=$LABEL" --format '{{.Names}}')
  if [ -n "$names" ]; then
    log "removing $(echo "$names" | tr '\n' ' ')"
    # shellcheck disable=SC2086
    docker rm -f -v $names >/dev/null
    for name in $names; do
      docker volume rm "$name-docker" >/dev/null 2>&1 || true
    done
  fi
  docker network rm "$NETWORK" >/dev/null 2>&1 || true
  if [ -f "$SSH_CONFIG" ] && grep -qxF "$INCLUDE_LINE" "$SSH_CONFIG"; then
    grep -vxF -e "$INCLUDE_MARK" -e "$INCLUDE_LINE" "$SSH_CONFIG" >"$SSH_CONFIG.ddp-sim" || true
    mv "$SSH_CONFIG.ddp-sim" "$SSH_CONFIG"
    chmod 0600 "$SSH_CONFIG"
  fi
  rm -rf "$ACCESS_DIR" "${HOME}/.ddp-cluster/sim" "${HOME}/.ddp-cluster/sim-ascend" build/sim/hosts.yml
  log "down"
}

case "${1:-}" in
  up) up ;;
  standins)
    scripts/ensure-docker.sh >/dev/null
    scripts/build-base-image.sh "$BASE_IMAGE" >/dev/null
    standins
    ;;
  down) down ;;
  *) die "usage: $0 up|standins|down (SIM_SERVERS=N, 1 to 8, for up; SIM_STANDINS=0: up without the stand-ins)" ;;
esac
