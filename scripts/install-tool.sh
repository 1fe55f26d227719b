#!/usr/bin/env bash
# Install the controller tool COMMAND (dockerd, debootstrap or docker-registry) when it is missing: its package
# from apt-get where there is apt, else dnf, else yum, as root; otherwise one line names the package and the
# command to run, and nothing is installed. Quiet when COMMAND is already there.
#   usage: install-tool.sh COMMAND
set -euo pipefail

tool=${1:?usage: install-tool.sh COMMAND (dockerd, debootstrap or docker-registry)}

if command -v "$tool" >/dev/null 2>&1; then
  exit 0
fi
manager=""
for candidate in apt-get dnf yum; do
  if command -v "$candidate" >/dev/null 2>&1; then
    manager=$candidate
    break
  fi
done

# The packages to try, in order, and the command the installed package provides (not always TOOL's name).
provides=$tool
note=""
case "$tool:${manager:-none}" in
  dockerd:apt-get) packages=(docker.io) ;;
  # openEuler's and CentOS's package is docker; Fedora's Docker engine is moby-engine.
  dockerd:*) packages=(docker moby-engine) ;;
  debootstrap:*) packages=(debootstrap) ;;
  docker-registry:apt-get) packages=(docker-registry) ;;
  docker-registry:*)
    # RPM distributions package Docker's Distribution registry as docker-distribution, whose command is
    # `registry`; the training_image role runs training_image_registry_command, docker-registry by default.
    packages=(docker-distribution)
    provides=registry
    note="; docker-distribution's command is 'registry', not 'docker-registry': set"
    note+=" training_image_registry_command: registry (group_vars, or -e) for registry distribution"
    ;;
  *)
    echo "install-tool: no package known for $tool (dockerd, debootstrap or docker-registry)" >&2
    exit 2
    ;;
esac

if [ "$provides" != "$tool" ] && command -v "$provides" >/dev/null 2>&1; then
  echo "install-tool: $provides is installed, $tool is not$note"
  exit 0
fi
if [ -z "$manager" ]; then
  echo "install-tool: $tool is missing and there is no apt-get, dnf or yum here:" \
    "install ${packages[0]} yourself$note" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-tool: $tool is missing; install it as root: $manager install -y ${packages[0]}$note" >&2
  exit 1
fi

install_package() {
  if [ "$manager" = apt-get ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
  else
    "$manager" install -y -q "$1" >/dev/null
  fi
}

for package in "${packages[@]}"; do
  echo "install-tool: installing $package for $provides ($manager)"
  if install_package "$package" && hash -r && command -v "$provides" >/dev/null 2>&1; then
    if [ -n "$note" ]; then
      echo "install-tool: installed $package${note}"
    fi
    exit 0
  fi
done
echo "install-tool: $manager installed no $provides (tried ${packages[*]}): install it yourself$note" >&2
exit 1
