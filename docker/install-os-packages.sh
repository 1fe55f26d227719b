#!/bin/sh
# Install what a node runs with (sshd, ssh, mpirun, a Python that makes venvs, ip/ss, pkill, Slurm's slurmd,
# slurmctld and client commands, munged) with the base image's
# own package manager (apt-get, dnf or yum), only what the base lacks, plus the packages named as arguments
# (training_image_os_packages). A base that has them all needs no package manager at all. No host key stays.
# DDP_PACKAGE_MANAGER forces one (tests); DDP_DRY_RUN=1 prints the install command instead of running it;
# DDP_REPORT=1 only says what the image has (`manager: M`, `tool: T`, `missing: T` lines: the image stage's probe
# of a base image runs this script so, before any build).
set -eu

say() { echo "ddp-install-os-packages: $*" >&2; }
# What a node runs with; python3 must make venvs (ensurepip and venv).
NEEDED="sshd ssh mpirun ip ss pkill python3 slurmd slurmctld srun munged"
has() {
  if [ "$1" = python3 ]; then
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1
  else
    command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/usr/lib64/openmpi/bin/$1" ]
  fi
}
missing=""
for tool in $NEEDED; do
  has "$tool" || missing="$missing $tool"
done

manager=${DDP_PACKAGE_MANAGER:-}
if [ -z "$manager" ]; then
  for candidate in apt-get dnf yum; do
    if command -v "$candidate" >/dev/null 2>&1; then manager=$candidate; break; fi
  done
fi

if [ "${DDP_REPORT:-0}" = 1 ]; then
  [ -z "$manager" ] || echo "manager: $manager"
  for tool in $NEEDED; do
    case " $missing " in *" $tool "*) echo "missing: $tool" ;; *) echo "tool: $tool" ;; esac
  done
  exit 0
fi

# The package that brings a tool, per manager family.
package_of() {
  case "$manager:$1" in
    apt-get:sshd) echo openssh-server ;;
    apt-get:ssh) echo openssh-client ;;
    apt-get:mpirun) echo openmpi-bin netbase ;;
    apt-get:ip | apt-get:ss) echo iproute2 ;;
    apt-get:pkill) echo procps ;;
    apt-get:python3) echo python3 python3-venv ;;
    apt-get:srun) echo slurm-client ;;
    apt-get:munged) echo munge ;;
    apt-get:*) echo "$1" ;;
    *:sshd) echo openssh-server ;;
    *:ssh) echo openssh-clients ;;
    *:mpirun) echo openmpi ;;
    *:ip | *:ss) echo iproute ;;
    *:pkill) echo procps-ng ;;
    *:python3) echo python3 ;;
    *:slurmd) echo slurm-slurmd ;;
    *:slurmctld) echo slurm-slurmctld ;;
    *:srun) echo slurm ;;
    *:munged) echo munge ;;
  esac
}

packages=""
for tool in $missing; do
  for package in $(package_of "$tool"); do
    case " $packages " in *" $package "*) ;; *) packages="$packages $package" ;; esac
  done
done
[ -z "$packages" ] || packages="${packages# } ca-certificates"
[ $# -eq 0 ] || packages="${packages:+$packages }$*"

if [ -z "$packages" ]; then
  say "the base image has sshd, ssh, mpirun, ip, ss, pkill, python3 with venv, slurmd, slurmctld, srun and munged: nothing to install"
elif [ -z "$manager" ]; then
  say "the base image lacks${missing:- nothing} and has no package manager (apt-get, dnf, yum) to install $packages with: add them to it yourself"
  exit 1
else
  case "$manager" in
    apt-get) command="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $packages && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/cache/apt/*.bin" ;;
    dnf | yum) command="$manager install -y $packages && $manager clean all && rm -rf /var/cache/$manager" ;;
    *) say "unknown package manager $manager"; exit 1 ;;
  esac
  say "installing with $manager: $packages"
  if [ "${DDP_DRY_RUN:-0}" = 1 ]; then
    echo "$command"
    exit 0
  fi
  sh -c "$command"
fi

still=""
for tool in $NEEDED; do
  has "$tool" || still="$still $tool"
done
if [ -n "$still" ]; then
  say "still missing after the install:$(echo "$still" | sed 's/ python3\( \|$\)/ python3(venv)\1/')"
  exit 1
fi
# A base (or openssh-server's install) may hold host keys: each node makes its own at first start. munge's
# install makes a key too: the cluster's own comes from the controller (site.yml), never in the image.
rm -f /etc/ssh/ssh_host_* /etc/munge/munge.key
mkdir -p /run/sshd
