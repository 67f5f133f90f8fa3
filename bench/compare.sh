#!/usr/bin/env bash
# The /check table of bench/floor.sh for two builds of the limiter, run
# interleaved on this machine so that other work on it weighs on both
# alike: `make bench-compare BASE=<rev> HEAD=<rev>` (HEAD defaults to the
# commit checked out; "." builds the working tree as it is). Each pass runs,
# for the allowed path, the flood on one key and the allowed path with
# GOGC=400: the floor (bench/barejson), then the two limiters, the one run
# first alternating from pass to pass; each req/s is divided by the floor's
# run just before it. Then latency at a fixed rate, per pass: one decision
# straight on Redis, the floor, the two limiters (alternating first). Then
# the local tier's rejection benchmark of each, alternating. The load tools
# (wrk, bench/loadgen, bench/barejson) are this tree's; each limiter reads
# its own revision's bench/policy.yaml. Writes the section "## /check against
# the HTTP floor" of BENCHMARKS.md, as bench/floor.sh does.
#
#   BASE, HEAD                 the two revisions (arguments 1 and 2 also work)
#   WRK_SECONDS (default 10)   each wrk run
#   PASSES      (default 4)    interleaved throughput passes
#   LAT_PASSES  (default 4)    interleaved latency passes
#   LAT_SECONDS (default 20)   each fixed-rate run
#   LAT_RATE    (default 5000) requests per second of the fixed-rate runs
#   BENCH_OUT   (default: a temporary directory) raw outputs
#   BENCHMARKS_FILE (default: BENCHMARKS.md of this tree; "-" prints only)
set -euo pipefail
cd "$(dirname "$0")/.."
export GOFLAGS=${GOFLAGS:--tags=vtprotobuf}
BASE=${BASE:-${1:-}}
HEAD=${HEAD:-${2:-HEAD}}
[ -n "$BASE" ] || { echo "usage: make bench-compare BASE=<rev> [HEAD=<rev>]" >&2; exit 2; }
WRK_SECONDS=${WRK_SECONDS:-10}
PASSES=${PASSES:-4}
LAT_PASSES=${LAT_PASSES:-4}
LAT_SECONDS=${LAT_SECONDS:-20}
LAT_RATE=${LAT_RATE:-5000}
OUT=${BENCH_OUT:-$(mktemp -d /tmp/ratewarden-compare.XXXXXX)}
OUT=$(realpath -m "$OUT")
source bench/lib.sh
require_tools redis-server redis-cli wrk curl
$GO build -C bench -o "$OUT/bin/" ./loadgen ./barejson # the tools' own module (bench/go.mod)

# build NAME REV: the limiter and the enforcement package's test binary of
# REV into $OUT/bin/NAME-*; sets the revision's short name in NAMEREV.
build() {
  local name=$1 rev=$2 src
  if [ "$rev" = . ]; then
    src=$ROOT
    printf -v "${name}REV" '%s' "$(git rev-parse --short HEAD)+worktree"
  else
    src="$OUT/src-$name"
    mkdir -p "$src"
    git archive "$rev" | tar -x -C "$src"
    printf -v "${name}REV" '%s' "$(git rev-parse --short "$rev")"
  fi
  printf -v "${name}SRC" '%s' "$src"
  echo "bench: building $rev into $OUT/bin/$name-*" >&2
  (cd "$src" && $GO build -o "$OUT/bin/$name-limiter" ./cmd/limiter && $GO test -c -o "$OUT/bin/$name-enforcement.test" ./enforcement/)
}
build A "$BASE"
build B "$HEAD"

start_redis
start_floor "$OUT/bin/barejson"
declare -A PORT PID
# Each limiter reads its own revision's bench/policy.yaml: the tiers the
# load uses are the same in both, and a newer policy may hold tiers an
# older limiter cannot parse.
for v in A B; do
  src="${v}SRC"
  start_named_limiter "$v" "$OUT/bin/$v-limiter" POLICY_FILE="${!src}/bench/policy.yaml"
  start_named_limiter "${v}gogc" "$OUT/bin/$v-limiter" POLICY_FILE="${!src}/bench/policy.yaml" GOGC=400
done
START_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
START_TIME=$(date -u +%Y-%m-%dT%H:%MZ)

