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

stop_all
if [ $clean -eq 1 ]; then
  case "$RUN_DIR" in
    "" | / | "$ROOT") die "RUN_DIR=$RUN_DIR: refusing to remove it" ;;
  esac
  say "removing $RUN_DIR (Redis, ClickHouse and Kafka data, the policy cache, logs): the next make up starts from nothing"
  rm -rf "$RUN_DIR"
fi
