#!/usr/bin/env bash
# make bench: the hot-key and scale-out benchmarks, side by side in one
# run on this machine. Starts its own redis-server and limiter processes on
# free loopback ports, drives them with wrk and bench/loadgen, and writes
# the section "## Hot keys and scale-out" of BENCHMARKS.md (replacing the
# previous one; other sections are left alone).
#
#   WRK_SECONDS (default 20)  duration of each wrk run
#   LG_SECONDS  (default 10)  duration of each loadgen run
#   BENCH_OUT   (default: a temporary directory) where raw outputs go
#   BENCHMARKS_FILE (default: BENCHMARKS.md of this tree) the file to update
set -euo pipefail
cd "$(dirname "$0")/.."
WRK_SECONDS=${WRK_SECONDS:-20}
LG_SECONDS=${LG_SECONDS:-10}
OUT=${BENCH_OUT:-$(mktemp -d /tmp/ratewarden-bench.XXXXXX)}
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
  start_bench_limiter "$OUT/bin/limiter" "$port" "$OUT/limiter-$port.log" LIMITER_EXPECTED_INSTANCES="$n" "$@"
}

start_redis

S="$OUT/section.md"
{
  echo "## Hot keys and scale-out"
  echo
  echo "Written by \`make bench\` (bench/run.sh) on $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),"
  echo "$(redis-server --version | awk '{print $1, $2, $3}'), Go $($GO env GOVERSION); one redis-server, the limiters (LIMITER_STORE_TIMEOUT=${BENCH_STORE_TIMEOUT:-100ms},"
  echo "bench/policy.yaml) and the load tools share the cores. Load average at the start $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
} >"$S"

# ---- 1. the shared tier without HTTP ----
echo "bench: shared tier (go test -bench) vs redis-benchmark -P 16" >&2
$GO test -run XXX -bench SharedTier -benchtime 200000x ./enforcement/redisstore/ 2>/dev/null | grep -E '^Benchmark' >"$OUT/sharedtier.txt" || true
st_store=$(awk '/SharedTier\/store/ {for (i=1;i<=NF;i++) if ($(i+1)=="decisions/s") print $i}' "$OUT/sharedtier.txt")
st_pipe=$(awk '/SharedTier\/pipelined/ {for (i=1;i<=NF;i++) if ($(i+1)=="decisions/s") print $i}' "$OUT/sharedtier.txt")
st_rb=$(awk '/SharedTier\/redis-benchmark/ {for (i=1;i<=NF;i++) if ($(i+1)=="decisions/s") print $i}' "$OUT/sharedtier.txt")
{
  echo '**Shared tier from one process, no HTTP** (`go test -run XXX -bench SharedTier -benchtime 200000x ./enforcement/redisstore/`, 128'
  echo 'goroutines, 10,000 keys, allowed path; target ≥ 70% of `redis-benchmark -P 16 -c 50 -r 10000 EVALSHA <bucket.lua> 2 rb:{__rand_int__}:b2:api … 1000000000 1000000000 1 0 0 0 0`'
  echo "against the same server): redisstore.Store (one EVALSHA round trip each, go-redis pool) $st_store decisions/s, $(awk -v a="$st_store" -v b="$st_rb" 'BEGIN{printf "%.0f%%", 100*a/b}');"
  echo "redisstore.Pipelined (auto-pipelining) $st_pipe, $(awk -v a="$st_pipe" -v b="$st_rb" 'BEGIN{printf "%.0f%%", 100*a/b}'); redis-benchmark -P 16, same script, $st_rb, 100%."
  echo
} >>"$S"

