#!/usr/bin/env bash
# The Envoy rate limit service (gRPC ShouldRateLimit, driven by ghz) beside
# POST /check (driven by wrk) in one run, against one limiter process and
# one redis-server on free loopback ports: the allowed path over 10,000
# distinct keys (descriptors), and a flood on one key. Prints a markdown
# section for BENCHMARKS.md ("## Envoy rate limit service (gRPC) beside
# /check") on stdout; raw outputs go to BENCH_OUT.
#
#   SECONDS_EACH (default 20)  duration of each run
#   CONC         (default 32)  wrk connections / ghz concurrent workers
#   BENCH_OUT    (default: a temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
GO=${GO:-go}
SECS=${SECONDS_EACH:-20}
CONC=${CONC:-32}
GHZ_VERSION=v0.93.0
OUT=${BENCH_OUT:-$(mktemp -d /tmp/ratewarden-envoy-bench.XXXXXX)}
mkdir -p "$OUT/bin"
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap cleanup EXIT
for tool in redis-server wrk; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is not installed" >&2; exit 1; }
done
echo "bench: building the limiter and ghz $GHZ_VERSION into $OUT/bin" >&2
$GO build -o "$OUT/bin/" ./cmd/limiter ./bench/envoydata
(cd "$OUT" && GOBIN="$OUT/bin" GOFLAGS= $GO install "github.com/bojand/ghz/cmd/ghz@$GHZ_VERSION")

free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 30000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
}
wait_port() {
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "bench: nothing listens on $1" >&2; exit 1
}

RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$OUT" --loglevel warning >"$OUT/redis.log" 2>&1 &
PIDS+=($!)
wait_port "$RPORT"
HPORT=$(free_port)
GPORT=$(free_port)
# LIMITER_STORE_TIMEOUT as in bench/run.sh: on a 2-core machine shared with
# the load tools the default 5 ms deadline would measure degraded decisions.
env LIMITER_ADDR="127.0.0.1:$HPORT" LIMITER_GRPC_ADDR="127.0.0.1:$GPORT" REDIS_ADDRS="127.0.0.1:$RPORT" \
  POLICY_FILE="$ROOT/bench/envoy-policy.yaml" LIMITER_STORE_TIMEOUT="${BENCH_STORE_TIMEOUT:-100ms}" KAFKA_BROKERS= \
  "$OUT/bin/limiter" 2>>"$OUT/limiter.log" &
LPID=$!
PIDS+=($LPID)
wait_port "$HPORT"
wait_port "$GPORT"

# ghz sends count-prefixed binary messages round-robin: 10,000 distinct
# descriptors (binary, not JSON: ghz renders JSON data as a template on
# every call, which costs the load tool more CPU than the server spends).
"$OUT/bin/envoydata" -n 10000 -value acct_ -o "$OUT/uniform.bin"
"$OUT/bin/envoydata" -n 1 -same -value flood_key -o "$OUT/flood.bin"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$LPID/stat"; }
per_decision() { # ticks-before ticks-after decisions -> limiter CPU µs per decision
  awk -v a="$1" -v b="$2" -v n="$3" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.0f", (b - a) * 1e6 / hz / n}'
}
wrk_run() { # name script -> "rps p50 p99 cpu-µs/decision"
  local t0 t1
  t0=$(cpu_ticks)
  wrk -t2 -c"$CONC" -d"${SECS}s" --latency -s "bench/wrk/$2.lua" "http://127.0.0.1:$HPORT/check" >"$OUT/$1.wrk" 2>&1
  t1=$(cpu_ticks)
  echo "$(awk '/^Requests\/sec/ {print $2}' "$OUT/$1.wrk") $(awk '$1 == "50%" {print $2}' "$OUT/$1.wrk") $(awk '$1 == "99%" {print $2}' "$OUT/$1.wrk") $(per_decision "$t0" "$t1" "$(awk '/requests in/ {print $1}' "$OUT/$1.wrk")")"
}
ghz_run() { # name datafile -> "rps p50 p99 errors cpu-µs/decision"
  local t0 t1
  t0=$(cpu_ticks)
  "$OUT/bin/ghz" --insecure --call envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit \
    -c "$CONC" --connections 4 --cpus 2 -z "${SECS}s" --duration-stop wait -B "$2" -O json "127.0.0.1:$GPORT" >"$OUT/$1.ghz.json" 2>"$OUT/$1.ghz.err" || true
  t1=$(cpu_ticks)
  python3 - "$OUT/$1.ghz.json" "$t0" "$t1" "$(getconf CLK_TCK)" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
lat = {d["percentage"]: d["latency"] / 1e6 for d in r.get("latencyDistribution") or []}
codes = r.get("statusCodeDistribution") or {}
cpu = (float(sys.argv[3]) - float(sys.argv[2])) * 1e6 / float(sys.argv[4]) / max(1, r["count"])
print("%.0f %.2fms %.2fms %d %.0f" % (r["rps"], lat.get(50, 0), lat.get(99, 0), sum(v for k, v in codes.items() if k != "OK"), cpu))
PY
}
metric() { curl -s "http://127.0.0.1:$HPORT/metrics" | awk -v m="$1" 'index($0, m) == 1 {s += $NF} END {printf "%d", s}'; }

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "bench: warm-up" >&2
wrk -t2 -c"$CONC" -d3s -s bench/wrk/uniform.lua "http://127.0.0.1:$HPORT/check" >/dev/null 2>&1
echo "bench: /check uniform" >&2;  read -r c_rps c_p50 c_p99 c_cpu <<<"$(wrk_run check-uniform uniform)"
echo "bench: gRPC uniform" >&2;    read -r g_rps g_p50 g_p99 g_err g_cpu <<<"$(ghz_run grpc-uniform "$OUT/uniform.bin")"
ok0=$(metric 'limiter_envoy_descriptors_total{result="over_limit"}')
echo "bench: /check flood" >&2;    read -r cf_rps cf_p50 cf_p99 cf_cpu <<<"$(wrk_run check-flood flood)"
echo "bench: gRPC flood" >&2;      read -r gf_rps gf_p50 gf_p99 gf_err gf_cpu <<<"$(ghz_run grpc-flood "$OUT/flood.bin")"
over=$(( $(metric 'limiter_envoy_descriptors_total{result="over_limit"}') - ok0 ))
local_rej=$(metric 'limiter_decisions_total{result="rejected",source="local"}')
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

