#!/usr/bin/env bash
# make regions-up: three regions on this machine (scripts/regions-lib.sh has
# the ports), for a person to try global limits with:
#
#   per region a, b, c   its own redis-server and a limiter with LIMITER_REGION
#                        set, enforcing deploy/regions-policy.yaml
#   wan-dev              the WAN between them: every region reaches another
#                        region's Redis only through a link with one-way delays
#                        of 15 ms (a-b), 40 ms (a-c), 75 ms (b-c), 10% jitter
#
# Region a is the home of every global budget: b's and c's limiters reach
# a's Redis through their links to a. Nothing else runs (no Kafka, no
# ClickHouse): decision events are not emitted.
#
# Idempotent: what already runs (by pid file in run/regions/pids/) is left
# alone. Logs: run/regions/logs/. Cut a region off with
# `make regions-cut REGION=b`, heal it with `make regions-heal REGION=b`,
# stop everything with `make regions-down`.
set -euo pipefail
source "$(dirname "$0")/regions-lib.sh"

"$ROOT/scripts/deps.sh" regions || die "the packages make regions-up needs are missing (see above)"
if command -v go >/dev/null 2>&1; then GO="$(command -v go)"
elif [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go
else die "Go is not installed: get Go 1.26 or later from https://go.dev/dl/ (unpack to /usr/local/go)"; fi
mkdir -p "$PID_DIR" "$LOG_DIR" "$BIN_DIR"

# --- what must start, and are its ports free? ---------------------------------
declare -A PORTS=([wan-dev]="${WAN_CONTROL##*:}")
for r in "${REGIONS[@]}"; do
  PORTS[redis-$r]="$(redis_port "$r")"
  PORTS[limiter-$r]="$(limiter_port "$r")"
  for o in "${REGIONS[@]}"; do
    [ "$o" = "$r" ] || PORTS[wan-dev]+=" $(link_port "$r" "$o")"
  done
done
plan_start 'Stop whatever holds it, or `make regions-down` if it is an earlier test bed whose run/regions/ was removed.'

if [ ${#todo[@]} -gt 0 ]; then
  say "building into $BIN_DIR/"
  (cd "$ROOT" && CGO_ENABLED=0 "$GO" build -o "$BIN_DIR/" ./cmd/limiter ./cmd/wan-dev)
fi

# --- Redis, one per region ------------------------------------------------------
for r in "${REGIONS[@]}"; do
  if wants "redis-$r"; then
    mkdir -p "$RUN_DIR/redis-$r"
    start "redis-$r" redis-server -- --bind 127.0.0.1 --port "$(redis_port "$r")" --dir "$RUN_DIR/redis-$r" \
      --save "" --appendonly no --maxmemory-policy volatile-ttl --protected-mode yes --daemonize no
  fi
done

# --- the WAN: a link from every region to every other region's Redis ------------
if wants wan-dev; then
  links=()
  for r in "${REGIONS[@]}"; do
    for o in "${REGIONS[@]}"; do
      [ "$o" = "$r" ] && continue
      links+=("$r-$o=127.0.0.1:$(link_port "$r" "$o")>127.0.0.1:$(redis_port "$o")@$(delay_ms "$r" "$o")ms")
    done
  done
  start wan-dev "$BIN_DIR/wan-dev" WAN_DEV_LINKS="$(IFS=,; echo "${links[*]}")" \
    WAN_DEV_JITTER=0.1 WAN_DEV_CONTROL_ADDR="$WAN_CONTROL"
fi
for r in "${REGIONS[@]}"; do
  wait_until "redis-$r" 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$(redis_port "$r")"
done
wait_until wan-dev 30 http_ok "http://$WAN_CONTROL/links"

# --- a limiter per region --------------------------------------------------------
# global_store R: where region R's limiter reaches the home's Redis (the
# home itself directly, every other region through its link).
global_store() {
  if [ "$1" = "$HOME_REGION" ]; then echo "127.0.0.1:$(redis_port "$1")"
  else echo "127.0.0.1:$(link_port "$1" "$HOME_REGION")"; fi
}
all="$(IFS=,; echo "${REGIONS[*]}")"
for r in "${REGIONS[@]}"; do
  if wants "limiter-$r"; then
    start "limiter-$r" "$BIN_DIR/limiter" LIMITER_ADDR="127.0.0.1:$(limiter_port "$r")" \
      LIMITER_REGION="$r" LIMITER_REGIONS="$all" LIMITER_INSTANCE_ID="limiter-$r" \
      REDIS_ADDRS="127.0.0.1:$(redis_port "$r")" GLOBAL_REDIS_ADDRS="$(global_store "$r")" \
      POLICY_FILE="$ROOT/deploy/regions-policy.yaml" LIMITER_GRPC_ADDR=
  fi
done
for r in "${REGIONS[@]}"; do
  wait_until "limiter-$r" 30 http_ok "http://127.0.0.1:$(limiter_port "$r")/readyz"
done

cat <<EOF

Three regions are up.  Logs: $LOG_DIR/   Stop: make regions-down

  region  limiter                 redis-server      WAN to the home (a)
  a       http://127.0.0.1:18080  127.0.0.1:16379   (the home)
  b       http://127.0.0.1:28080  127.0.0.1:26379   15 ms each way
  c       http://127.0.0.1:38080  127.0.0.1:36379   40 ms each way   (b-c: 75 ms)

The key acct_global is on the tier global (100/s, burst 100, scope: global):
one limit shared by the three regions. acct_local is on the tier local (the
same numbers, regional: each region enforces its own).

Try:
  for p in 18080 28080 38080; do curl -s -X POST http://127.0.0.1:\$p/check -d '{"key":"acct_global","scope":"api"}'; echo; done
  curl -s http://127.0.0.1:28080/readyz          # "region": {"name": "b", "global": "ok", ...}
  make regions-cut REGION=b                      # b decides on its escrow: source "regional"
  make regions-heal REGION=b
  curl -s http://$WAN_CONTROL/links              # the links, cut or not, bytes, connections
EOF
