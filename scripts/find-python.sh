#!/usr/bin/env bash
# Print the Python that `make venv` makes the virtualenv with: PYTHON when it is given, else the first of
# python3.13, python3.12, python3.11 and python3 on PATH whose version the pinned Ansible runs on (ansible-core
# 2.19, in requirements/controller.txt: controller Python 3.11 to 3.13). With VENV_DIR, an existing
# virtualenv there on a supported Python is kept (nothing printed) unless PYTHON names another version; one on an
# unsupported or broken Python is reported and the caller rebuilds it. Where no supported Python is found, one
# line names what was found and the command that installs one on this OS (read from OS_RELEASE, default
# /etc/os-release), and the exit status is 1.
#   usage: [PYTHON=python] [OS_RELEASE=path] find-python.sh [VENV_DIR]
set -euo pipefail

# Change these with the Ansible pin.
min_minor=11
max_minor=13
supported="3.$min_minor-3.$max_minor"
candidates=(python3.13 python3.12 python3.11 python3)
os_release=${OS_RELEASE:-/etc/os-release}
venv=${1:-}
python=${PYTHON:-}

version_of() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}

in_range() {
  [[ $1 =~ ^3\.([0-9]+)$ ]] && ((BASH_REMATCH[1] >= min_minor && BASH_REMATCH[1] <= max_minor))
}

os_field() {
  [ -r "$os_release" ] || return 0
  sed -n "s/^$1=//p" "$os_release" | head -n 1 | tr -d "\"'"
}

# How to get a supported Python (with venv) here: the command, as root, where the OS packages one.
install_hint() {
  local id like version major
  id=$(os_field ID)
  like=" $(os_field ID_LIKE) "
  version=$(os_field VERSION_ID)
  major=${version%%.*}
  [[ $major =~ ^[0-9]+$ ]] || major=""
  case "$id" in
    ubuntu)
      if [ -z "$major" ] || ((major >= 23)); then
        echo "install one as root: apt-get install -y python3 python3-venv"
      elif ((major == 22)); then
        echo "install one as root: apt-get install -y python3.11 python3.11-venv"
      else
        echo "Ubuntu $version packages none: use Ubuntu 22.04 or later"
      fi
      ;;
    debian)
      if [ -z "$major" ] || ((major >= 12)); then
        echo "install one as root: apt-get install -y python3 python3-venv"
      else
        echo "Debian $version packages none: use Debian 12 or later"
      fi
      ;;
    openEuler | openeuler)
      # openEuler 24.03 LTS's python3 is 3.11; earlier releases' is 3.9.
      if [ -n "$major" ] && ((major >= 24)); then
        echo "install one as root: dnf install -y python3"
      else
        echo "install one as root: dnf install -y python3.11"
      fi
      ;;
    fedora)
      echo "install one as root: dnf install -y python3.13"
      ;;
    *)
      if [[ $like == *" debian "* || $like == *" ubuntu "* ]] || command -v apt-get >/dev/null 2>&1; then
        echo "install one as root: apt-get install -y python3.11 python3.11-venv"
      elif command -v dnf >/dev/null 2>&1 || [[ $like == *" rhel "* || $like == *" fedora "* ]]; then
        echo "install one as root: dnf install -y python3.11"
      elif command -v yum >/dev/null 2>&1; then
        echo "install one as root: yum install -y python3.11"
      else
        echo "install one with your package manager"
      fi
      ;;
  esac
}

fail() {
  echo "make venv: $*; $(install_hint), then make venv again (or make venv PYTHON=/path/to/python3.X)" >&2
  exit 1
}

chosen=""
chosen_version=""
if [ -n "$python" ]; then
  command -v "$python" >/dev/null 2>&1 || fail "PYTHON=$python is not found; the pinned Ansible needs Python $supported"
  chosen_version=$(version_of "$python") \
    || fail "PYTHON=$python does not run; the pinned Ansible needs Python $supported"
  in_range "$chosen_version" \
    || fail "PYTHON=$python is Python $chosen_version, and the pinned Ansible (ansible-core 2.19) needs Python" \
      "$supported"
  chosen=$(command -v "$python")
fi

if [ -n "$venv" ] && [ -e "$venv/bin/python" ]; then
  if venv_version=$(version_of "$venv/bin/python") && in_range "$venv_version"; then
    if [ -z "$chosen" ] || [ "$chosen_version" = "$venv_version" ]; then
      exit 0
    fi
    echo "make venv: $venv is on Python $venv_version, PYTHON=$python is $chosen_version; rebuilding $venv" >&2
  else
    echo "make venv: $venv was made with Python ${venv_version:-that no longer runs}, which the pinned Ansible" \
      "(ansible-core 2.19) does not support; rebuilding $venv" >&2
  fi
fi

if [ -z "$chosen" ]; then
  found=()
  for candidate in "${candidates[@]}"; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    if version=$(version_of "$candidate"); then
      if in_range "$version"; then
        chosen=$(command -v "$candidate")
        chosen_version=$version
        break
      fi
      found+=("$candidate is $version")
    fi
  done
  if [ -z "$chosen" ]; then
    what="no python3 on PATH"
    if ((${#found[@]})); then
      what=$(printf '%s, ' "${found[@]}")
      what="found ${what%, }"
    fi
    fail "the pinned Ansible (ansible-core 2.19) needs Python $supported on the controller, $what"
  fi
fi

# Debian and Ubuntu ship venv's pip bootstrap (ensurepip) in a package of its own.
if ! "$chosen" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  package="the package with its venv and ensurepip modules"
  if command -v apt-get >/dev/null 2>&1; then
    package="apt-get install -y python$chosen_version-venv"
  fi
  echo "make venv: $chosen (Python $chosen_version) cannot make a virtualenv; install, as root: $package" >&2
  exit 1
fi
echo "$chosen"
