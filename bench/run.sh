#!/usr/bin/env bash
# make bench: the hot-key and scale-out benchmarks of issue 5, side by side
# in one run on this machine. Starts its own redis-server and limiter
# processes on free loopback ports, drives them with wrk and bench/loadgen,
# and writes the section "## Hot keys and scale-out" of BENCHMARKS.md
# (replacing the previous one; other sections are left alone).
#
#   WRK_SECONDS (default 20)  duration of each wrk run
#   LG_SECONDS  (default 10)  duration of each loadgen run
#   BENCH_OUT   (default: a temporary directory) where raw outputs go
#   BENCHMARKS_FILE (default: BENCHMARKS.md of this tree) the file to update
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
GO=${GO:-go}
WRK_SECONDS=${WRK_SECONDS:-20}
LG_SECONDS=${LG_SECONDS:-10}
OUT=${BENCH_OUT:-$(mktemp -d /tmp/ratewarden-bench.XXXXXX)}
MD=${BENCHMARKS_FILE:-$ROOT/BENCHMARKS.md}
mkdir -p "$OUT/bin"
source bench/lib.sh

require_tools redis-server redis-cli redis-benchmark wrk

echo "bench: building into $OUT/bin" >&2
$GO build -o "$OUT/bin/" ./cmd/limiter
$GO build -C bench -o "$(realpath -m "$OUT")/bin/" ./loadgen ./barejson ./profile # the tools' own module (bench/go.mod)

scripts() { # EVALSHA + EVAL calls so far
  redis-cli -p "$RPORT" info commandstats | tr -d '\r' |
    awk -F'[=:,]' '/^cmdstat_evalsha:|^cmdstat_eval:/ {n += $3} END {print n + 0}'
}
wrk_run() { # name url script -> "rps p50 p99" in $OUT/name.wrk
  local name=$1 url=$2 script=$3
  wrk -t2 -c32 -d"${WRK_SECONDS}s" --latency -s "$script" "$url" >"$OUT/$name.wrk" 2>&1
  local rps p50 p99
  rps=$(awk '/^Requests\/sec/ {print $2}' "$OUT/$name.wrk")
  p50=$(awk '$1 == "50%" {print $2}' "$OUT/$name.wrk")
  p99=$(awk '$1 == "99%" {print $2}' "$OUT/$name.wrk")
  echo "$rps $p50 $p99"
}
row() { # file template: fills %name from the loadgen summary line
  awk -v tpl="$2" '/^  summary / {
    for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    out = tpl
    for (k in v) gsub("%" k, v[k], out)
    print out
  }' "$1"
}
start_limiter() { # port instances [env...]
  local port=$1 n=$2
  shift 2
  # LIMITER_STORE_TIMEOUT: the default 5ms deadline opens the breaker when
  # the load tool starves Redis of CPU on this 2-core machine, and the run
  # would measure degraded decisions instead of Redis-backed ones.
  env LIMITER_ADDR="127.0.0.1:$port" REDIS_ADDRS="127.0.0.1:$RPORT" POLICY_FILE="$ROOT/bench/policy.yaml" \
    LIMITER_EXPECTED_INSTANCES="$n" LIMITER_STORE_TIMEOUT="${BENCH_STORE_TIMEOUT:-100ms}" KAFKA_BROKERS= \
    "$@" "$OUT/bin/limiter" 2>>"$OUT/limiter-$port.log" &
  PIDS+=($!)
  wait_port "$port"
}

start_redis

S="$OUT/section.md"
{
  echo "## Hot keys and scale-out"
  echo
  echo "Written by \`make bench\` (bench/run.sh) on $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),"
  echo "$(redis-server --version | awk '{print $1, $2, $3}'), Go $($GO env GOVERSION). One redis-server, the limiters, wrk and loadgen all"
  echo "share the two cores, as in issue 5's targets. Policy: bench/policy.yaml. Raw outputs: \`$OUT\`."
  echo "Limiters run with LIMITER_STORE_TIMEOUT=${BENCH_STORE_TIMEOUT:-100ms} (see bench/run.sh). Load average at the start"
  echo "(other work on this machine competes for the same two cores): $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
} >"$S"

