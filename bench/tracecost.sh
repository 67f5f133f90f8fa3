#!/usr/bin/env bash
# What tracing costs a decision (docs/tracing.md, "Cost"), with the real
# binary on the allowed path of POST /check (bench/wrk/uniform.lua's
# bodies, 10,000 keys), interleaved so that other work on the machine
# weighs on every configuration alike:
#
#   base         the limiter built from BASE_REV (default: main just before
#                tracing was merged); "" skips it
#   off          this tree's limiter, no OTEL_* variable set
#   sampled1pct  this tree's limiter, OTEL_TRACES_SAMPLER=parentbased_traceidratio,
#                OTEL_TRACES_SAMPLER_ARG=0.01, exporting over OTLP/HTTP to a
#                local sink that answers 200
#
# Part 1, throughput: ROUNDS rounds of the floor (bench/barejson) then each
# configuration, order rotated per round, under `wrk -t2 -c32`; req/s ÷ the
# floor's run of that round. Part 2, CPU per decision over a fixed count:
# PASSES passes in which every configuration is driven at the same time,
# each by its own `loadgen -rate RATE -duration FIXED_SECONDS` (open model:
# the same requests, RATE × FIXED_SECONDS, whatever the machine's speed;
# TOGETHER=0 drives them one after the other, rotated); the
# server's user + system time (/proc/PID/stat) ÷ the decisions it counted
# (limiter_decisions_total), and its allocations (go_memstats_mallocs_total)
# ÷ the same. Prints one line per run, then the medians and spreads.
#
#   WRK_SECONDS   (default 10)   each wrk run
#   ROUNDS        (default 3)    throughput rounds
#   PASSES        (default 6)    fixed-count passes
#   RATE          (default 3000) requests per second of each fixed-count run
#   FIXED_SECONDS (default 10)   each fixed-count run
#   GOGC_RUNS     (optional, 1)  also off and 1% with GOGC=400
#   SATURATED_ROUNDS (default 0) part 3's rounds
#   ROUNDS=0 or PASSES=0 skips that part
#   BASE_REV      (default 935b203^1)
set -euo pipefail
cd "$(dirname "$0")/.."
export GOFLAGS=${GOFLAGS:--tags=vtprotobuf}
WRK_SECONDS=${WRK_SECONDS:-10}
ROUNDS=${ROUNDS:-3}
PASSES=${PASSES:-6}
RATE=${RATE:-3000}
FIXED_SECONDS=${FIXED_SECONDS:-10}
BASE_REV=${BASE_REV-935b203^1}
OUT=$(mktemp -d /tmp/ratewarden-tracecost.XXXXXX)
source bench/lib.sh
require_tools redis-server wrk python3 curl
go build -o "$OUT/" ./cmd/limiter
go build -C bench -o "$OUT/" ./barejson ./loadgen # the tools' own module (bench/go.mod)
if [ -n "$BASE_REV" ]; then
  mkdir -p "$OUT/base"
  git archive "$BASE_REV" | tar -x -C "$OUT/base"
  (cd "$OUT/base" && go build -o "$OUT/limiter-base" ./cmd/limiter)
