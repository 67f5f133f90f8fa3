#!/usr/bin/env bash
# POST /check with a reservation and POST /settle beside plain POST /check,
# in one run against one limiter on one redis-server (bench/reservebench:
# closed loop, the three phases interleaved PASSES times). Starts its own
# redis-server and limiter on free loopback ports; prints the figures and
# the load average before and after.
#
#   SECONDS_EACH (default 5)  each phase
#   PASSES       (default 3)
#   CONNS        (default 32)
#   BASE_LIMITER (optional)   another limiter binary (say, main's build):
#                             each pass then runs the phases against it and
#                             against this tree's limiter in turn, so that
#                             before and after come from the same run
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${SECONDS_EACH:-5}
PASSES=${PASSES:-3}
CONNS=${CONNS:-32}
OUT=${BENCH_OUT:-$(mktemp -d /tmp/ratewarden-reserve.XXXXXX)}
source bench/lib.sh
require_tools redis-server redis-cli curl
$GO build -o "$OUT/bin/" ./cmd/limiter
$GO build -C bench -o "$(realpath -m "$OUT")/bin/" ./reservebench
start_redis
# start_limiter BINARY: a limiter on a free port; sets LPORT and LPID.
start_limiter() {
  LPORT=$(free_port)
  start_bench_limiter "$1" "$LPORT" "$OUT/limiter.log"
  LPID=$BLPID
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
if [ -z "${BASE_LIMITER:-}" ]; then
  start_limiter "$OUT/bin/limiter"
  "$OUT/bin/reservebench" -url "http://127.0.0.1:$LPORT" -conns "$CONNS" -duration "${SECONDS_EACH}s" -passes "$PASSES"
else
  for pass in $(seq 1 "$PASSES"); do
    for which in base tree; do
      bin="$OUT/bin/limiter"
      [ "$which" = base ] && bin="$BASE_LIMITER"
      start_limiter "$bin"
      echo "pass $pass: $which"
      "$OUT/bin/reservebench" -url "http://127.0.0.1:$LPORT" -conns "$CONNS" -duration "${SECONDS_EACH}s" -passes 1 | sed "s/^/  $which /"
      kill "$LPID"; wait "$LPID" 2>/dev/null || true
    done
  done
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
