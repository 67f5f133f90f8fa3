#!/usr/bin/env bash
# Concurrency slots (docs/concurrency.md), two parts, each against limiters
# on one redis-server, all on free loopback ports (bench/slotbench):
#
#  1. rate: one limiter; POST /check + POST /release (a slot taken and given
#     back) beside plain POST /check, interleaved PASSES times;
#  2. flight: four limiters (LIMITER_LEASE_TTL=1s); WORKERS callers take
#     slots of FLIGHT_KEYS keys of 8, one in 500 never released; every KILL_EVERY
#     seconds one limiter is SIGKILLed and started again on its port.
#
#   SECONDS_EACH (default 5)   each rate phase
#   PASSES       (default 3)
#   CONNS        (default 32)
#   FLIGHT_SECONDS (default 60), WORKERS (default 64), KILL_EVERY (default 5)
#   FLIGHT_SLOTS (default 0)   end the flight part once this many slots
#                              were taken (FLIGHT_SECONDS is then its cap)
#   LEAK_EVERY   (default 500) one slot in this many is never released
#   FLIGHT_KEYS  (default 1)   keys of 8 slots each, the callers spread over
#                              them (each caller keeps to one key)
#   BASE_LIMITER (optional)    another limiter binary (say, main's build):
#                              the rate part's passes then run against it and
#                              this tree's in turn, for before/after ratios
#                              from the same run; with SKIP_FLIGHT=1 the
#                              flight part is left out
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${SECONDS_EACH:-5}
PASSES=${PASSES:-3}
CONNS=${CONNS:-32}
FLIGHT_SECONDS=${FLIGHT_SECONDS:-60}
WORKERS=${WORKERS:-64}
KILL_EVERY=${KILL_EVERY:-5}
FLIGHT_SLOTS=${FLIGHT_SLOTS:-0}
LEAK_EVERY=${LEAK_EVERY:-500}
FLIGHT_KEYS=${FLIGHT_KEYS:-1}
OUT=${BENCH_OUT:-$(mktemp -d /tmp/ratewarden-slots.XXXXXX)}
source bench/lib.sh
require_tools redis-server
$GO build -o "$OUT/bin/" ./cmd/limiter
$GO build -C bench -o "$(realpath -m "$OUT")/bin/" ./slotbench
start_redis
# start_limiter PORT [BINARY]: a limiter on PORT; sets LPID.
start_limiter() {
  env LIMITER_ADDR="127.0.0.1:$1" LIMITER_GRPC_ADDR= REDIS_ADDRS="127.0.0.1:$RPORT" POLICY_FILE="$ROOT/bench/policy.yaml" \
    LIMITER_STORE_TIMEOUT="${BENCH_STORE_TIMEOUT:-100ms}" LIMITER_LEASE_TTL=1s KAFKA_BROKERS= "${2:-$OUT/bin/limiter}" 2>>"$OUT/limiter.log" &
  LPID=$!
  PIDS+=($LPID)
  wait_port "$1"
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
PORT=$(free_port)
if [ -z "${BASE_LIMITER:-}" ]; then
  start_limiter "$PORT"
  "$OUT/bin/slotbench" -part rate -url "http://127.0.0.1:$PORT" -conns "$CONNS" -duration "${SECONDS_EACH}s" -passes "$PASSES"
  kill "$LPID"; wait "$LPID" 2>/dev/null || true
else
  for pass in $(seq 1 "$PASSES"); do
    for which in base tree; do
      bin="$OUT/bin/limiter"
      [ "$which" = base ] && bin="$BASE_LIMITER"
      start_limiter "$PORT" "$bin"
      "$OUT/bin/slotbench" -part rate -url "http://127.0.0.1:$PORT" -conns "$CONNS" -duration "${SECONDS_EACH}s" -passes 1 | sed "s/^/  $which pass $pass: /"
      kill "$LPID"; wait "$LPID" 2>/dev/null || true
    done
  done
  if [ -n "${SKIP_FLIGHT:-}" ]; then echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"; exit 0; fi
fi

PORTS=() LPIDS=() URLS=""
for i in 0 1 2 3; do
  PORTS[i]=$(free_port)
  start_limiter "${PORTS[i]}"
  LPIDS[i]=$LPID
  URLS="$URLS${URLS:+,}http://127.0.0.1:${PORTS[i]}"
done
"$OUT/bin/slotbench" -part flight -url "$URLS" -workers "$WORKERS" -n 8 -duration "${FLIGHT_SECONDS}s" \
  -slots "$FLIGHT_SLOTS" -leak "$LEAK_EVERY" -keys-flight "$FLIGHT_KEYS" &
BENCH=$!
kills=0
while kill -0 "$BENCH" 2>/dev/null; do
  sleep "$KILL_EVERY"
  kill -0 "$BENCH" 2>/dev/null || break
  i=$((kills % 4))
  kill -9 "${LPIDS[i]}" 2>/dev/null || true
  wait "${LPIDS[i]}" 2>/dev/null || true
  start_limiter "${PORTS[i]}"
  LPIDS[i]=$LPID
  kills=$((kills + 1))
done
wait "$BENCH"
echo "limiters SIGKILLed and restarted during the flight part: $kills"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