# ---- 1. the shared tier without HTTP ----
echo "bench: shared tier (go test -bench) vs redis-benchmark -P 16" >&2
$GO test -run XXX -bench SharedTier -benchtime 200000x ./enforcement/redisstore/ 2>/dev/null | grep -E '^Benchmark' >"$OUT/sharedtier.txt" || true
st_store=$(awk '/SharedTier\/store/ {for (i=1;i<=NF;i++) if ($(i+1)=="decisions/s") print $i}' "$OUT/sharedtier.txt")
st_pipe=$(awk '/SharedTier\/pipelined/ {for (i=1;i<=NF;i++) if ($(i+1)=="decisions/s") print $i}' "$OUT/sharedtier.txt")
st_rb=$(awk '/SharedTier\/redis-benchmark/ {for (i=1;i<=NF;i++) if ($(i+1)=="decisions/s") print $i}' "$OUT/sharedtier.txt")
{
  echo "### Shared tier from one process, no HTTP (target: ≥ 70% of redis-benchmark -P 16)"
  echo
  echo '`go test -run XXX -bench SharedTier -benchtime 200000x ./enforcement/redisstore/` — 128 goroutines, 10,000 keys, allowed path;'
  echo 'the redis-benchmark row is `redis-benchmark -P 16 -c 50 -r 10000 EVALSHA <bucket.lua> 2 rb:{__rand_int__}:b2:api … 1000000000 1000000000 1 0 0 0` against the same server.'
  echo
  echo "| shared tier | decisions/s | vs redis-benchmark -P 16 |"
  echo "|---|---:|---:|"
  echo "| redisstore.Store (one EVALSHA round trip each, go-redis pool) | $st_store | $(awk -v a="$st_store" -v b="$st_rb" 'BEGIN{printf "%.0f%%", 100*a/b}') |"
  echo "| redisstore.Pipelined (auto-pipelining) | $st_pipe | $(awk -v a="$st_pipe" -v b="$st_rb" 'BEGIN{printf "%.0f%%", 100*a/b}') |"
  echo "| redis-benchmark -P 16, same script | $st_rb | 100% |"
  echo
} >>"$S"

# ---- 1b. leasing and splitting, measured by their tests ----
echo "bench: lease and split measurements (go test -v)" >&2
{
  echo "### Token leasing and key splitting, measured by their tests against a real redis-server"
  echo
  echo '```'
  echo "\$ go test -count=1 -v -run 'TestRoundTripsPerDecision|TestOverAdmissionBound' ./enforcement/lease/"
  $GO test -count=1 -v -run 'TestRoundTripsPerDecision|TestOverAdmissionBound' ./enforcement/lease/ 2>&1 | grep -E 'lease_test.go|^(--- |ok|FAIL)' | sed 's/^ *//'
  echo "\$ go test -count=1 -v -run 'Lumpiness' ./enforcement/split/"
  $GO test -count=1 -v -run 'Lumpiness' ./enforcement/split/ 2>&1 | grep -E 'split_test.go|^(--- |ok|FAIL)' | sed 's/^ *//'
  echo "\$ go test -run XXX -bench Record -benchmem ./enforcement/hotkeys/   # per-decision cost of the top-K, 10,000 keys churning"
  $GO test -run XXX -bench Record -benchmem ./enforcement/hotkeys/ 2>&1 | grep -E '^Benchmark'
  echo '```'
  echo
} >>"$S"

# ---- 2. HTTP: bare handler, allowed path, flood ----
echo "bench: wrk runs (${WRK_SECONDS}s each)" >&2
BPORT=$(free_port)
"$OUT/bin/barejson" -fixed -addr "127.0.0.1:$BPORT" 2>>"$OUT/barejson.log" &
PIDS+=($!)
BARE_PID=$!
wait_port "$BPORT"
read -r bare_rps bare_p50 bare_p99 < <(wrk_run bare "http://127.0.0.1:$BPORT/check" bench/wrk/uniform.lua)
kill "$BARE_PID"

