#!/usr/bin/env bash
# The Envoy rate limit service (gRPC ShouldRateLimit, driven by grpcload,
# with ghz and h2load as reference rows) beside POST /check (driven by wrk)
# in one run, against one limiter process and one redis-server on free
# loopback ports: the allowed path over 10,000 distinct keys (descriptors),
# and a flood on one key. Beside decisions/s it reports, per decision, the
# limiter's CPU and allocations and the load tool's CPU: on a 2-core
# machine the load tool shares the cores. grpcload (bench/grpcload: its
# own HTTP/2 over pre-encoded requests, many streams on a few connections,
# as Envoy sends them) costs about what wrk and h2load cost; ghz (grpc-go's
# client) costs several times more and stays as the "what a Go gRPC client
# costs" row. Prints a markdown section for BENCHMARKS.md ("## Envoy rate
# limit service (gRPC) beside /check") on stdout, ending with the issue's
# comparison (gRPC allowed decisions/s ÷ /check's, and the limiter's CPU
# per decision for each); raw outputs go to BENCH_OUT.
#
#   SECONDS_EACH (default 20)  duration of each run
#   CONC         (default 32)  wrk connections / gRPC calls in flight (grpcload and h2load streams, ghz workers)
#   GRPC_CONNS   (default 4)   HTTP/2 connections the gRPC load tools spread them over
#   GRPC_TIMEOUT (default 1s)  grpcload's grpc-timeout on every call: Envoy always sends one (its
#                filter's timeout, 20 ms by default), so the server runs each call under a
#                deadline; 1 s keeps a loaded machine's tail from counting as errors
#   FIXED_RATE   (default 2000) decisions/s offered to both front doors in the fixed-rate
#                allowed-path runs (loadgen for /check, grpcload -rate for gRPC): below what
#                either door answers flat out, so both answer the same load and their
#                CPU per decision compares the servers, not what the load tools left them
#   ROUNDS       (default 3)   interleaved rounds of the flat-out allowed-path pair (/check under wrk,
#                then gRPC under grpcload): the issue's comparison is their median ratio, since
#                on a shared machine one pair of runs can land on different competing loads
#   LIMITER_BIN  (default: ./cmd/limiter built from this tree) the limiter binary to measure,
#                e.g. one built from an older commit for a before/after comparison
#   BENCH_OUT    (default: a temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECONDS_EACH:-20}
CONC=${CONC:-32}
GRPC_CONNS=${GRPC_CONNS:-4}
GRPC_TIMEOUT=${GRPC_TIMEOUT:-1s}
FIXED_RATE=${FIXED_RATE:-2000}
ROUNDS=${ROUNDS:-3}
GHZ_VERSION=v0.93.0
OUT=${BENCH_OUT:-$(mktemp -d /tmp/ratewarden-envoy-bench.XXXXXX)}
source bench/lib.sh
require_tools redis-server wrk h2load curl
echo "bench: building the limiter and ghz $GHZ_VERSION into $OUT/bin" >&2
$GO build -tags vtprotobuf -o "$OUT/bin/" ./cmd/limiter # the tag as in the Makefile and the Dockerfile
$GO build -C bench -tags vtprotobuf -o "$(realpath -m "$OUT")/bin/" ./loadgen ./envoydata ./grpcload # the tools' own module (bench/go.mod)
LIMITER=${LIMITER_BIN:-$OUT/bin/limiter}
(cd "$OUT" && GOBIN="$OUT/bin" GOFLAGS= $GO install "github.com/bojand/ghz/cmd/ghz@$GHZ_VERSION")


start_redis
HPORT=$(free_port)
GPORT=$(free_port)
start_bench_limiter "$LIMITER" "$HPORT" "$OUT/limiter.log" LIMITER_GRPC_ADDR="127.0.0.1:$GPORT" POLICY_FILE="$ROOT/bench/envoy-policy.yaml"
LPID=$BLPID
wait_port "$GPORT"

