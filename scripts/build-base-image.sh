#!/usr/bin/env bash
# Make one of the project's own base images, ddp-cluster/base:SUITE, when the engine lacks it: built from a Debian
# archive with debootstrap and `docker import` (no registry needed, as at air-gapped sites). Any other name is a
# user's image (a CANN or NGC base): it is never built or replaced here; the image stage uses it as found, pulls
# it, or stops naming it.
set -euo pipefail

name=${1:?usage: build-base-image.sh ddp-cluster/base:SUITE [SUITE] [MIRROR]}
case "$name" in
  ddp-cluster/base:*) ;;
  *)
    echo "base image $name is not one of the project's own (ddp-cluster/base:SUITE): it is never built here;" \
         "pull it (docker pull $name, after docker login for a private registry) or load it (docker load -i FILE.tar)" >&2
    exit 2
    ;;
esac
suite=${2:-${name#ddp-cluster/base:}}
mirror=${3:-http://deb.debian.org/debian}

if docker image inspect "$name" >/dev/null 2>&1; then
  echo "base image $name: present"
  exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  echo "base image $name is not present; install debootstrap (apt-get install -y debootstrap, or make base-image)" \
       "so that it can be built from $mirror" >&2
  exit 1
fi
# Not /tmp: servers mount it noexec,nodev, where debootstrap cannot make /dev nor run what it unpacks.
root=$(mktemp -d "${DDP_BASE_WORKDIR:-/var/tmp}/ddp-base.XXXXXX")
trap 'rm -rf "$root" "$root.log"' EXIT
echo "base image $name: building $suite from $mirror with debootstrap"
debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -n 20 "$root.log" >&2
  echo "debootstrap of $suite from $mirror failed (log above)" >&2
  exit 1
}
# Drop apt lists and caches: the image's own builds run `apt-get update` anyway.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' - "$name" >/dev/null
echo "base image $name: built"