# ---- 1b. leasing and splitting, measured by their tests ----
echo "bench: lease and split measurements (go test -v)" >&2
$GO test -count=1 -v -run 'TestRoundTripsPerDecision|TestOverAdmissionBound' ./enforcement/lease/ >"$OUT/lease.txt" 2>&1 || true
$GO test -count=1 -v -run 'Lumpiness' ./enforcement/split/ >"$OUT/split.txt" 2>&1 || true
$GO test -run XXX -bench Record -benchmem ./enforcement/hotkeys/ >"$OUT/hotkeys.txt" 2>&1 || true
{
  echo "**Token leasing and key splitting, measured by their tests against a real redis-server.** Leasing (\`go test -count=1 -v -run"
  echo "'TestRoundTripsPerDecision|TestOverAdmissionBound' ./enforcement/lease/\`): $(grep 'lease_test.go' "$OUT/lease.txt" | grep -v 'lease stats' | sed 's/^ *lease_test.go:[0-9]*: //' | paste -sd';' | sed 's/;/; /g')."
  echo "Splitting (\`go test -count=1 -v -run 'Lumpiness' ./enforcement/split/\`, a key's bucket over N sub-buckets):"
  echo
  echo "| split N | burst of 200: first rejection after | admitted | steady at 90% of the limit: rejected early | the same through the Limiter (by the local tier) |"
  echo "|---:|---:|---:|---:|---:|"
  sed -n 's/^ *split_test.go:[0-9]*: //p' "$OUT/split.txt" | awk '
    { n = $2; sub(/:$/, "", n); if (!(n in seen)) { seen[n] = 1; order[++k] = n } }
    $3 == "first" { f[n] = $6 " of " $8; a[n] = $12 " of " $14 }
    $7 == "limit:" { e[n] = $8 }
    $7 == "limit," { t[n] = $11; l = $13; sub(/^\(/, "", l); t[n] = t[n] " (" l ")" }
    END { for (i = 1; i <= k; i++) { n = order[i]
      printf "| %s | %s | %s | %s | %s |\n", n, (n in f) ? f[n] : "–", (n in a) ? a[n] : "–", (n in e) ? e[n] : "–", (n in t) ? t[n] : "–" } }'
  echo
  grep -h -E '^(--- FAIL|FAIL)' "$OUT/lease.txt" "$OUT/split.txt" "$OUT/hotkeys.txt" | sed 's/^/**Failed:** /' || true
  echo "Hot-key top-K per decision, 10,000 keys churning (\`go test -run XXX -bench Record -benchmem ./enforcement/hotkeys/\`): $(awk '/^BenchmarkRecord/ {print $3, $4 ", " $5, $6 ", " $7, $8; exit}' "$OUT/hotkeys.txt")."
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
  echo "**POST /check under wrk** (\`wrk -t2 -c32 -d${WRK_SECONDS}s --latency\`, one limiter process, REDIS_ADDRS=one server; req/s (p50, p99; Redis scripts"
  echo "during the run; target)): bare net/http handler, fixed JSON (bench/barejson), bench/wrk/uniform.lua $bare_rps ($bare_p50, $bare_p99; yardstick);"
  echo "/check allowed path, 10,000 keys (bench/wrk/uniform.lua) $allow_rps ($allow_p50, $allow_p99; $((s1 - s0)); ≥ 38,000 req/s);"
  echo "/check flood on flood_key (rate 10/s), bench/wrk/flood.lua $flood_rps ($flood_p50, $flood_p99; $((s2 - s1)); ≥ 90% of bare, Redis flat)."
  echo "Flood vs bare: $(awk -v a="$flood_rps" -v b="$bare_rps" 'BEGIN{printf "%.0f%%", 100*a/b}'); allowed path vs bare: $(awk -v a="$allow_rps" -v b="$bare_rps" 'BEGIN{printf "%.0f%%", 100*a/b}'). Redis scripts per flood request: $(awk -v a="$((s2 - s1))" -v b="$flood_rps" -v d="$WRK_SECONDS" 'BEGIN{printf "%.5f", a/(b*d)}')."
  echo "Decision counters after both runs: \`$flood_sources\`"
  echo
} >>"$S"

# ---- 3. distributions through HTTP, one and two limiter processes ----
echo "bench: loadgen distributions (${LG_SECONDS}s each)" >&2
LPORT2=$(free_port)
start_limiter "$LPORT2" 2
{
  echo "**/check per key distribution** (bench/loadgen, flat out, 32 connections, ${LG_SECONDS}s):"
  echo '`loadgen -url <limiter URLs> -dist D -duration '"${LG_SECONDS}"'s -conns 32 -keys 10000 -redis-stats <redis>` (leasing: LIMITER_LEASE_BLOCK=100);'
  echo 'the Go load tool costs more CPU per request than wrk, so these req/s are lower than the wrk row.'
  echo
  echo "| distribution | leasing | 1 limiter: req/s | p50 µs | p99 µs | Redis scripts/s | 2 limiters: req/s | p50 µs | p99 µs | Redis scripts/s | hottest key share (1 / 2) |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
} >>"$S"
if grep -q LIMITER_LEASE "$OUT/bin/limiter"; then LEASE_WIRED=1; else LEASE_WIRED=0; fi
# http_row DIST LEASING NAME URL1 URL2 [LOADGEN FLAG...]: one table row,
# loadgen against one limiter (URL1) and against two (URL1,URL2) side by
# side; raw outputs in $OUT/NAME-DIST-{1,2}.*
http_row() {
  local dist=$1 leasing=$2 name=$3 one=$4 two=$5
  shift 5
  local -A part hot
  local n urls f
  for n in 1 2; do
    urls=$one
    [ "$n" = 2 ] && urls="$one,$two"
    f="$OUT/$name-$dist-$n"
    "$OUT/bin/loadgen" -url "$urls" -dist "$dist" -duration "${LG_SECONDS}s" -conns 32 -keys 10000 "$@" \
      -redis-stats "127.0.0.1:$RPORT" -json "$f.json" -label "$name-$dist-$n" >"$f.txt"
    part[$n]=$(row "$f.txt" "%rps | %p50 | %p99 | %scripts_per_s")
    hot[$n]=$(row "$f.txt" "%hot_share")
  done
  echo "| $dist | $leasing | ${part[1]} | ${part[2]} | ${hot[1]} / ${hot[2]} |" >>"$S"
}
for dist in uniform zipf hot40; do
  http_row "$dist" no http "http://127.0.0.1:$LPORT/check" "http://127.0.0.1:$LPORT2/check"
done
if [ "$LEASE_WIRED" = 1 ]; then
  # LIMITER_LEASE_BLOCK > 0 turns leasing on.
  LPORT3=$(free_port)
  LPORT4=$(free_port)
  start_limiter "$LPORT3" 2 LIMITER_LEASE_BLOCK=100 LIMITER_LEASE_HOT_OPS=100
  start_limiter "$LPORT4" 2 LIMITER_LEASE_BLOCK=100 LIMITER_LEASE_HOT_OPS=100
  for dist in zipf hot40; do
    http_row "$dist" yes http-lease "http://127.0.0.1:$LPORT3/check" "http://127.0.0.1:$LPORT4/check" -key-prefix lease_
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
  echo "**Several limiter instances on one Redis, with and without token leasing** (in-process, no HTTP):"
  echo '`loadgen -redis <redis> -instances 4 [-lease -lease-hot 100] -dist D -duration '"${LG_SECONDS}"'s -conns 32 -limit-rate 1000000000 -limit-burst 1000000000`:'
  echo 'four enforcement.Limiter instances in one process, each with its own go-redis pool and leases; "one" is a single hot key under its limit.'
  echo
  echo "| distribution | decisions/s | p50 µs | p99 µs | Redis scripts/s | round trips per decision | with leasing: decisions/s | p50 µs | p99 µs | Redis scripts/s | round trips per decision |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
} >>"$S"
declare -A part # one table row per distribution: without and with leasing
for dist in uniform zipf hot40 one; do
  for lease in "" "-lease -lease-hot 100"; do
    tag=$([ -n "$lease" ] && echo yes || echo no)
    "$OUT/bin/loadgen" -redis "127.0.0.1:$RPORT" -instances 4 $lease -dist "$dist" -duration "${LG_SECONDS}s" -conns 32 \
      -limit-rate 1000000000 -limit-burst 1000000000 -key-prefix "ip-$dist-$tag-" -json "$OUT/inproc-$dist-$tag.json" >"$OUT/inproc-$dist-$tag.txt"
    part[$tag]=$(row "$OUT/inproc-$dist-$tag.txt" "%rps | %p50 | %p99 | %scripts_per_s | %trips")
  done
  echo "| $dist | ${part[no]} | ${part[yes]} |" >>"$S"
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
  echo "**Accuracy: 4 limiters sharing one Redis, one key (rate 1000/s, burst 1000) driven at 2,000/s for ${LG_SECONDS}s.**"
  echo 'ratio = admitted ÷ cap (burst + rate × duration); target within 1% shared, within the bound of the reading below with leasing.'
  echo "HTTP: \`loadgen -url <4 limiter processes, LIMITER_EXPECTED_INSTANCES=4> -dist one -key-prefix acc_ -rate 2000 -duration ${LG_SECONDS}s -limit-rate 1000 -limit-burst 1000\`;"
  echo "in process: \`loadgen -redis <redis> -instances 4 [-lease -lease-hot 100 -lease-block 100] -dist one -rate 2000 -duration ${LG_SECONDS}s -limit-rate 1000 -limit-burst 1000\`."
  echo
  echo "| run | sent | admitted | cap | ratio | p50 µs | p99 µs | round trips per decision |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  for run in "acc-http.txt|4 limiter processes over HTTP" "acc-shared.txt|4 instances in process" "acc-lease.txt|4 instances in process, leasing"; do
    awk -v d="${run#*|}" '
      /^  summary / { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
      /^  key / && !k { k = 1; sent = $4; adm = $6; cap = $8; r = $10 }
      END { printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", d, sent, adm, cap, r, v["p50"], v["p99"], v["trips"] }' "$OUT/${run%%|*}"
  done
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
  $GO tool pprof -top -nodecount=25 "$OUT/bin/profile" "$OUT/cpu.pprof" 2>/dev/null >"$OUT/cpu.top" || true
  echo "**The allowed path through bench/profile** (policy, guard, store, Limiter, httpapi; \`wrk -t2 -c32 -d${WRK_SECONDS}s\` uniform): over"
  echo "redisstore.Pipelined (what cmd/limiter runs) $pipe_rps req/s, p50 $pipe_p50, p99 $pipe_p99, $((p1 - p0)) Redis scripts; over the plain"
  echo "redisstore.Store (one EVALSHA round trip per decision) $prof_rps req/s, CPU-profiled ($(grep -m1 '^Duration' "$OUT/cpu.top")): system"
  echo "calls (\`Syscall6\`) $(awk '/syscall\/linux.Syscall6$/ {print $2; exit}' "$OUT/cpu.top") of the samples (\`go tool pprof -top $OUT/bin/profile $OUT/cpu.pprof\`)."
  echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
} >>"$S"
cat bench/notes.md >>"$S"

splice_section "## Hot keys and scale-out" "$S" last
