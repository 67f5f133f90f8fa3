#!/usr/bin/env bash
# make regions-down: stops exactly what scripts/regions-up.sh started, by the
# pid files in run/regions/pids/, in reverse start order (limiters, the WAN,
# Redis), each with SIGTERM and up to 20 s to finish (then SIGKILL). The
# regions' Redis keep nothing (no persistence): the next regions-up starts
# from empty budgets.
set -euo pipefail
source "$(dirname "$0")/regions-lib.sh"

stop_all
