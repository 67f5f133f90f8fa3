#!/usr/bin/env bash
# The limiter against the HTTP floor, in one run on this machine:
# throughput of POST /check (the allowed path over 10,000 keys, a flood on
# one key) next to the floor — net/http decoding and encoding the /check
# JSON and doing no other work (bench/barejson) — under the same wrk load,
# interleaved (floor, allowed, flood, then again, PASSES times) so the
# machine's noise shows, with each ratio's median over the passes; the local tier's rejection (go test -bench); and
# latency at a fixed rate (open model), interleaved floor, limiter, floor,
# limiter: client-side p50/p99/p99.9 for both and the limiter's own decision
# latency from its histogram, beside its own yardstick measured in the same
# pass (loadgen -redis: one decision straight on Redis, no HTTP, guard or
# pipeline). Prints one table of ratios and writes the section "## /check against the HTTP floor" of BENCHMARKS.md (replacing the
# previous one; other sections are left alone). Starts its own redis-server,
# limiter and floor processes on free loopback ports.
#
#   WRK_SECONDS (default 10)   each wrk run
#   PASSES      (default 4)    interleaved throughput passes (floor, allowed, flood, GOGC=400)
#   LAT_SECONDS (default 20)   each fixed-rate run
#   LAT_RATE    (default 5000) requests per second of the fixed-rate runs
#   BENCH_OUT   (default: a temporary directory) raw outputs
#   BENCHMARKS_FILE (default: BENCHMARKS.md of this tree)
set -euo pipefail
cd "$(dirname "$0")/.."
WRK_SECONDS=${WRK_SECONDS:-10}
PASSES=${PASSES:-4}
LAT_SECONDS=${LAT_SECONDS:-20}
LAT_RATE=${LAT_RATE:-5000}
OUT=${BENCH_OUT:-$(mktemp -d /tmp/ratewarden-floor.XXXXXX)}
source bench/lib.sh
require_tools redis-server redis-cli wrk curl
echo "bench: building into $OUT/bin" >&2
$GO build -o "$OUT/bin/" ./cmd/limiter
$GO build -C bench -o "$(realpath -m "$OUT")/bin/" ./loadgen ./barejson # the tools' own module (bench/go.mod)

start_redis
start_floor "$OUT/bin/barejson"
LPORT=$(free_port)
start_bench_limiter "$OUT/bin/limiter" "$LPORT" "$OUT/limiter.log"
LPID=$BLPID
# The same limiter with GOGC=400 (docs/scaling.md, "Capacity planning":
# an operator's tuning, reported on its own row, never as the default).
GPORT=$(free_port)
start_bench_limiter "$OUT/bin/limiter" "$GPORT" "$OUT/limiter-gogc.log" GOGC=400 REDIS_KEY_PREFIX=gogc
GPID=$BLPID

START_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
START_TIME=$(date -u +%Y-%m-%dT%H:%MZ)

# ---- throughput: floor, allowed, flood; twice ----
wrk_run() { # name port script pid -> "rps p50 p99 load server-µs redis-µs"
  local name=$1 port=$2 script=$3 pid=$4 l t0 t1 r0 r1 rps
  l=$(load)
  t0=$(ticks "$pid")
  r0=$(ticks "$RPID")
  wrk -t2 -c32 -d"${WRK_SECONDS}s" --latency -s "bench/wrk/$script.lua" "http://127.0.0.1:$port/check" >"$OUT/$name.wrk" 2>&1
  t1=$(ticks "$pid")
  r1=$(ticks "$RPID")
  rps=$(awk '/^Requests\/sec/ {print $2}' "$OUT/$name.wrk")
  local n
  n=$(awk -v r="$rps" -v s="$WRK_SECONDS" 'BEGIN {printf "%.0f", r * s}')
  echo "$rps $(awk '$1 == "50%" {print $2}' "$OUT/$name.wrk") $(awk '$1 == "99%" {print $2}' "$OUT/$name.wrk") $l $(us_per "$t0" "$t1" "$n") $(us_per "$r0" "$r1" "$n")"
}
declare -A T
for pass in $(seq 1 "$PASSES"); do
  echo "bench: pass $pass of $PASSES: floor, allowed, flood, allowed with GOGC=400 (wrk ${WRK_SECONDS}s each)" >&2
  T[floor$pass]=$(wrk_run "floor$pass" "$FPORT" uniform "$FPID")
  T[allowed$pass]=$(wrk_run "allowed$pass" "$LPORT" uniform "$LPID")
  T[flood$pass]=$(wrk_run "flood$pass" "$LPORT" flood "$LPID")
  T[gogc$pass]=$(wrk_run "allowed-gogc400-$pass" "$GPORT" uniform "$GPID")
done
field() { echo "${T[$1]}" | awk -v i="$2" '{print $i}'; }
decisions=$(curl -s "http://127.0.0.1:$LPORT/metrics" | awk '/^limiter_decisions_total/ {printf "%s %s; ", $1, $2}')

