#!/bin/sh
# Slurm's daemons on a node: munged, slurmd and, where slurm.conf names this node a controller (SlurmctldHost),
# slurmctld; each started only when it does not run. The settings come from site.yml (the slurm role):
# /etc/slurm/slurm.conf, /etc/slurm/gres.conf and the cluster's munge key /etc/ddp-cluster/munge.key (root, 0600;
# installed for munged, owned by munge, 0400). A node site.yml has not reached yet has none: nothing starts.
# `ddp-slurm-start restart` stops them first (new settings or key). One line per daemon: `started NAME` or
# `running NAME`; a daemon that does not stay up fails the script, naming it with its log's last lines.
set -u

conf=/etc/slurm/slurm.conf
gres=/etc/slurm/gres.conf
key=/etc/ddp-cluster/munge.key
node=$(hostname)
say() { echo "ddp-slurm-start: $*" >&2; }

if [ ! -s "$conf" ] || [ ! -s "$key" ]; then
  echo "no Slurm settings on $node yet (site.yml writes them)"
  exit 0
fi

running() { pgrep -x "$1" >/dev/null 2>&1; }
stop() {
  running "$1" || return 0
  pkill -x "$1"
  tries=0
  while running "$1" && [ $tries -lt 50 ]; do sleep 0.2; tries=$((tries + 1)); done
  running "$1" && pkill -9 -x "$1"
  return 0
}
# Started, then given 1 s to stay up (a daemon that reads a bad setting exits within that).
check() {
  tries=0
  while [ $tries -lt 4 ]; do
    running "$1" || break
    sleep 0.25
    tries=$((tries + 1))
  done
  if running "$1"; then echo "started $1"; return 0; fi
  say "$1 did not stay up on $node; the last lines of $2:"
  tail -n 5 "$2" >&2 2>/dev/null
  return 1
}

controller=no
grep -q "^SlurmctldHost=$node\(([^)]*)\)\?[[:space:]]*$" "$conf" && controller=yes

# Every device file gres.conf gives this node must exist (slurmd stops at its start otherwise).
if [ -f "$gres" ]; then
  for files in $(sed -n "s/^NodeName=$node .*File=\([^ ]*\).*/\1/p" "$gres"); do
    case "$files" in
      *\[*-*\]) prefix=${files%%\[*}; range=${files#*\[}; range=${range%\]}
                first=${range%-*}; last=${range#*-}
                index=$first
                while [ "$index" -le "$last" ]; do
                  [ -e "$prefix$index" ] || { say "$node lacks $prefix$index, which gres.conf gives it: is the device passed to the node container?"; exit 1; }
                  index=$((index + 1))
                done ;;
      *) [ -e "$files" ] || { say "$node lacks $files, which gres.conf gives it"; exit 1; } ;;
    esac
  done
fi

if [ "${1:-}" = restart ]; then
  stop slurmctld
  stop slurmd
  stop munged
fi

failed=0
if running munged; then echo "running munged"; else
  install -d -o munge -g munge -m 0755 /run/munge
  install -o munge -g munge -m 0400 "$key" /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged >/dev/null 2>&1
  check munged /var/log/munge/munged.log || failed=1
fi
if [ "$controller" = yes ]; then
  if running slurmctld; then echo "running slurmctld"; else
    /usr/sbin/slurmctld >/dev/null 2>&1
    check slurmctld /var/log/slurm/slurmctld.log || failed=1
  fi
fi
if running slurmd; then echo "running slurmd"; else
  /usr/sbin/slurmd -N "$node" >/dev/null 2>&1
  check slurmd /var/log/slurm/slurmd.log || failed=1
fi
exit $failed
