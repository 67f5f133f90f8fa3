#!/usr/bin/env bash
# make down: stops exactly what scripts/up.sh started, by the pid files in
# run/pids/, in reverse start order (traffic first, Redis last), each with
# SIGTERM and up to 20 s to finish (then SIGKILL). Data in run/ (Redis,
# ClickHouse, the broker's topics: the policy log and the decisions) is
# kept; `make down-clean` stops the stack and removes it, to start over.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
clean=0
case "${1:-}" in
  "") ;;
  --clean) clean=1 ;;
  *) die "usage: scripts/down.sh [--clean]" ;;
esac

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
if [ $clean -eq 1 ]; then
  case "$RUN_DIR" in
    "" | / | "$ROOT") die "RUN_DIR=$RUN_DIR: refusing to remove it" ;;
  esac
  say "removing $RUN_DIR (Redis, ClickHouse and Kafka data, the policy cache, logs): the next make up starts from nothing"
  rm -rf "$RUN_DIR"
fi