# ---- throughput ----
wrk_run() { # label port script pid -> "rps p50 p99 server-µs load"
  local l t0 t1 rps n
  l=$(load)
  t0=$(ticks "$4")
  wrk -t2 -c32 -d"${WRK_SECONDS}s" --latency -s "bench/wrk/$3.lua" "http://127.0.0.1:$2/check" >"$OUT/$1.wrk" 2>&1
  t1=$(ticks "$4")
  rps=$(awk '/^Requests\/sec/ {print $2}' "$OUT/$1.wrk")
  n=$(awk -v r="$rps" -v s="$WRK_SECONDS" 'BEGIN {printf "%.0f", r * s}')
  echo "$rps $(awk '$1 == "50%" {print $2}' "$OUT/$1.wrk") $(awk '$1 == "99%" {print $2}' "$OUT/$1.wrk") $(us_per "$t0" "$t1" "$n") $l"
}
order() { # pass -> "A B" or "B A", alternating
  if [ $(($1 % 2)) = 1 ]; then echo A B; else echo B A; fi
}
declare -A T
KINDS="allowed flood gogc"
for pass in $(seq 1 "$PASSES"); do
  echo "bench: throughput pass $pass of $PASSES (wrk ${WRK_SECONDS}s each): floor, then $(order "$pass") for $KINDS" >&2
  for kind in $KINDS; do
    script=uniform
    [ "$kind" = flood ] && script=flood
    T[floor$kind$pass]=$(wrk_run "floor-$kind$pass" "$FPORT" uniform "$FPID")
    for v in $(order "$pass"); do
      name=$v
      [ "$kind" = gogc ] && name=${v}gogc
      T[$v$kind$pass]=$(wrk_run "$v-$kind$pass" "${PORT[$name]}" "$script" "${PID[$name]}")
    done
  done
done
field() { echo "${T[$1]}" | awk -v i="$2" '{print $i}'; }

# ---- latency at a fixed rate ----
hist() { # name -> the limiter's decision-latency histogram: "le count" lines
  curl -s "http://127.0.0.1:${PORT[$1]}/metrics" | awk -F'[{}" ]+' '/^limiter_decision_duration_seconds_bucket/ {print $3, $NF}'
}
summary() { # loadgen output -> "p50 p99 p999 dropped errors"
  awk '/^  summary / {
    for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    print v["p50"], v["p99"], v["p999"], v["dropped"], v["errors"] }' "$1"
}
lat_run() { # label url -> "p50 p99 p999 dropped errors load"
  local l
  l=$(load)
  "$OUT/bin/loadgen" -url "$2" -rate "$LAT_RATE" -from-schedule -duration "${LAT_SECONDS}s" -conns 32 -keys 10000 \
    -dist uniform -label "$1" >"$OUT/$1.txt"
  echo "$(summary "$OUT/$1.txt") $l"
}
declare -A L
for pass in $(seq 1 "$LAT_PASSES"); do
  echo "bench: latency pass $pass of $LAT_PASSES at $LAT_RATE req/s (${LAT_SECONDS}s each): straight on Redis, floor, $(order "$pass")" >&2
  l=$(load)
  "$OUT/bin/loadgen" -redis "127.0.0.1:$RPORT" -rate "$LAT_RATE" -duration "${LAT_SECONDS}s" -conns 32 -keys 10000 \
    -dist uniform -limit-rate 1000000 -limit-burst 1000000 -label "store$pass" >"$OUT/store$pass.txt"
  L[store$pass]="$(summary "$OUT/store$pass.txt") $l"
  L[floor$pass]=$(lat_run "lat-floor$pass" "http://127.0.0.1:$FPORT/check")
  for v in $(order "$pass"); do
    hist "$v" >"$OUT/hist-$v-before$pass"
    L[$v$pass]=$(lat_run "lat-$v$pass" "http://127.0.0.1:${PORT[$v]}/check")
    hist "$v" >"$OUT/hist-$v-after$pass"
    L[own$v$pass]=$(quantiles "$OUT/hist-$v-before$pass" "$OUT/hist-$v-after$pass")
  done
done
lfield() { echo "${L[$1]}" | awk -v i="$2" '{print $i}'; }

