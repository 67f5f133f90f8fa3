#!/usr/bin/env bash
# bench/spooldrain.sh: what the metering spool's drain costs the /check
# allowed path. Each pass runs loadgen flat out (-conns 32, 10,000 keys of
# bench/policy.yaml's allowed tier) for SECONDS_EACH against two limiters
# in turn, each on the same Redis and the same broker (cmd/kafka-dev, its
# own process): one with an empty spool, and one whose spool was filled
# just before (the same limiter driven for FILL_SECONDS with Kafka
# unreachable, then stopped) and is draining into the broker during the
# whole run (its /readyz must still show a backlog at the end). Prints one
# line per pass: decisions/s of each and their ratio draining ÷ empty, and
# the limiter's CPU per decision (µs, /proc/PID/stat) of each and its ratio
# empty ÷ draining, which a machine shared with other work disturbs less.
#
#   PASSES=3 SECONDS_EACH=5 FILL_SECONDS=40 bash bench/spooldrain.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PASSES=${PASSES:-3}
SECONDS_EACH=${SECONDS_EACH:-5}
FILL_SECONDS=${FILL_SECONDS:-40}
OUT=${BENCH_OUT:-$(mktemp -d /tmp/ratewarden-spool.XXXXXX)}
source bench/lib.sh
require_tools redis-server curl jq
$GO build -o "$OUT/bin/" ./cmd/limiter ./cmd/kafka-dev
$GO build -C bench -o "$(realpath -m "$OUT")/bin/" ./loadgen
start_redis
KPORT=$(free_port)
KAFKA_DEV_ADDR="127.0.0.1:$KPORT" KAFKA_DEV_PARTITIONS=4 "$OUT/bin/kafka-dev" 2>>"$OUT/kafka.log" &
PIDS+=($!)
wait_port "$KPORT"

limiter() { # spool-dir brokers -> starts a limiter; sets LPORT LPID
  LPORT=$(free_port)
  start_bench_limiter "$OUT/bin/limiter" "$LPORT" "$OUT/limiter.log" KAFKA_BROKERS="$2" LIMITER_SPOOL_DIR="$1" LIMITER_KAFKA_CHECK_EVERY=1h
  LPID=$BLPID
}
stop() { kill "$1"; wait "$1" 2>/dev/null || true; }
drive() { # seconds -> "decisions/s µs-of-limiter-CPU-per-decision"
  local t0 t1
  t0=$(ticks "$LPID")
  "$OUT/bin/loadgen" -url "http://127.0.0.1:$LPORT/check" -duration "${1}s" -conns 32 -keys 10000 -json "$OUT/lg.json" >/dev/null 2>&1
  t1=$(ticks "$LPID")
  echo "$(jq -r '.perSecond | floor' "$OUT/lg.json") $(us_per "$t0" "$t1" "$(jq -r '.requests' "$OUT/lg.json")")"
}
spooled() { curl -fsS "http://127.0.0.1:$LPORT/readyz" | jq -r '.metering.spool.events'; }

echo "pass | empty spool decisions/s | draining decisions/s | ratio | empty µs CPU/decision | draining µs CPU/decision | ratio | spooled before | left after | load"
for pass in $(seq 1 "$PASSES"); do
  rm -rf "$OUT/full" "$OUT/empty"
  DEAD=$(free_port) # nothing listens: every event goes to the spool
  limiter "$OUT/full" "127.0.0.1:$DEAD"
  drive "$FILL_SECONDS" >/dev/null
  stop "$LPID"
  limiter "$OUT/empty" "127.0.0.1:$KPORT"
  read -r a ac <<<"$(drive "$SECONDS_EACH")"
  stop "$LPID"
  limiter "$OUT/full" "127.0.0.1:$KPORT"
  before=$(spooled)
  read -r b bc <<<"$(drive "$SECONDS_EACH")"
  left=$(spooled)
  stop "$LPID"
  echo "$pass | $a | $b | $(ratio "$b" "$a") | $ac | $bc | $(ratio "$ac" "$bc") | $before | $left | $(load)"
done
