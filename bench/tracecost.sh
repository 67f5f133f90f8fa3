#!/usr/bin/env bash
# What tracing costs a decision (docs/tracing.md, "Cost"): the allowed
# path of POST /check under the same wrk load, interleaved per round:
# the HTTP floor (bench/barejson), the limiter built from BASE_REV (before
# tracing; skipped when unset), this tree's limiter with tracing off, and
# with tracing on at 1% (OTEL_TRACES_SAMPLER=parentbased_traceidratio,
# ARG=0.01) exporting over OTLP/HTTP to a local sink that answers 200.
# Prints one line per run: req/s, ÷ floor, and the server's CPU µs per
# request (/proc/PID/stat utime+stime over the run ÷ requests).
#
#   WRK_SECONDS (default 10)  each wrk run
#   ROUNDS      (default 3)   interleaved rounds
#   BASE_REV    (optional)    a git revision to build the "before" limiter from
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WRK_SECONDS=${WRK_SECONDS:-10}
ROUNDS=${ROUNDS:-3}
OUT=$(mktemp -d /tmp/ratewarden-tracecost.XXXXXX)
source bench/lib.sh
require_tools redis-server wrk python3
go build -o "$OUT/" ./cmd/limiter
go build -C bench -o "$OUT/" ./barejson # the tools' own module (bench/go.mod)
if [ -n "${BASE_REV:-}" ]; then
  mkdir -p "$OUT/base"
  git archive "$BASE_REV" | tar -x -C "$OUT/base"
  (cd "$OUT/base" && go build -o "$OUT/limiter-base" ./cmd/limiter)
fi
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
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
PIDS+=($!)
FPORT=$(free_port)
"$OUT/barejson" -addr "127.0.0.1:$FPORT" 2>>"$OUT/floor.log" &
FPID=$!; PIDS+=($FPID)
declare -A PORT PID
limiter() { # name binary env...
  local name=$1 bin=$2 port; shift 2
  port=$(free_port)
  env LIMITER_ADDR="127.0.0.1:$port" REDIS_ADDRS="127.0.0.1:$RPORT" POLICY_FILE="$ROOT/bench/policy.yaml" \
    LIMITER_STORE_TIMEOUT=100ms KAFKA_BROKERS= LIMITER_GRPC_ADDR= REDIS_KEY_PREFIX="$name" "$@" "$bin" 2>>"$OUT/$name.log" &
  PID[$name]=$!; PORT[$name]=$port; PIDS+=($!)
  wait_port "$port"
}
RUNS=(floor)
[ -n "${BASE_REV:-}" ] && { limiter base "$OUT/limiter-base"; RUNS+=(base); }
limiter off "$OUT/limiter"
limiter sampled1pct "$OUT/limiter" OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$SPORT" \
  OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.01
RUNS+=(off sampled1pct)
PORT[floor]=$FPORT; PID[floor]=$FPID
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg); raw outputs: $OUT"
for round in $(seq 1 "$ROUNDS"); do
  floor_rps=
  # The floor first, then the limiters in an order rotated each round, so
  # that no configuration always runs right after another.
  order=(floor)
  n=$((${#RUNS[@]} - 1))
  for i in $(seq 0 $((n - 1))); do order+=("${RUNS[$((1 + (i + round) % n))]}"); done
  for name in "${order[@]}"; do
    l=$(cut -d' ' -f1 /proc/loadavg)
    t0=$(ticks "${PID[$name]}")
    wrk -t2 -c32 -d"${WRK_SECONDS}s" -s bench/wrk/uniform.lua "http://127.0.0.1:${PORT[$name]}/check" >"$OUT/$name$round.wrk" 2>&1
    t1=$(ticks "${PID[$name]}")
    rps=$(awk '/^Requests\/sec/ {print $2}' "$OUT/$name$round.wrk")
    [ "$name" = floor ] && floor_rps=$rps
    awk -v r="$round" -v n="$name" -v rps="$rps" -v f="$floor_rps" -v a="$t0" -v b="$t1" -v s="$WRK_SECONDS" -v hz="$(getconf CLK_TCK)" -v l="$l" \
      'BEGIN {printf "round %d %-12s %9.0f req/s  ÷floor %.2f  CPU %5.1f µs/req  load %s\n", r, n, rps, rps / f, (b - a) * 1e6 / hz / (rps * s), l}'
  done
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
