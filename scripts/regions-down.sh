#!/usr/bin/env bash
# make regions-down: stops exactly what scripts/regions-up.sh started, by the
# pid files in run/regions/pids/, in reverse start order (limiters, the WAN,
# Redis), each with SIGTERM and up to 20 s to finish (then SIGKILL). The
# regions' Redis keep nothing (no persistence): the next regions-up starts
# from empty budgets.
set -euo pipefail
source "$(dirname "$0")/regions-lib.sh"

stopped=0
for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
  c="${COMPONENTS[$i]}"
  f="$PID_DIR/$c.pid"
  [ -f "$f" ] || continue
  pid="$(pid_of "$c")"
  if [ -z "$pid" ]; then
    say "$c was not running (stale pid file removed)"
    rm -f "$f"
    continue
  fi
  stop_pid "$c" "$pid"
  rm -f "$f"
  say "stopped $c (pid $pid)"
  stopped=$((stopped + 1))
done
if [ $stopped -eq 0 ]; then
  say "nothing was running"
fi
