#!/usr/bin/env bash
# Run commands side by side, each into its own log (`side-by-side.sh LOG1 CMD1 LOG2 CMD2 ...`). Each log is printed
# whole as its command ends, with how long it took; the exit status is 1 when any command failed, naming each.
set -uo pipefail
(($# >= 2 && $# % 2 == 0)) || { echo "usage: $0 LOG COMMAND [LOG COMMAND ...]" >&2; exit 2; }
# wait -n -p (which command ended) is bash 5.1's.
((BASH_VERSINFO[0] > 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] >= 1))) \
  || { echo "$0 needs bash 5.1 or later (this is $BASH_VERSION)" >&2; exit 2; }

logs=() commands=() pids=()
# An interrupt or the end of this script, however it comes, stops every command still running with all it started.
stop() { for pid in "${pids[@]}"; do kill -- "-$pid" 2>/dev/null; done; }
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
trap stop EXIT
start=$(date +%s)
while (($#)); do
  mkdir -p "$(dirname "$1")"
  # Each command in its own process group, so that an interrupt stops it and everything it started.
  setsid -w bash -c "$2" >"$1" 2>&1 </dev/null &
  pids+=("$!") logs+=("$1") commands+=("$2")
  echo "started: $2 (log: $1)"
  shift 2
done

failed=()
left=${#pids[@]}
while ((left > 0)); do
  wait -n -p ended
  rc=$?
  for index in "${!pids[@]}"; do
    [ "${pids[$index]}" = "$ended" ] || continue
    echo "== ${commands[$index]}: exit $rc after $(($(date +%s) - start)) s (log: ${logs[$index]})"
    cat "${logs[$index]}"
    ((rc == 0)) || failed+=("${commands[$index]} (exit $rc, log: ${logs[$index]})")
  done
  left=$((left - 1))
done
if ((${#failed[@]})); then
  printf 'failed: %s\n' "${failed[@]}"
  exit 1
fi