cat <<MD
## Envoy rate limit service (gRPC) beside /check

Written by \`bench/envoy.sh\` on $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),
$(redis-server --version | awk '{print $1, $2, $3}'), Go $($GO env GOVERSION), ghz $GHZ_VERSION. One limiter process (LIMITER_STORE_TIMEOUT=${BENCH_STORE_TIMEOUT:-100ms}),
one redis-server, and the load tool share the cores. Policy: bench/envoy-policy.yaml (domain \`bench\`, descriptor \`[{key, <key>}]\`
→ key \`<key>\`, scope \`api\`: the same (key, scope) pairs as the /check bodies). Load average at the start: $LOAD0; at the end: $LOAD1
(other sessions' work competes for the same cores: compare the rows of one run, not runs).

- /check: \`wrk -t2 -c$CONC -d${SECS}s --latency -s bench/wrk/{uniform,flood}.lua http://127.0.0.1:PORT/check\`
- gRPC: \`ghz --insecure --call envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit -c $CONC --connections 4 --cpus 2 -z ${SECS}s --duration-stop wait -B {uniform,flood}.bin 127.0.0.1:PORT\`,
  uniform.bin = 10,000 RateLimitRequests with distinct descriptors (\`acct_1\` … \`acct_10000\`, written by bench/envoydata), sent round-robin; flood.bin = one descriptor (\`flood_key\`, 10/s, burst 10).

| path | front door | decisions/s | p50 | p99 | limiter CPU per decision | non-OK gRPC statuses |
|---|---|---:|---:|---:|---:|---:|
| allowed, 10,000 keys | POST /check (wrk) | $c_rps | $c_p50 | $c_p99 | $c_cpu µs | |
| allowed, 10,000 descriptors | ShouldRateLimit (ghz) | $g_rps | $g_p50 | $g_p99 | $g_cpu µs | $g_err |
| flood, one key | POST /check (wrk) | $cf_rps | $cf_p50 | $cf_p99 | $cf_cpu µs | |
| flood, one descriptor | ShouldRateLimit (ghz) | $gf_rps | $gf_p50 | $gf_p99 | $gf_cpu µs | $gf_err |

"limiter CPU per decision" is the limiter process's user + system CPU time over the run (/proc/PID/stat) divided by the
decisions it answered: what each front door costs the server, apart from what the load tool costs the shared cores
(ghz, a Go gRPC client, spends several times wrk's CPU per call, so decisions/s under-states the gRPC path here).

During the gRPC flood $over descriptors were answered OVER_LIMIT; over the whole run the local tier rejected $local_rej decisions
in process (both front doors share it). Raw outputs: \`$OUT\`.
MD