# ---- latency at a fixed rate: floor, limiter; twice ----
hist() { # the limiter's decision-latency histogram: "le count" lines
  curl -s "http://127.0.0.1:$LPORT/metrics" | awk -F'[{}" ]+' '/^limiter_decision_duration_seconds_bucket/ {print $3, $NF}'
}
lat_run() { # name url -> "p50 p99 p999 dropped errors load"
  local l
  l=$(load)
  "$OUT/bin/loadgen" -url "$2" -rate "$LAT_RATE" -from-schedule -duration "${LAT_SECONDS}s" -conns 32 -keys 10000 \
    -dist uniform -label "$1" -json "$OUT/$1.json" >"$OUT/$1.txt"
  awk -v l="$l" '/^  summary / {
    for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    print v["p50"], v["p99"], v["p999"], v["dropped"], v["errors"], l }' "$OUT/$1.txt"
}
store_run() { # -> "p50 p99 p999 dropped errors load": loadgen in process, the decision straight on Redis
  local l
  l=$(load)
  "$OUT/bin/loadgen" -redis "127.0.0.1:$RPORT" -rate "$LAT_RATE" -duration "${LAT_SECONDS}s" -conns 32 -keys 10000 \
    -dist uniform -limit-rate 1000000 -limit-burst 1000000 -label "store$pass" >"$OUT/store$pass.txt"
  awk -v l="$l" '/^  summary / {
    for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    print v["p50"], v["p99"], v["p999"], v["dropped"], v["errors"], l }' "$OUT/store$pass.txt"
}
declare -A L
for pass in 1 2; do
  echo "bench: pass $pass: latency at $LAT_RATE req/s (${LAT_SECONDS}s each): one decision straight on Redis, floor, limiter" >&2
  L[decide$pass]=$(store_run)
  L[floor$pass]=$(lat_run "lat-floor$pass" "http://127.0.0.1:$FPORT/check")
  hist >"$OUT/hist-before$pass"
  L[limiter$pass]=$(lat_run "lat-limiter$pass" "http://127.0.0.1:$LPORT/check")
  hist >"$OUT/hist-after$pass"
  L[own$pass]=$(quantiles "$OUT/hist-before$pass" "$OUT/hist-after$pass")
done
lfield() { echo "${L[$1]}" | awk -v i="$2" '{print $i}'; }