LPORT=$(free_port)
start_limiter "$LPORT" 1
s0=$(scripts)
read -r allow_rps allow_p50 allow_p99 < <(wrk_run allowed "http://127.0.0.1:$LPORT/check" bench/wrk/uniform.lua)
s1=$(scripts)
read -r flood_rps flood_p50 flood_p99 < <(wrk_run flood "http://127.0.0.1:$LPORT/check" bench/wrk/flood.lua)
s2=$(scripts)
flood_sources=$(curl -s "http://127.0.0.1:$LPORT/metrics" | awk '/^limiter_decisions_total/ {printf "%s %s; ", $1, $2}')
{
  echo "### POST /check under wrk (\`wrk -t2 -c32 -d${WRK_SECONDS}s --latency\`), one limiter process, REDIS_ADDRS=one server"
  echo
  echo "| run | req/s | p50 | p99 | Redis scripts during the run | target |"
  echo "|---|---:|---:|---:|---:|---|"
  echo "| bare net/http handler, fixed JSON (bench/barejson), bench/wrk/uniform.lua | $bare_rps | $bare_p50 | $bare_p99 | – | yardstick |"
  echo "| /check allowed path, 10,000 keys (bench/wrk/uniform.lua) | $allow_rps | $allow_p50 | $allow_p99 | $((s1 - s0)) | ≥ 38,000 req/s |"
  echo "| /check flood on flood_key (rate 10/s), bench/wrk/flood.lua | $flood_rps | $flood_p50 | $flood_p99 | $((s2 - s1)) | ≥ 90% of bare, Redis flat |"
  echo
  echo "Flood vs bare: $(awk -v a="$flood_rps" -v b="$bare_rps" 'BEGIN{printf "%.0f%%", 100*a/b}'); allowed path vs bare: $(awk -v a="$allow_rps" -v b="$bare_rps" 'BEGIN{printf "%.0f%%", 100*a/b}')."
  echo "Redis scripts per flood request: $(awk -v a="$((s2 - s1))" -v b="$flood_rps" -v d="$WRK_SECONDS" 'BEGIN{printf "%.5f", a/(b*d)}')."
  echo "Decision counters after both runs: \`$flood_sources\`"
  echo
} >>"$S"

# ---- 3. distributions through HTTP, one and two limiter processes ----
echo "bench: loadgen distributions (${LG_SECONDS}s each)" >&2
LPORT2=$(free_port)
start_limiter "$LPORT2" 2
{
  echo "### /check per key distribution (bench/loadgen, flat out, 32 connections, ${LG_SECONDS}s)"
  echo
  echo 'Command: `loadgen -url <limiter URLs> -dist D -duration '"${LG_SECONDS}"'s -conns 32 -keys 10000 -redis-stats <redis>`. The Go load tool'
  echo 'shares the two cores with the limiters and Redis and costs more CPU per request than wrk, so these req/s are lower than the wrk row.'
  echo
  echo "| distribution | limiter processes | leasing | req/s | p50 µs | p99 µs | Redis scripts/s | hottest key share |"
  echo "|---|---:|---|---:|---:|---:|---:|---:|"
} >>"$S"
if grep -q LIMITER_LEASE "$OUT/bin/limiter"; then LEASE_WIRED=1; else LEASE_WIRED=0; fi
for dist in uniform zipf hot40; do
  for urls in "http://127.0.0.1:$LPORT/check" "http://127.0.0.1:$LPORT/check,http://127.0.0.1:$LPORT2/check"; do
    n=$(echo "$urls" | tr ',' '\n' | wc -l)
    "$OUT/bin/loadgen" -url "$urls" -dist "$dist" -duration "${LG_SECONDS}s" -conns 32 -keys 10000 \
      -redis-stats "127.0.0.1:$RPORT" -json "$OUT/http-$dist-$n.json" -label "http-$dist-$n" >"$OUT/http-$dist-$n.txt"
    row "$OUT/http-$dist-$n.txt" "| $dist | $n | no | %rps | %p50 | %p99 | %scripts_per_s | %hot_share |" >>"$S"
  done
done
if [ "$LEASE_WIRED" = 1 ]; then
  # The names proposed to the integrator (issue 5 report): LIMITER_LEASE_BLOCK > 0 turns leasing on.
  LPORT3=$(free_port)
  LPORT4=$(free_port)
  start_limiter "$LPORT3" 2 LIMITER_LEASE_BLOCK=100 LIMITER_LEASE_HOT_OPS=100
  start_limiter "$LPORT4" 2 LIMITER_LEASE_BLOCK=100 LIMITER_LEASE_HOT_OPS=100
  for dist in zipf hot40; do
    for urls in "http://127.0.0.1:$LPORT3/check" "http://127.0.0.1:$LPORT3/check,http://127.0.0.1:$LPORT4/check"; do
      n=$(echo "$urls" | tr ',' '\n' | wc -l)
      "$OUT/bin/loadgen" -url "$urls" -dist "$dist" -duration "${LG_SECONDS}s" -conns 32 -keys 10000 -key-prefix lease_ \
        -redis-stats "127.0.0.1:$RPORT" -json "$OUT/http-lease-$dist-$n.json" -label "http-lease-$dist-$n" >"$OUT/http-lease-$dist-$n.txt"
      row "$OUT/http-lease-$dist-$n.txt" "| $dist | $n | yes | %rps | %p50 | %p99 | %scripts_per_s | %hot_share |" >>"$S"
    done
  done