# ---- the local tier's rejection, 5 runs of each, alternating ----
echo "bench: BenchmarkLocalReject, 5 × 1 s of each, alternating" >&2
REJ_LOAD=$(load)
for i in 1 2 3 4 5; do
  for v in $(order "$i"); do
    (cd "$ROOT/enforcement" && "$OUT/bin/$v-enforcement.test" -test.run '^$' -test.bench 'LocalReject$' -test.benchmem \
      -test.benchtime 1s) 2>&1 | grep -E '^BenchmarkLocalReject' >>"$OUT/reject-$v.txt" || true
  done
done
END_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
cpu_ns() { awk '{for (i = 1; i < NF; i++) if ($(i+1) == "cpu-ns/op") print $i}' "$1"; }
rej() { # version -> "min-ns median-ns min-cpu-ns max-allocs"
  local f="$OUT/reject-$1.txt"
  echo "$(awk '{print $3}' "$f" | sort -g | head -1) $(awk '{print $3}' "$f" | median) $(cpu_ns "$f" | sort -g | head -1) $(awk '{print $(NF-1)}' "$f" | sort -g | tail -1)"
}

# ---- the section ----
ratios() { # version kind -> each pass's req/s ÷ the floor's run before it, one per line
  for pass in $(seq 1 "$PASSES"); do ratio "$(field "$1$2$pass" 1)" "$(field "floor$2$pass" 1)"; echo; done
}
list() { paste -sd' ' | sed 's/ /, /g'; }
tput_row() { # description kind target
  echo "| $1 | **$(ratios A "$2" | median)** | **$(ratios B "$2" | median)** | $(ratios A "$2" | list) / $(ratios B "$2" | list) | $3 |"
}
lat_values() { # what version -> one value per latency pass
  for pass in $(seq 1 "$LAT_PASSES"); do
    case $1 in
      client) awk -v a="$(lfield "$2$pass" 2)" -v b="$(lfield "floor$pass" 2)" 'BEGIN {printf "%d\n", a - b}' ;;
      own) echo "${L[own$2$pass]}" | awk '{print $2}' ;;
    esac
  done
}
lat_row() { # description what target
  echo "| $1 | **$(lat_values "$2" A | median | awk '{printf "%.0f", $1}') µs** | **$(lat_values "$2" B | median | awk '{printf "%.0f", $1}') µs** | $(lat_values "$2" A | list) / $(lat_values "$2" B | list) | $3 |"
}
S="$OUT/section.md"
{
  echo "Throughput, \`wrk -t2 -c32 -d${WRK_SECONDS}s --latency\` (bench/wrk/uniform.lua; the flood bench/wrk/flood.lua, flood_key at 10/s):"
  echo
  echo "| pass | run | floor req/s | before req/s | ÷ floor | after req/s | ÷ floor | p99 floor / before / after | server CPU µs/req before / after | load |"
  echo "|---|---|---:|---:|---:|---:|---:|---|---|---:|"
  for pass in $(seq 1 "$PASSES"); do
    for kind in $KINDS; do
      f=$(field "floor$kind$pass" 1)
      echo "| $pass | $kind | $f | $(field "A$kind$pass" 1) | $(ratio "$(field "A$kind$pass" 1)" "$f") | $(field "B$kind$pass" 1) | $(ratio "$(field "B$kind$pass" 1)" "$f") | $(field "floor$kind$pass" 3) / $(field "A$kind$pass" 3) / $(field "B$kind$pass" 3) | $(field "A$kind$pass" 4) / $(field "B$kind$pass" 4) | $(field "floor$kind$pass" 5) |"
    done
  done
  echo
  echo "Latency at $LAT_RATE req/s, open model: \`loadgen -url <server>/check -rate $LAT_RATE -from-schedule -duration ${LAT_SECONDS}s -conns 32"
  echo "-keys 10000 -dist uniform\`; own: the limiter's \`limiter_decision_duration_seconds\` over the run; straight on Redis: \`loadgen -redis"
  echo "<redis> -rate $LAT_RATE -conns 32 -keys 10000 -limit-rate 1000000 -limit-burst 1000000\` (one EVALSHA per decision). µs:"
  echo
  echo "| pass | Redis p50 / p99 | floor p50 / p99 | before client p50 / p99 | before own p50 / p99 / p99.9 | after client p50 / p99 | after own p50 / p99 / p99.9 | dropped / errors | load |"
  echo "|---|---|---|---|---|---|---|---|---:|"
  for pass in $(seq 1 "$LAT_PASSES"); do
    own() { echo "${L[own$1$pass]}" | sed 's/ / \/ /g'; }
    echo "| $pass | $(lfield "store$pass" 1) / $(lfield "store$pass" 2) | $(lfield "floor$pass" 1) / $(lfield "floor$pass" 2) | $(lfield "A$pass" 1) / $(lfield "A$pass" 2) | $(own A) | $(lfield "B$pass" 1) / $(lfield "B$pass" 2) | $(own B) | $(for k in floor A B; do printf '%s/%s ' "$(lfield "$k$pass" 4)" "$(lfield "$k$pass" 5)"; done) | $(lfield "floor$pass" 6) |"
  done
} >"$OUT/passes.md"
read -r rejAmin rejAmed rejAcpu rejAallocs <<<"$(rej A)"
read -r rejBmin rejBmed rejBcpu rejBallocs <<<"$(rej B)"
{
  echo "## /check against the HTTP floor"
  echo
  echo "Written by \`make bench-compare BASE=$BASE HEAD=$HEAD\` (bench/compare.sh) on $START_TIME: the limiter built from"
  echo "$AREV (before) and from $BREV (after), interleaved in every pass (see Method), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),"
  echo "$(redis-server --version | awk '{print $1, $2, $3}'), Go $($GO env GOVERSION), LIMITER_STORE_TIMEOUT=${BENCH_STORE_TIMEOUT:-100ms}. Load average"
  echo "at the start $START_LOAD, at the end $END_LOAD (other sessions' work)."
  echo
  echo "| comparison | before | after | each pass, before / after | target |"
  echo "|---|---:|---:|---|---|"
  tput_row "allowed path ÷ floor, req/s (wrk -t2 -c32 -d${WRK_SECONDS}s, 10,000 keys)" allowed "≥ 0.55"
  tput_row "flood on one key ÷ floor, req/s" flood "≥ 0.95"
  tput_row "allowed path ÷ floor, limiter run with GOGC=400 (a tuning, docs/scaling.md)" gogc "–"
  lat_row "client p99 at $LAT_RATE req/s: limiter − floor" client "≤ 1 ms"
  lat_row "limiter's own decision p99 at $LAT_RATE req/s (its histogram)" own "≤ 1 ms"
  echo "| … one decision straight on Redis, p99 (loadgen -redis, same passes) | $(for p in $(seq 1 "$LAT_PASSES"); do lfield "store$p" 2; done | median | awk '{printf "%.0f", $1}') µs | | $(for p in $(seq 1 "$LAT_PASSES"); do lfield "store$p" 2; done | list) | – |"
  echo "| local-tier rejection (\`BenchmarkLocalReject\`, 5 × 1 s each): min ns, allocs | **$rejAmin ns**, $rejAallocs | **$rejBmin ns**, $rejBallocs | median $rejAmed / $rejBmed ns, min CPU $rejAcpu / $rejBcpu ns (load $REJ_LOAD) | ≤ 100 ns, 0 allocs |"
  echo
  echo "Each pass's rows (throughput, latency, CPU per request, load) are printed by the script and kept in its output"
  echo "directory (passes.md)."
  echo
  cat bench/floor-notes.md
} >"$S"
cat "$S" "$OUT/passes.md"
[ "$MD" = - ] && exit 0

touch "$MD"
# The section replaces the previous one where it stands (bench/floor.sh's rule).
awk -v sec="$S" -v has="$(grep -c '^## /check against the HTTP floor' "$MD" || true)" '
  function put() { while ((getline line < sec) > 0) print line; print ""; done = 1 }
  /^## \/check against the HTTP floor/ { put(); skip = 1; next }
  skip && /^## / { skip = 0 }
  !skip && !done && !has && /^## / { put() }
  !skip { print }
  END { if (!done) put() }' "$MD" | cat -s >"$OUT/BENCHMARKS.new"
cp "$OUT/BENCHMARKS.new" "$MD"
echo "bench: wrote the section to $MD (raw outputs in $OUT)" >&2
