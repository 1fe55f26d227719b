#!/usr/bin/env bash
# Make the local base image NAME when the engine lacks it: pull it if a registry answers, else build it
# from a Debian archive with debootstrap and `docker import` (no registry needed, as at air-gapped sites).
set -euo pipefail

name=${1:?usage: build-base-image.sh IMAGE [SUITE] [MIRROR]}
suite=${2:-bookworm}
mirror=${3:-http://deb.debian.org/debian}

if docker image inspect "$name" >/dev/null 2>&1; then
  echo "base image $name: present"
  exit 0
fi
if timeout 60 docker pull -q "$name" >/dev/null 2>&1; then
  echo "base image $name: pulled"
  exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  echo "base image $name is not present and cannot be pulled; install debootstrap (apt-get install -y debootstrap)" \
       "so that it can be built from $mirror, or load it with 'docker load'" >&2
  exit 1
fi
root=$(mktemp -d /tmp/ddp-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "base image $name: building $suite from $mirror with debootstrap"
debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -n 20 "$root.log" >&2
  echo "debootstrap of $suite from $mirror failed (log above)" >&2
  exit 1
}
rm -f "$root.log"
# Drop apt lists and caches: the image's own builds run `apt-get update` anyway.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' - "$name" >/dev/null
echo "base image $name: built"