fi
{
  echo
  if [ "$LEASE_WIRED" = 0 ]; then
    echo "With leasing through HTTP: not measured — cmd/limiter has no LIMITER_LEASE_* wiring yet; the in-process rows below measure leasing."
  fi
  echo
} >>"$S"

# ---- 4. in-process: several independent limiter instances, with and without leasing ----
{
  echo "### Several limiter instances on one Redis, with and without token leasing (in-process, no HTTP)"
  echo
  echo 'Command: `loadgen -redis <redis> -instances 4 [-lease -lease-hot 100] -dist D -duration '"${LG_SECONDS}"'s -conns 32 -limit-rate 1000000000 -limit-burst 1000000000`:'
  echo 'four enforcement.Limiter instances in one process, each with its own go-redis pool (and its own leases), the allowed path.'
  echo '"one" sends every decision to a single key (the hot key under its limit): the round trips per decision that leasing saves.'
  echo
  echo "| distribution | leasing | decisions/s | p50 µs | p99 µs | Redis scripts/s | round trips per decision |"
  echo "|---|---|---:|---:|---:|---:|---:|"
} >>"$S"
for dist in uniform zipf hot40 one; do
  for lease in "" "-lease -lease-hot 100"; do
    tag=$([ -n "$lease" ] && echo yes || echo no)
    "$OUT/bin/loadgen" -redis "127.0.0.1:$RPORT" -instances 4 $lease -dist "$dist" -duration "${LG_SECONDS}s" -conns 32 \
      -limit-rate 1000000000 -limit-burst 1000000000 -key-prefix "ip-$dist-$tag-" -json "$OUT/inproc-$dist-$tag.json" >"$OUT/inproc-$dist-$tag.txt"
    row "$OUT/inproc-$dist-$tag.txt" "| $dist | $tag | %rps | %p50 | %p99 | %scripts_per_s | %trips |" >>"$S"
  done
done
echo >>"$S"

# ---- 5. accuracy: 4 limiter processes, one key at 2x its limit ----
echo "bench: accuracy" >&2
ACC_URLS=""
for i in 1 2 3 4; do
  p=$(free_port)
  start_limiter "$p" 4
  ACC_URLS="$ACC_URLS${ACC_URLS:+,}http://127.0.0.1:$p/check"
done
"$OUT/bin/loadgen" -url "$ACC_URLS" -dist one -key-prefix acc_ -rate 2000 -duration "${LG_SECONDS}s" -conns 16 \
  -limit-rate 1000 -limit-burst 1000 -redis-stats "127.0.0.1:$RPORT" -label acc-shared-http >"$OUT/acc-http.txt"
for lease in "" "-lease -lease-hot 100"; do
  tag=$([ -n "$lease" ] && echo lease || echo shared)
  "$OUT/bin/loadgen" -redis "127.0.0.1:$RPORT" -instances 4 $lease -dist one -key-prefix "acc-$tag-" -rate 2000 \
    -duration "${LG_SECONDS}s" -conns 16 -limit-rate 1000 -limit-burst 1000 -label "acc-$tag-inproc" >"$OUT/acc-$tag.txt"
