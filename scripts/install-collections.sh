#!/usr/bin/env bash
# Install the Ansible collections requirements/collections.txt names into a virtualenv's site-packages (where
# ansible-core looks for ansible_collections on sys.path): pip downloads the pinned `ansible` release's wheel (its
# cache keeps it for the next virtualenv) and only those collections' directories are unpacked from it.
#   usage: install-collections.sh VENV_DIR [LIST]
set -euo pipefail

venv=${1:?usage: install-collections.sh VENV_DIR [requirements/collections.txt]}
list=${2:-$(dirname "$0")/../requirements/collections.txt}
python=$venv/bin/python

mapfile -t wanted < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$list")
release=${wanted[0]}
[[ $release == ansible==* ]] || { echo "$list: the first line is the release, ansible==X.Y.Z (found $release)" >&2; exit 2; }

download=$(mktemp -d)
trap 'rm -rf "$download"' EXIT
"$python" -m pip download --quiet --no-deps --dest "$download" "$release"
"$python" - "$download"/ansible-*.whl "${wanted[@]:1}" <<'EOF'
import shutil
import sys
import sysconfig
import zipfile
from pathlib import Path

wheel, names = sys.argv[1], sys.argv[2:]
site = Path(sysconfig.get_paths()["purelib"])
prefixes = [f"ansible_collections/{name.replace('.', '/')}/" for name in names]
with zipfile.ZipFile(wheel) as archive:
    listed = set(archive.namelist())
    missing = [n for n, p in zip(names, prefixes) if p + "MANIFEST.json" not in listed]
    if missing:
        sys.exit(f"{Path(wheel).name} has no collection {', '.join(missing)}")
    # A collection whose manifest (version and file checksums) is the wheel's is this one already: left as it is.
    stale = [p for p in prefixes if not (site / p / "MANIFEST.json").is_file()
             or (site / p / "MANIFEST.json").read_bytes() != archive.read(p + "MANIFEST.json")]
    for prefix in stale:
        # A collection of another release left there would mix with this one's files.
        shutil.rmtree(site / prefix, ignore_errors=True)
        archive.extractall(site, [m for m in listed if m.startswith(prefix)])
unpacked = [n for n, p in zip(names, prefixes) if p in stale]
print(f"collections from {Path(wheel).name}: unpacked {', '.join(unpacked) or 'none, all in place'}")
EOF