# ghz sends count-prefixed binary messages round-robin: 10,000 distinct
# descriptors (binary, not JSON: ghz renders JSON data as a template on
# every call, which costs the load tool more CPU than the server spends);
# h2load one gRPC-framed body. grpcload builds its own (bench/rlsreq, the
# same requests).
"$OUT/bin/envoydata" -n 10000 -value acct_ -o "$OUT/uniform.bin"
"$OUT/bin/envoydata" -n 1 -same -value flood_key -grpc-frame -o "$OUT/flood.frame"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$LPID/stat"; }
metric() { curl -s "http://127.0.0.1:$HPORT/metrics" | awk -v m="$1" 'index($0, m) == 1 {s += $NF} END {printf "%d", s}'; }
# The limiter's CPU ticks and allocations so far.
server_snap() { echo "$(cpu_ticks) $(metric go_memstats_mallocs_total)"; }
# per_decision A B N: (B - A) ticks per decision in µs; per_n A B N: (B - A) / N.
per_decision() { awk -v a="$1" -v b="$2" -v n="$3" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.0f", (b - a) * 1e6 / hz / n}'; }
per_n() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN {printf "%.0f", (b - a) / n}'; }
# tool_cpu OUT ERR CMD...: runs CMD (stdout to OUT, stderr to ERR) in a
# subshell and prints the CPU ticks CMD used (the subshell's waited-for
# children: cutime + cstime), which is the load tool's own cost.
tool_cpu() {
  local out=$1 err=$2
  shift 2
  ( "$@" >"$out" 2>"$err" </dev/null || true; awk '{print $16 + $17}' "/proc/$BASHPID/stat" )
}

wrk_run() { # name script -> "rps p50 p99 server-µs server-allocs tool-µs"
  local s0 s1 tool n f="$OUT/$1.wrk"
  s0=$(server_snap)
  tool=$(tool_cpu "$f" "$f.err" wrk -t2 -c"$CONC" -d"${SECS}s" --latency -s "bench/wrk/$2.lua" "http://127.0.0.1:$HPORT/check")
  s1=$(server_snap)
  n=$(awk '/requests in/ {print $1}' "$f")
  set -- $s0 $s1
  echo "$(awk '/^Requests\/sec/ {print $2}' "$f") $(awk '$1 == "50%" {print $2}' "$f") $(awk '$1 == "99%" {print $2}' "$f") $(per_decision "$1" "$3" "$n") $(per_n "$2" "$4" "$n") $(per_decision 0 "$tool" "$n")"
}
ghz_run() { # name datafile [ghz options] -> "rps p50 p99 errors server-µs server-allocs tool-µs"
  local s0 s1 tool name=$1 data=$2
  shift 2
  s0=$(server_snap)
  tool=$(tool_cpu "$OUT/$name.ghz.json" "$OUT/$name.ghz.err" "$OUT/bin/ghz" --insecure --call envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit \
    -c "$CONC" --connections "$GRPC_CONNS" --cpus 2 -z "${SECS}s" --duration-stop wait -B "$data" -O json "$@" "127.0.0.1:$GPORT")
  s1=$(server_snap)
  python3 - "$OUT/$name.ghz.json" $s0 $s1 "$tool" "$(getconf CLK_TCK)" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c0, m0, c1, m1, tool, hz = (float(x) for x in sys.argv[2:8])
lat = {d["percentage"]: d["latency"] / 1e6 for d in r.get("latencyDistribution") or []}
codes = r.get("statusCodeDistribution") or {}
n = max(1, r["count"])
print("%.0f %.2fms %.2fms %d %.0f %.0f %.0f" % (r["rps"], lat.get(50, 0), lat.get(99, 0), sum(v for k, v in codes.items() if k != "OK"),
      (c1 - c0) * 1e6 / hz / n, (m1 - m0) / n, tool * 1e6 / hz / n))
PY
}
# loadgen_run: the allowed path through /check at FIXED_RATE (open model,
# 10,000 keys) -> "rps p50 p99 server-µs server-allocs tool-µs"
loadgen_run() {
  local s0 s1 tool n f="$OUT/$1.loadgen"
  s0=$(server_snap)
  tool=$(tool_cpu "$f" "$f.err" "$OUT/bin/loadgen" -url "http://127.0.0.1:$HPORT/check" -rate "$FIXED_RATE" -from-schedule \
    -duration "${SECS}s" -conns "$CONC" -keys 10000 -dist uniform -label "$1")
  s1=$(server_snap)
  n=$(awk 'NR == 1 {for (i = 2; i <= NF; i++) if ($i == "decisions") print $(i - 1)}' "$f")
  set -- $s0 $s1
  echo "$(awk '/^  summary / {for (i = 2; i <= NF; i++) {split($i, kv, "="); v[kv[1]] = kv[2]}; printf "%s %.2fms %.2fms", v["rps"], v["p50"] / 1000, v["p99"] / 1000}' "$f") $(per_decision "$1" "$3" "$n") $(per_n "$2" "$4" "$n") $(per_decision 0 "$tool" "$n")"
}
# grpcload_run: ShouldRateLimit through grpcload (its own options follow
# the name) -> "rps p50 p99 errors server-µs server-allocs tool-µs". Its
# errors are every call not answered with grpc-status 0 and a well-formed
# RateLimitResponse; decisions are the answered calls.
grpcload_run() {
  local s0 s1 tool n name=$1 f="$OUT/$1.grpcload"
  shift
  s0=$(server_snap)
  tool=$(tool_cpu "$f" "$f.err" "$OUT/bin/grpcload" -addr "127.0.0.1:$GPORT" -conns "$GRPC_CONNS" -streams "$CONC" -timeout "$GRPC_TIMEOUT" -duration "${SECS}s" -label "$name" "$@")
  s1=$(server_snap)
  read -r n errs rps p50 p99 < <(awk '/^  summary / {for (i = 2; i <= NF; i++) {split($i, kv, "="); v[kv[1]] = kv[2]}; print v["calls"] - v["errors"], v["errors"], v["rps"], v["p50"], v["p99"]}' "$f")
  set -- $s0 $s1
  echo "$rps $(awk -v a="$p50" -v b="$p99" 'BEGIN {printf "%.2fms %.2fms", a / 1000, b / 1000}') $errs $(per_decision "$1" "$3" "$n") $(per_n "$2" "$4" "$n") $(per_decision 0 "$tool" "$n")"
}
# h2load sends one fixed body: the flood only. It does not read gRPC
# statuses (they travel in trailers of 200 responses), so the non-OK count
# is the limiter's own (limiter_grpc_requests_total by code), and it reports
# the mean latency, not percentiles.
h2load_run() { # name framefile -> "rps mean errors server-µs server-allocs tool-µs"
  local s0 s1 tool n ok0 all0 ok1 all1 f="$OUT/$1.h2load"
  local m='limiter_grpc_requests_total{code="OK",method="/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}'
  ok0=$(metric "$m"); all0=$(metric 'limiter_grpc_requests_total{')
  s0=$(server_snap)
  tool=$(tool_cpu "$f" "$f.err" h2load -t2 -c"$GRPC_CONNS" -m$((CONC / GRPC_CONNS)) -D "$SECS" -d "$2" -H 'content-type: application/grpc' -H 'te: trailers' \
    "http://127.0.0.1:$GPORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
  s1=$(server_snap)
  ok1=$(metric "$m"); all1=$(metric 'limiter_grpc_requests_total{')
  n=$((ok1 - ok0))
  set -- $s0 $s1
  echo "$(awk '/^finished in/ {print $4}' "$f") $(awk '$1 == "time" && $3 == "request:" {print $6}' "$f") $(( (all1 - all0) - n )) $(per_decision "$1" "$3" "$n") $(per_n "$2" "$4" "$n") $(per_decision 0 "$tool" "$n")"
}

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "bench: warm-up" >&2
wrk -t2 -c"$CONC" -d3s -s bench/wrk/uniform.lua "http://127.0.0.1:$HPORT/check" >/dev/null 2>&1
"$OUT/bin/grpcload" -addr "127.0.0.1:$GPORT" -conns "$GRPC_CONNS" -streams "$CONC" -duration 3s >/dev/null 2>&1 || true
ROUND_ROWS=""
RATIOS=()
CPU_RATIOS=()
for r in $(seq 1 "$ROUNDS"); do
  echo "bench: /check uniform (round $r of $ROUNDS)" >&2;  read -r c_rps c_p50 c_p99 c_cpu c_alloc c_tool <<<"$(wrk_run check-uniform-$r uniform)"
  echo "bench: gRPC uniform (grpcload, round $r of $ROUNDS)" >&2; read -r g_rps g_p50 g_p99 g_err g_cpu g_alloc g_tool <<<"$(grpcload_run grpc-uniform-$r -n 10000 -value acct_)"
  RATIOS+=("$(awk -v g="$g_rps" -v c="$c_rps" 'BEGIN {printf "%.2f", g / c}')")
  CPU_RATIOS+=("$(awk -v g="$g_cpu" -v c="$c_cpu" 'BEGIN {printf "%.2f", g / c}')")
  ROUND_ROWS+="| $r | $c_rps | $g_rps | ${RATIOS[-1]} | $c_cpu µs | $g_cpu µs | ${CPU_RATIOS[-1]} | $c_alloc | $g_alloc | $g_err | $(cut -d' ' -f1 /proc/loadavg) |
"
done
echo "bench: gRPC uniform (ghz)" >&2;  read -r z_rps z_p50 z_p99 z_err z_cpu z_alloc z_tool <<<"$(ghz_run grpc-uniform-ghz "$OUT/uniform.bin")"
echo "bench: /check uniform at $FIXED_RATE/s" >&2; read -r cr_rps cr_p50 cr_p99 cr_cpu cr_alloc cr_tool <<<"$(loadgen_run check-fixed)"
echo "bench: gRPC uniform at $FIXED_RATE/s" >&2;   read -r gr_rps gr_p50 gr_p99 gr_err gr_cpu gr_alloc gr_tool <<<"$(grpcload_run grpc-fixed -n 10000 -value acct_ -rate "$FIXED_RATE")"
ok0=$(metric 'limiter_envoy_descriptors_total{result="over_limit"}')
echo "bench: /check flood" >&2;    read -r cf_rps cf_p50 cf_p99 cf_cpu cf_alloc cf_tool <<<"$(wrk_run check-flood flood)"
echo "bench: gRPC flood (grpcload)" >&2; read -r gf_rps gf_p50 gf_p99 gf_err gf_cpu gf_alloc gf_tool <<<"$(grpcload_run grpc-flood -same -value flood_key)"
echo "bench: gRPC flood (h2load)" >&2; read -r hf_rps hf_mean hf_err hf_cpu hf_alloc hf_tool <<<"$(h2load_run grpc-flood-h2load "$OUT/flood.frame")"
over=$(( $(metric 'limiter_envoy_descriptors_total{result="over_limit"}') - ok0 ))
local_rej=$(metric 'limiter_decisions_total{result="rejected",source="local"}')
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

ratio=$(printf '%s\n' "${RATIOS[@]}" | median)
cpu_ratio=$(printf '%s\n' "${CPU_RATIOS[@]}" | median)
cat <<MD
## Envoy rate limit service (gRPC) beside /check

Written by \`bench/envoy.sh\` on $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),
$(redis-server --version | awk '{print $1, $2, $3}'), Go $($GO env GOVERSION), ghz $GHZ_VERSION, $(h2load --version | head -1). One limiter process (LIMITER_STORE_TIMEOUT=${BENCH_STORE_TIMEOUT:-100ms}),
one redis-server, and the load tool share the cores; the limiter: ${LIMITER_BIN:-built from commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)}. Policy: bench/envoy-policy.yaml (domain \`bench\`, descriptor \`[{key, <key>}]\`
→ key \`<key>\`, scope \`api\`: the same (key, scope) pairs as the /check bodies). Load average at the start: $LOAD0; at the end: $LOAD1
(other sessions' work competes for the same cores: compare the rows of one run, not runs).

**The issue's comparison (allowed path, 10,000 keys, flat out, $ROUNDS interleaved rounds of /check under wrk then gRPC under grpcload):
gRPC decisions/s ÷ /check decisions/s, median $ratio× (rounds: ${RATIOS[*]}; target ≥ 1). Limiter CPU per decision, gRPC ÷ /check:
median $cpu_ratio× (rounds: ${CPU_RATIOS[*]}); at $FIXED_RATE/s offered: gRPC $gr_cpu µs, /check $cr_cpu µs.**

| round | /check decisions/s | gRPC decisions/s | ratio | /check limiter CPU per decision | gRPC limiter CPU per decision | ratio | /check allocations per decision | gRPC allocations per decision | non-OK gRPC answers | load (1 min) after |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
$ROUND_ROWS
The allowed rows of the table below are the last round's.

- /check: \`wrk -t2 -c$CONC -d${SECS}s --latency -s bench/wrk/{uniform,flood}.lua http://127.0.0.1:PORT/check\` ($CONC requests in flight on $CONC HTTP/1.1 connections)
- gRPC, grpcload: \`grpcload -addr 127.0.0.1:PORT -conns $GRPC_CONNS -streams $CONC -timeout $GRPC_TIMEOUT -duration ${SECS}s -n 10000 -value acct_\` (allowed; flood: \`-same -value flood_key\`;
  fixed rate: \`-rate $FIXED_RATE\`): $CONC calls in flight on $GRPC_CONNS HTTP/2 connections, as Envoy multiplexes streams over a few connections,
  each with grpc-timeout $GRPC_TIMEOUT (Envoy always sends one; ghz sends its 20 s default),
  10,000 RateLimitRequests with distinct descriptors (\`acct_1\` … \`acct_10000\`, bench/rlsreq) marshaled once and sent round-robin;
  bench/grpcload speaks HTTP/2 itself (golang.org/x/net/http2 Framer and hpack, flow control honoured) and reads every answer's
  grpc-status and overall code, so its non-OK column is every call not answered with a RateLimitResponse.
- gRPC, ghz (the allowed path only: what a client built on grpc-go costs): \`ghz --insecure --call envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit -c $CONC --connections $GRPC_CONNS --cpus 2 -z ${SECS}s --duration-stop wait -B uniform.bin 127.0.0.1:PORT\`
  (uniform.bin = the same 10,000 requests, length-delimited, written by bench/envoydata).
- gRPC, h2load (flood only: it sends one fixed body): \`h2load -t2 -c$GRPC_CONNS -m$((CONC / GRPC_CONNS)) -D $SECS -d flood.frame -H 'content-type: application/grpc' -H 'te: trailers' http://127.0.0.1:PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit\`
  (the same $CONC calls in flight on $GRPC_CONNS connections; flood.frame = the flood request behind gRPC's 5-byte frame header, \`envoydata -grpc-frame\`).
  The flood descriptor is \`flood_key\` (10/s, burst 10).
- The same allowed path at a fixed $FIXED_RATE decisions/s offered to each door, below what either answers flat out:
  \`loadgen -url http://127.0.0.1:PORT/check -rate $FIXED_RATE -from-schedule -duration ${SECS}s -conns $CONC -keys 10000 -dist uniform\` and the grpcload
  command above with \`-rate $FIXED_RATE\` (both open model, latency from when each call was due).

| path | front door (load tool) | decisions/s | p50 | p99 | limiter CPU per decision | limiter allocations per decision | load tool CPU per decision | non-OK gRPC answers |
|---|---|---:|---:|---:|---:|---:|---:|---:|
| allowed, 10,000 keys | POST /check (wrk) | $c_rps | $c_p50 | $c_p99 | $c_cpu µs | $c_alloc | $c_tool µs | |
| allowed, 10,000 descriptors | ShouldRateLimit (grpcload) | $g_rps | $g_p50 | $g_p99 | $g_cpu µs | $g_alloc | $g_tool µs | $g_err |
| allowed, 10,000 descriptors | ShouldRateLimit (ghz) | $z_rps | $z_p50 | $z_p99 | $z_cpu µs | $z_alloc | $z_tool µs | $z_err |
| allowed, 10,000 keys, $FIXED_RATE/s offered | POST /check (loadgen) | $cr_rps | $cr_p50 | $cr_p99 | $cr_cpu µs | $cr_alloc | $cr_tool µs | |
| allowed, 10,000 descriptors, $FIXED_RATE/s offered | ShouldRateLimit (grpcload -rate) | $gr_rps | $gr_p50 | $gr_p99 | $gr_cpu µs | $gr_alloc | $gr_tool µs | $gr_err |
| flood, one key | POST /check (wrk) | $cf_rps | $cf_p50 | $cf_p99 | $cf_cpu µs | $cf_alloc | $cf_tool µs | |
| flood, one descriptor | ShouldRateLimit (grpcload) | $gf_rps | $gf_p50 | $gf_p99 | $gf_cpu µs | $gf_alloc | $gf_tool µs | $gf_err |
| flood, one descriptor | ShouldRateLimit (h2load) | $hf_rps | mean $hf_mean | | $hf_cpu µs | $hf_alloc | $hf_tool µs | $hf_err |

"limiter CPU per decision" is the limiter process's user + system CPU time over the run (/proc/PID/stat) divided by the
decisions it answered, "limiter allocations per decision" the growth of its \`go_memstats_mallocs_total\` divided the same way,
and "load tool CPU per decision" the load tool's own user + system CPU time (its exit accounting) divided the same way: on
two shared cores, decisions/s is set by the sum of the last two columns (plus Redis), so a costly client lowers it without
the server being slower. h2load does not read gRPC statuses (they travel in trailers): its decisions are the limiter's
count of OK answers and its non-OK column is the limiter's count of other codes (calls cut at the end of the run are
CANCELLED); it reports a mean latency, no percentiles. grpcload lets the calls in flight at the end finish.

During the gRPC floods $over descriptors were answered OVER_LIMIT; over the whole run the local tier rejected $local_rej decisions
in process (both front doors share it).
MD