# ---- the local tier's rejection ----
echo "bench: go test -bench LocalReject" >&2
rej_load=$(load)
$GO test -run '^$' -bench 'LocalReject$' -benchmem -benchtime 1s -count 5 ./enforcement/ 2>&1 | grep -E '^BenchmarkLocalReject' >"$OUT/reject.txt" || true
rej_min=$(awk '{print $3}' "$OUT/reject.txt" | sort -n | head -1)
rej_med=$(awk '{print $3}' "$OUT/reject.txt" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
rej_allocs=$(awk '{print $(NF-1)}' "$OUT/reject.txt" | sort -n | tail -1)
# cpu-ns/op: the benchmark thread's own CPU time per rejection (steadier when other work shares the cores)
rej_cpu_min=$(awk '{for (i = 1; i < NF; i++) if ($(i+1) == "cpu-ns/op") print $i}' "$OUT/reject.txt" | sort -n | head -1)
END_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- the section ----
ratios() { # run -> each pass's req/s ÷ the floor's of that pass, one per line
  for pass in $(seq 1 "$PASSES"); do ratio "$(field "$1$pass" 1)" "$(field "floor$pass" 1)"; echo; done
}
cmp_row() { # description run target -> a comparison row: median, each pass
  local each
  each=$(ratios "$2" | paste -sd' ' | sed 's/ /, /g')
  echo "| $1 | **$(ratios "$2" | median)** | $each | $3 |"
}
lat_cmp() { # description values-per-pass... -> median over the latency passes, each pass
  local d=$1
  shift
  echo "| $d | **$(printf '%s\n' "$@" | median | awk '{printf "%.0f", $1}') µs** | $(printf '%s µs, ' "$@" | sed 's/, $//') | ${TARGET:-≤ 1 ms} |"
}
S="$OUT/section.md"
{
  echo "## /check against the HTTP floor"
  echo
  echo "Written by \`bench/floor.sh\` (\`make bench-floor\`) on $START_TIME, $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),"
  echo "$(redis-server --version | awk '{print $1, $2, $3}'), Go $($GO env GOVERSION), the limiter with LIMITER_STORE_TIMEOUT=${BENCH_STORE_TIMEOUT:-100ms}."
  echo "Load average at the start $START_LOAD, at the end $END_LOAD. Each ratio is a pass's run"
  echo "over the floor's run just before it; the median is over the $PASSES interleaved passes (see Method)."
  echo
  echo "| comparison | median | each pass | target |"
  echo "|---|---:|---|---|"
  cmp_row "allowed path ÷ floor, req/s (wrk -t2 -c32, 10,000 keys)" allowed "≥ 0.55"
  cmp_row "flood on one key ÷ floor, req/s" flood "≥ 0.95"
  cmp_row "allowed path ÷ floor, limiter run with GOGC=400 (a tuning, docs/scaling.md)" gogc "–"
  lat_cmp "client p99 at $LAT_RATE req/s: limiter − floor" $(for pass in 1 2; do awk -v a="$(lfield limiter$pass 2)" -v b="$(lfield floor$pass 2)" 'BEGIN {printf "%d\n", a - b}'; done)
  lat_cmp "limiter's own decision p99 at $LAT_RATE req/s (its histogram)" $(for pass in 1 2; do echo "${L[own$pass]}" | awk '{print $2}'; done)
  TARGET="–" lat_cmp "… beside one decision straight on Redis, p99 (loadgen -redis, same pass)" $(lfield decide1 2) $(lfield decide2 2)
  echo "| local-tier rejection (\`BenchmarkLocalReject\`, 5 × 1 s): min / median ns, min CPU ns, allocs | **$rej_min ns**, $rej_allocs allocs | median $rej_med ns, min ${rej_cpu_min:-?} CPU ns (load $rej_load) | ≤ 100 ns, 0 allocs |"
  echo
  echo "### Throughput (\`wrk -t2 -c32 -d${WRK_SECONDS}s --latency\`), floor, allowed, flood, GOGC=400; $PASSES passes"
  echo
  echo "| pass | run | req/s | ÷ floor | p50 | p99 | server CPU µs/req | Redis CPU µs/req | load |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
  for pass in $(seq 1 "$PASSES"); do
    for run in floor allowed flood gogc; do
      f="${T[$run$pass]}"
      desc=$run
      case $run in
        floor) desc="floor (bench/barejson), bench/wrk/uniform.lua" ;;
        allowed) desc="/check allowed path, bench/wrk/uniform.lua" ;;
        flood) desc="/check flood on flood_key (10/s), bench/wrk/flood.lua" ;;
        gogc) desc="/check allowed path, limiter with GOGC=400, bench/wrk/uniform.lua" ;;
      esac
      echo "| $pass | $desc | $(echo "$f" | awk '{print $1}') | $(ratio "$(echo "$f" | awk '{print $1}')" "$(field floor$pass 1)") | $(echo "$f" | awk '{print $2}') | $(echo "$f" | awk '{print $3}') | $(echo "$f" | awk '{print $5}') | $([ "$run" = floor ] && echo – || echo "$f" | awk '{print $6}') | $(echo "$f" | awk '{print $4}') |"
    done
  done
  echo
  echo "Decision counters after the throughput runs: \`$decisions\`"
  echo
  echo "### Latency at a fixed $LAT_RATE req/s (open model), floor, limiter, floor, limiter"
  echo
  echo "Client: \`loadgen -url <server>/check -rate $LAT_RATE -from-schedule -duration ${LAT_SECONDS}s -conns 32 -keys 10000 -dist uniform\`."
  echo "Own: the limiter's \`limiter_decision_duration_seconds\` over the same run. Straight on Redis: \`loadgen -redis <redis> -rate $LAT_RATE"
  echo "-conns 32 -keys 10000 -limit-rate 1000000 -limit-burst 1000000\` (one EVALSHA per decision; no HTTP, guard or pipeline)."
  echo
  echo "| pass | server | client p50 µs | client p99 µs | client p99.9 µs | own p50 µs | own p99 µs | own p99.9 µs | dropped / errors | load |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for pass in 1 2; do
    f="${L[decide$pass]}"
    echo "| $pass | one decision straight on Redis (loadgen -redis) | – | – | – | $(echo "$f" | awk '{print $1 " | " $2 " | " $3 " | " $4 " / " $5 " | " $6}') |"
    f="${L[floor$pass]}"
    echo "| $pass | floor | $(echo "$f" | awk '{print $1 " | " $2 " | " $3}') | – | – | – | $(echo "$f" | awk '{print $4 " / " $5 " | " $6}') |"
    f="${L[limiter$pass]}"
    echo "| $pass | limiter | $(echo "$f" | awk '{print $1 " | " $2 " | " $3}') | $(echo "${L[own$pass]}" | awk '{print $1 " | " $2 " | " $3}') | $(echo "$f" | awk '{print $4 " / " $5 " | " $6}') |"
  done
  echo
  echo "Local tier, \`go test -run '^\$' -bench 'LocalReject\$' -benchmem -benchtime 1s -count 5 ./enforcement/\`: ns/op"
  echo "$(awk '{print $3}' "$OUT/reject.txt" | paste -sd' ' | sed 's/ /, /g'); cpu-ns/op $(awk '{for (i = 1; i < NF; i++) if ($(i+1) == "cpu-ns/op") print $i}' "$OUT/reject.txt" | paste -sd' ' | sed 's/ /, /g'); allocs/op $(awk '{print $(NF-1)}' "$OUT/reject.txt" | paste -sd' ' | sed 's/ /, /g')."
  echo
  cat bench/floor-notes.md
} >"$S"
cat "$S"

splice_section "## /check against the HTTP floor" "$S" first