done
{
  echo "### Accuracy: 4 limiters sharing one Redis, one key (rate 1000/s, burst 1000) driven at 2,000/s for ${LG_SECONDS}s"
  echo
  echo 'admitted ÷ (burst + rate × duration); target within 1% in shared mode, within the documented bound with leasing'
  echo '(admitted over any window ≤ burst + rate × window + instances × block, enforcement/lease).'
  echo
  echo '```'
  echo "\$ loadgen -url <4 limiter processes, LIMITER_EXPECTED_INSTANCES=4> -dist one -key-prefix acc_ -rate 2000 -duration ${LG_SECONDS}s -limit-rate 1000 -limit-burst 1000"
  cat "$OUT/acc-http.txt"
  echo "\$ loadgen -redis <redis> -instances 4 -dist one -rate 2000 -duration ${LG_SECONDS}s -limit-rate 1000 -limit-burst 1000"
  cat "$OUT/acc-shared.txt"
  echo "\$ loadgen -redis <redis> -instances 4 -lease -lease-hot 100 -lease-block 100 -dist one -rate 2000 -duration ${LG_SECONDS}s -limit-rate 1000 -limit-burst 1000"
  cat "$OUT/acc-lease.txt"
  echo '```'
  echo
} >>"$S"

# ---- 6. what limits throughput: a CPU profile of the /check stack ----
echo "bench: profile" >&2
PPORT=$(free_port)
"$OUT/bin/profile" -store-timeout "${BENCH_STORE_TIMEOUT:-100ms}" -addr "127.0.0.1:$PPORT" -redis "127.0.0.1:$RPORT" -policy bench/policy.yaml -cpuprofile "$OUT/cpu.pprof" 2>>"$OUT/profile.log" &
PROF_PID=$!
PIDS+=($PROF_PID)
wait_port "$PPORT"
read -r prof_rps _ _ < <(wrk_run profile "http://127.0.0.1:$PPORT/check" bench/wrk/uniform.lua)
kill -TERM "$PROF_PID"
wait "$PROF_PID" 2>/dev/null || true
PPORT2=$(free_port)
"$OUT/bin/profile" -pipeline -store-timeout "${BENCH_STORE_TIMEOUT:-100ms}" -addr "127.0.0.1:$PPORT2" -redis "127.0.0.1:$RPORT" \
  -policy bench/policy.yaml -cpuprofile "$OUT/cpu-pipeline.pprof" 2>>"$OUT/profile.log" &
PROF2_PID=$!
PIDS+=($PROF2_PID)
wait_port "$PPORT2"
p0=$(scripts)
read -r pipe_rps pipe_p50 pipe_p99 < <(wrk_run profile-pipeline "http://127.0.0.1:$PPORT2/check" bench/wrk/uniform.lua)
p1=$(scripts)
kill -TERM "$PROF2_PID"
wait "$PROF2_PID" 2>/dev/null || true
{
  echo "### The allowed path with the auto-pipelined shared tier (bench/profile -pipeline, \`wrk -t2 -c32 -d${WRK_SECONDS}s\` uniform)"
  echo
  echo "| stack | req/s | p50 | p99 | Redis scripts during the run |"
  echo "|---|---:|---:|---:|---:|"
  echo "| /check, redisstore.Store (the plain store: one EVALSHA round trip per decision; profiled, below) | $prof_rps | – | – | – |"
  echo "| /check, redisstore.Pipelined (what cmd/limiter runs) | $pipe_rps | $pipe_p50 | $pipe_p99 | $((p1 - p0)) |"
  echo
} >>"$S"
{
  echo "### What limits throughput: CPU profile of the /check stack (allowed path, wrk uniform, $prof_rps req/s while profiled)"
  echo
  echo "bench/profile serves POST /check with the plain store behind the guard (policy, guard, redisstore.Store, Limiter, httpapi; cmd/limiter runs redisstore.Pipelined, see bench/floor.sh's section for its figures) and writes a CPU profile."
  echo
  echo '```'
  echo "\$ go tool pprof -top -nodecount=25 $OUT/bin/profile $OUT/cpu.pprof"
  $GO tool pprof -top -nodecount=25 "$OUT/bin/profile" "$OUT/cpu.pprof" 2>/dev/null | sed -n '1,35p'
  echo '```'
  echo
} >>"$S"

echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)." >>"$S"
cat bench/notes.md >>"$S"

# ---- splice into BENCHMARKS.md ----
touch "$MD"
awk '
  /^## Hot keys and scale-out/ {skip=1; next}
  skip && /^## / {skip=0}
  !skip {print}' "$MD" >"$OUT/BENCHMARKS.rest"
{ cat "$OUT/BENCHMARKS.rest"; echo; cat "$S"; } | cat -s | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' >"$OUT/BENCHMARKS.new"
cp "$OUT/BENCHMARKS.new" "$MD"
echo "bench: wrote the section to $MD (raw outputs in $OUT)" >&2
