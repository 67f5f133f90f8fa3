#!/usr/bin/env bash
# Key rotation: every request a new key, at full speed, against
# the real limiter binary with default settings and one redis-server, and
# the limiter's resident memory sampled while it lasts. Self-contained: it
# builds the limiter, starts its own redis-server and limiter on free
# loopback ports, and stops them on exit. Prints a markdown table.
#
#   bash bench/keyrotation.sh                  # 75 s, samples every 15 s
#   DURATION=20 EVERY=5 bash bench/keyrotation.sh
#
# Needs go, redis-server, redis-cli, wrk and curl. Extra environment for
# the limiter can be passed as LIMITER_* variables (they are inherited).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-75}
EVERY=${EVERY:-15}
THREADS=${THREADS:-2}
CONNS=${CONNS:-32}
OUT=$(mktemp -d)
source bench/lib.sh
trap 'bench_cleanup; rm -rf "$OUT"' EXIT
require_tools go redis-server redis-cli wrk curl

GOFLAGS=-tags=vtprotobuf go build -o "$OUT/limiter" ./cmd/limiter
start_redis

LPORT=$(free_port)
GPORT=$(free_port)
REDIS_ADDRS=127.0.0.1:$RPORT LIMITER_ADDR=127.0.0.1:$LPORT LIMITER_GRPC_ADDR=127.0.0.1:$GPORT \
  POLICY_FILE=deploy/policy.yaml "$OUT/limiter" 2>"$OUT/limiter.log" &
LPID=$!
PIDS+=($LPID)
wait_port "$LPORT"

# A fresh key per request from a space of 100,000,000, each wrk thread its
# own random sequence. KEYS=ip (the default): IPv6 addresses on ip: keys
# (the anonymous rule of deploy/policy.yaml); KEYS=acct: API keys of the
# default tier. Both carry the free tier's daily quota: a share per key in
# the limiter, a counter per key in Redis.
case "${KEYS:-ip}" in
  ip) PREFIX='ip:2001:db8::' ;;
  acct) PREFIX='acct_rot_' ;;
  *) echo "keyrotation: KEYS is ip or acct" >&2; exit 2 ;;
esac
cat >"$OUT/rotate.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16) % 100000)
request = function()
  return wrk.format(nil, nil, nil, '{"key":"$PREFIX' .. string.format("%x", math.random(100000000)) .. '","scope":"api"}')
end
LUA

metric() { # metric NAME [LABELS]: the value of one sample from /metrics
  curl -s "http://127.0.0.1:$LPORT/metrics" | awk -v m="$1${2:-}" '$1 == m { print $2; exit }'
}
mib() { awk -v b="${1:-0}" 'BEGIN { printf "%.0f", b / 1048576 }'; }
sample() {
  local rss
  rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$LPID/status")
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$((rss / 1024))" \
    "$(mib "$(metric go_memstats_heap_inuse_bytes)")" \
    "$(mib "$(metric limiter_local_bytes '{table="buckets"}')")+$(mib "$(metric limiter_local_bytes '{table="quotas"}')")" \
    "$(metric limiter_local_entries '{table="buckets"}')" \
    "$(redis-cli -p "$RPORT" dbsize)" "$(cut -d' ' -f1-3 /proc/loadavg)"
}

echo "limiter $(git rev-parse --short HEAD 2>/dev/null || echo '?'), KEYS=${KEYS:-ip} (\"$PREFIX…\"), wrk -t$THREADS -c$CONNS -d${DURATION}s, a fresh key per request"
echo
echo '| s | RSS MiB | heap in use MiB | local MiB (buckets+quotas) | entries | Redis keys | load average |'
echo '|---|---|---|---|---|---|---|'
sample 0
wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" -s "$OUT/rotate.lua" "http://127.0.0.1:$LPORT/check" >"$OUT/wrk.txt" 2>&1 &
WPID=$!
PIDS+=($WPID)
for ((s = EVERY; s <= DURATION; s += EVERY)); do
  sleep "$EVERY"
  sample "$s"
done
wait "$WPID" || true
echo
grep -E 'Requests/sec|Non-2xx|Socket errors|Latency' "$OUT/wrk.txt" | sed 's/^ */    /'
grep -o '"msg":"memory limit"[^}]*' "$OUT/limiter.log" | sed 's/^/    /' || true
echo