fi
metric() { # name port -> the sum of the metric's samples
  curl -s "http://127.0.0.1:$2/metrics" | awk -v m="$1" '$1 == m || index($1, m "{") == 1 {s += $2} END {printf "%.0f", s}'
}
start_redis
SPORT=$(free_port) # the OTLP sink: 200 and an empty ExportTraceServiceResponse
python3 -c '
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200); self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()' "$SPORT" &
SINKPID=$!
PIDS+=($SINKPID)
start_floor "$OUT/barejson"
declare -A PORT PID
ONE_PCT=(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$SPORT" OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.01)
RUNS=()
[ -n "$BASE_REV" ] && { start_named_limiter base "$OUT/limiter-base"; RUNS+=(base); }
start_named_limiter off "$OUT/limiter"
start_named_limiter sampled1pct "$OUT/limiter" "${ONE_PCT[@]}"
RUNS+=(off sampled1pct)
if [ -n "${GOGC_RUNS:-}" ]; then
  start_named_limiter off-gogc400 "$OUT/limiter" GOGC=400
  start_named_limiter sampled1pct-gogc400 "$OUT/limiter" GOGC=400 "${ONE_PCT[@]}"
  RUNS+=(off-gogc400 sampled1pct-gogc400)
fi
PORT[floor]=$FPORT
PID[floor]=$FPID
rotated() { # i -> RUNS rotated by i
  local n=${#RUNS[@]} j
  for j in $(seq 0 $((n - 1))); do echo "${RUNS[$(((j + $1) % n))]}"; done
}
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; BASE_REV=$BASE_REV; raw outputs: $OUT"

echo "-- throughput: wrk -t2 -c32 -d${WRK_SECONDS}s, $ROUNDS rounds (floor, then the limiters rotated)"
for round in $(seq 1 "$ROUNDS"); do
  floor_rps=
  for name in floor $(rotated "$round"); do
    l=$(cut -d' ' -f1 /proc/loadavg)
    t0=$(ticks "${PID[$name]}")
    s0=$(ticks "$SINKPID")
    wrk -t2 -c32 -d"${WRK_SECONDS}s" -s bench/wrk/uniform.lua "http://127.0.0.1:${PORT[$name]}/check" >"$OUT/$name$round.wrk" 2>&1
    t1=$(ticks "${PID[$name]}")
    s1=$(ticks "$SINKPID")
    rps=$(awk '/^Requests\/sec/ {print $2}' "$OUT/$name$round.wrk")
    [ "$name" = floor ] && floor_rps=$rps
    printf 'wrk %d %-20s %9.0f req/s  ÷floor %.2f  CPU %5.1f µs/req  sink %d ticks  load %s\n' "$round" "$name" "$rps" \
      "$(awk -v a="$rps" -v b="$floor_rps" 'BEGIN {print a / b}')" \
      "$(awk -v a="$t0" -v b="$t1" -v r="$rps" -v s="$WRK_SECONDS" -v hz="$(getconf CLK_TCK)" 'BEGIN {print (b - a) * 1e6 / hz / (r * s)}')" \
      "$((s1 - s0))" "$l"
  done
done | tee "$OUT/wrk.txt"

[ "$PASSES" -gt 0 ] && for name in "${RUNS[@]}"; do # warm-up: connections, the exporter's start, the heap's size
  "$OUT/loadgen" -url "http://127.0.0.1:${PORT[$name]}/check" -rate "$RATE" -duration 2s -conns 32 -keys 10000 >/dev/null
done
# One configuration's counters: "CPU-ticks decisions mallocs".
snap() { echo "$(ticks "${PID[$1]}") $(metric limiter_decisions_total "${PORT[$1]}") $(metric go_memstats_mallocs_total "${PORT[$1]}")"; }
drive() { # name pass
  "$OUT/loadgen" -url "http://127.0.0.1:${PORT[$1]}/check" -rate "$RATE" -duration "${FIXED_SECONDS}s" -conns 32 -keys 10000 \
    -dist uniform -label "$1$2" >"$OUT/$1$2.loadgen"
}
report() { # pass name load "before" "after"
  read -r t0 d0 m0 <<<"$4"
  read -r t1 d1 m1 <<<"$5"
  awk -v pass="$1" -v n="$2" -v a="$t0" -v b="$t1" -v d="$((d1 - d0))" -v m="$((m1 - m0))" -v hz="$(getconf CLK_TCK)" -v l="$3" \
    'BEGIN {printf "cpu %d %-20s %7d decisions  CPU %6.2f µs/decision  %5.1f allocs/decision  load %s\n", pass, n, d, (b - a) * 1e6 / hz / d, m / d, l}'
}
if [ "${TOGETHER:-1}" = 1 ]; then
  echo "-- CPU per decision: every configuration at once, each under its own loadgen -rate $RATE -duration ${FIXED_SECONDS}s -conns 32 -keys 10000, $PASSES passes"
else
  echo "-- CPU per decision: loadgen -rate $RATE -duration ${FIXED_SECONDS}s -conns 32 -keys 10000, $PASSES passes (rotated)"
fi
for pass in $(seq 1 "$PASSES"); do
  l=$(cut -d' ' -f1 /proc/loadavg)
  if [ "${TOGETHER:-1}" = 1 ]; then
    # All at once: whatever else runs on the machine weighs on each
    # configuration during the same seconds.
    declare -A B=()
    for name in "${RUNS[@]}"; do B[$name]=$(snap "$name"); done
    for name in "${RUNS[@]}"; do drive "$name" "$pass" & done
    wait $(jobs -p) 2>/dev/null || true
    for name in "${RUNS[@]}"; do report "$pass" "$name" "$l" "${B[$name]}" "$(snap "$name")"; done
  else
    for name in $(rotated "$pass"); do
      l=$(cut -d' ' -f1 /proc/loadavg)
      b=$(snap "$name")
      drive "$name" "$pass"
      report "$pass" "$name" "$l" "$b" "$(snap "$name")"
    done
  fi
done | tee "$OUT/cpu.txt"

# Part 3, saturated: every configuration under its own `wrk -t1 -c16` at
# the same time, SATURATED_ROUNDS rounds; CPU per request and req/s.
for round in $(seq 1 "${SATURATED_ROUNDS:-0}"); do
  l=$(cut -d' ' -f1 /proc/loadavg)
  declare -A T0=() W=()
  for name in "${RUNS[@]}"; do T0[$name]=$(ticks "${PID[$name]}"); done
  for name in "${RUNS[@]}"; do
    wrk -t1 -c16 -d"${WRK_SECONDS}s" -s bench/wrk/uniform.lua "http://127.0.0.1:${PORT[$name]}/check" >"$OUT/sat-$name$round.wrk" 2>&1 &
    W[$name]=$!
  done
  wait "${W[@]}"
  for name in "${RUNS[@]}"; do
    rps=$(awk '/^Requests\/sec/ {print $2}' "$OUT/sat-$name$round.wrk")
    awk -v r="$round" -v n="$name" -v rps="$rps" -v a="${T0[$name]}" -v b="$(ticks "${PID[$name]}")" -v s="$WRK_SECONDS" -v hz="$(getconf CLK_TCK)" -v l="$l" \
      'BEGIN {printf "sat %d %-20s %9.0f req/s  CPU %6.2f µs/req  load %s\n", r, n, rps, (b - a) * 1e6 / hz / (rps * s), l}'
  done
done | tee "$OUT/sat.txt"

med() { sort -g | awk '{a[NR] = $1} END {if (NR == 0) {print "–"; exit} m = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%.3f (%.3f–%.3f)", m, a[1], a[NR]}'; }
echo "-- medians (min–max); \"÷ off\": each pass's CPU per decision over off's in the same pass"
for name in "${RUNS[@]}"; do
  printf '%-20s req/s ÷ floor %s; CPU µs/decision %s; ÷ off %s; allocs/decision %s\n' "$name" \
    "$(awk -v n="$name" '$1 == "wrk" && $3 == n {print $7}' "$OUT/wrk.txt" | med)" \
    "$(awk -v n="$name" '$1 == "cpu" && $3 == n {print $7}' "$OUT/cpu.txt" | med)" \
    "$(awk -v n="$name" '$1 == "cpu" && $3 == "off" {off[$2] = $7} $1 == "cpu" && $3 == n {v[$2] = $7} END {for (p in v) print v[p] / off[p]}' "$OUT/cpu.txt" | med)" \
    "$(awk -v n="$name" '$1 == "cpu" && $3 == n {print $9}' "$OUT/cpu.txt" | med)"
  [ "${SATURATED_ROUNDS:-0}" -gt 0 ] && printf '%-20s saturated: req/s ÷ off %s; CPU µs/req ÷ off %s\n' "$name" \
    "$(awk -v n="$name" '$1 == "sat" && $3 == "off" {o[$2] = $4} $1 == "sat" && $3 == n {v[$2] = $4} END {for (p in v) print v[p] / o[p]}' "$OUT/sat.txt" | med)" \
    "$(awk -v n="$name" '$1 == "sat" && $3 == "off" {o[$2] = $7} $1 == "sat" && $3 == n {v[$2] = $7} END {for (p in v) print v[p] / o[p]}' "$OUT/sat.txt" | med)"
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
