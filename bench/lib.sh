# Shared plumbing of the bench scripts (floor.sh, compare.sh, run.sh,
# envoy.sh, keyrotation.sh, tracecost.sh, reserve.sh, spooldrain.sh), which
# source it after cd-ing to the repository root and setting OUT: the
# processes a script starts are stopped when it exits, loopback ports are
# picked free, a throwaway redis-server, the HTTP floor and the limiters
# against them are started the same way, and the figures are worked out
# with one formula each.

ROOT=$(pwd)
GO=${GO:-go}
MD=${BENCHMARKS_FILE:-$ROOT/BENCHMARKS.md} # the file a script's section goes to
mkdir -p "$OUT/bin"

PIDS=() # processes to stop on exit: append every one started
bench_cleanup() {
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap bench_cleanup EXIT

# require_tools TOOL...: exits unless every tool is on PATH.
require_tools() {
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "bench: $tool is not installed" >&2; exit 1; }
  done
}

# free_port: a loopback port nothing listens on, below the kernel's
# ephemeral range: a port in that range can be the source port of one of
# the load tools' own connections, which a connect test does not see and
# which makes the server's bind fail ("address already in use").
EPHEMERAL_LOW=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
free_port() {
  local p
  while :; do
    p=$((10000 + RANDOM % (EPHEMERAL_LOW - 10000)))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
}

# wait_port PORT: waits (up to 10 s) until something listens on PORT.
wait_port() {
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "bench: nothing listens on $1" >&2
  exit 1
}

# start_redis: a redis-server without persistence on a free port, its data
# and log in $OUT; sets RPORT and RPID.
start_redis() {
  RPORT=$(free_port)
  redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$OUT" --loglevel warning >"$OUT/redis.log" 2>&1 &
  RPID=$!
  PIDS+=($RPID)
  wait_port "$RPORT"
}

# start_floor BINARY: bench/barejson (net/http decoding and encoding the
# /check JSON, no other work) on a free port; sets FPORT and FPID.
start_floor() {
  FPORT=$(free_port)
  "$1" -addr "127.0.0.1:$FPORT" 2>>"$OUT/floor.log" &
  FPID=$!
  PIDS+=($FPID)
  wait_port "$FPORT"
}

# start_bench_limiter BINARY PORT LOG [VAR=VALUE...]: BINARY as a limiter
# on 127.0.0.1:PORT, its stderr appended to LOG, against start_redis's
# redis-server with bench/policy.yaml and no Kafka; each VAR=VALUE is added
# to its environment after those (so it may override them). Sets BLPID.
# LIMITER_STORE_TIMEOUT is BENCH_STORE_TIMEOUT, default 100ms: on two cores
# shared with the load tool the default 5 ms deadline opens the breaker
# and a run would measure degraded decisions instead of Redis-backed ones.
start_bench_limiter() {
  local bin=$1 port=$2 log=$3
  shift 3
  env LIMITER_ADDR="127.0.0.1:$port" REDIS_ADDRS="127.0.0.1:$RPORT" POLICY_FILE="$ROOT/bench/policy.yaml" \
    LIMITER_STORE_TIMEOUT="${BENCH_STORE_TIMEOUT:-100ms}" KAFKA_BROKERS= "$@" "$bin" 2>>"$log" &
  BLPID=$!
  PIDS+=($BLPID)
  wait_port "$port"
}

# start_named_limiter NAME BINARY [VAR=VALUE...]: start_bench_limiter on a
# free port, logging to $OUT/NAME.log, its Redis keys prefixed NAME (the
# limiters of a run share one redis-server) and no gRPC listener; sets
# PORT[NAME] and PID[NAME], which the script declares (declare -A PORT PID).
start_named_limiter() {
  local name=$1 bin=$2 port
  shift 2
  port=$(free_port)
  start_bench_limiter "$bin" "$port" "$OUT/$name.log" LIMITER_GRPC_ADDR= REDIS_KEY_PREFIX="$name" "$@"
  PID[$name]=$BLPID
  PORT[$name]=$port
}

load() { cut -d' ' -f1 /proc/loadavg; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; } # PID -> CPU ticks so far
us_per() { # ticks-before ticks-after requests -> µs of CPU per request
  awk -v a="$1" -v b="$2" -v n="$3" -v hz="$(getconf CLK_TCK)" 'BEGIN {if (n > 0) printf "%.0f", (b - a) * 1e6 / hz / n; else print "–"}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "–"}'; }
median() { # numbers on stdin, one per line -> their median
  sort -g | awk '{a[NR] = $1} END {if (NR == 0) print "–"; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%.2f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}

# splice_section HEADING FILE WHERE: FILE (a section, its "## " heading
# line first) takes the place in $MD of the section whose heading line
# starts with HEADING, up to the next "## ", so that a run replaces its
# own figures and leaves the others alone. Where $MD has no such section,
# WHERE says where it goes: first (after the title block, the lines before
# the first "## ") or last.
splice_section() {
  local heading=$1 sec=$2 where=$3
  touch "$MD"
  awk -v head="$heading" -v sec="$sec" -v first="$([ "$where" = first ] && echo 1 || echo 0)" '
    function put() { while ((getline line < sec) > 0) print line; print ""; done = 1 }
    NR == FNR { if (index($0, head) == 1) has = 1; next }
    index($0, head) == 1 { put(); skip = 1; next }
    skip && /^## / { skip = 0 }
    !skip && !done && !has && first && /^## / { put() }
    !skip { print }
    END { if (!done) { if (FNR > 0) print ""; put() } }' "$MD" "$MD" | cat -s | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' >"$OUT/BENCHMARKS.new"
  cp "$OUT/BENCHMARKS.new" "$MD"
  echo "bench: wrote the section to $MD (raw outputs in $OUT)" >&2
}

# quantiles BEFORE AFTER: two "le count" dumps of a Prometheus histogram taken
# around a run -> "p50 p99 p99.9" of the run in µs, linear within buckets
# (as histogram_quantile).
quantiles() {
  paste "$1" "$2" | awk '
    {le[NR] = $1; n[NR] = $4 - $2}
    END {
      total = n[NR]
      split("0.5 0.99 0.999", q, " ")
      for (j = 1; j <= 3; j++) {
        want = q[j] * total; prev = 0; lo = 0; out = "–"
        for (i = 1; i <= NR; i++) {
          if (n[i] >= want) {
            if (le[i] == "+Inf") { out = ">" lo * 1e6; break }
            out = sprintf("%.0f", (lo + (le[i] - lo) * (want - prev) / (n[i] - prev > 0 ? n[i] - prev : 1)) * 1e6)
            break
          }
          prev = n[i]; lo = le[i]
        }
        printf "%s%s", out, (j < 3 ? " " : "\n")
      }
    }'
}
