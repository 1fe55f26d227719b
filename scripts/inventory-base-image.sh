#!/usr/bin/env bash
# Print the cluster_base_image the inventory Ansible reads (ANSIBLE_INVENTORY, or -i's argument as $1) gives its
# first node, or nothing when it cannot be read (no venv yet, no such inventory, no nodes): make then falls back
# to the local inventory's ddp-cluster/base:bookworm. Only the project's own bases are built by make base-image.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
inventory=${1:-${ANSIBLE_INVENTORY:-}}
[ -n "$inventory" ] || exit 0
ansible_inventory="$here/.venv/bin/ansible-inventory"
[ -x "$ansible_inventory" ] || exit 0
ANSIBLE_CONFIG="$here/ansible.cfg" "$ansible_inventory" -i "$inventory" --list 2>/dev/null | "$here/.venv/bin/python" -c '
import json, sys
try:
    listing = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
hostvars = listing.get("_meta", {}).get("hostvars", {})


def hosts(group, seen=()):
    entry = listing.get(group, {})
    yield from entry.get("hosts", [])
    for child in entry.get("children", []):
        if child not in seen:
            yield from hosts(child, (*seen, group))


for host in hosts("nodes"):
    base = hostvars.get(host, {}).get("cluster_base_image", "")
    if isinstance(base, str) and base and "{" not in base:
        print(base)
    break
'
