#!/usr/bin/env bash
# make up: the whole stack on this machine, on fixed loopback ports, with the
# demo policy (deploy/policy.yaml) and a little demo traffic.
#
#   redis-server      127.0.0.1:6379   data in run/redis/
#   clickhouse-server 127.0.0.1:9000   (HTTP 8123) data in run/clickhouse/
#   kafka-dev         127.0.0.1:9092   embedded Kafka-protocol broker, data in run/kafka/
#   limiter           127.0.0.1:8080   policy from the policy log (POLICY_SOURCE=kafka),
#                                      bootstrapped from deploy/policy.yaml
#   usage-api         127.0.0.1:8081   dashboard at /
#   meter-consumer    127.0.0.1:8082   health and metrics
#   demo-traffic      sends ~40 /check requests per second
#
# Idempotent: what already runs (by pid file in run/pids/) is left alone.
# Logs: run/logs/. Stop with `make down` (scripts/down.sh).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# --- 1. tools -----------------------------------------------------------------
# What the stack needs (redis-server, clickhouse-server/client, curl) is
# installed with apt-get when missing; scripts/deps.sh is the one place that
# knows the packages (make test uses it too).
install_missing() {
  "$ROOT/scripts/deps.sh" stack || die "the packages make up needs are missing (see above)"
}

find_go() {
  if command -v go >/dev/null 2>&1; then command -v go; return; fi
  if [ -x /usr/local/go/bin/go ]; then echo /usr/local/go/bin/go; return; fi
  die "Go is not installed: get Go 1.26 or later from https://go.dev/dl/ (unpack to /usr/local/go)"
}

install_missing
GO="$(find_go)"
mkdir -p "$PID_DIR" "$LOG_DIR" "$RUN_DIR/redis" "$RUN_DIR/clickhouse" "$RUN_DIR/policy-cache" "$RUN_DIR/kafka" "$BIN_DIR"

# --- 2. what must start, and are its ports free? ------------------------------
declare -A PORTS=(
  [redis]="$REDIS_PORT" [clickhouse]="$CH_TCP_PORT $CH_HTTP_PORT" [kafka-dev]="$KAFKA_PORT"
  [limiter]="$LIMITER_PORT" [meter-consumer]="$METER_PORT" [usage-api]="$USAGE_PORT" [demo-traffic]=""
)
plan_start 'Stop whatever holds it (a system service? try: systemctl stop redis-server clickhouse-server), or `make down` if it is an earlier stack whose run/ was removed.'

# The embedded broker keeps nothing across restarts: a fresh one starts its
# log again at offset 0. meter-consumer sees that the log is not the one its
# ClickHouse progress belongs to and reads the new log as a new epoch
# (docs/metering.md, "When the Kafka log starts over"), so the ClickHouse data, the dashboard's
# history, stays across make down / make up. The policy log (topic
# ratelimit.policy) starts over too: the limiter enforces its bootstrap
# POLICY_FILE while the log is empty, step 6 pushes deploy/policy.yaml as
# revision 1 again, and the policy audit records the new log as a new epoch
# (docs/policy-log.md, "The audit").

# --- 3. build -----------------------------------------------------------------
if [ ${#todo[@]} -gt 0 ]; then
  say "building into $BIN_DIR/"
  (cd "$ROOT" && CGO_ENABLED=0 "$GO" build -o "$BIN_DIR/" \
    ./cmd/limiter ./cmd/meter-consumer ./cmd/usage-api ./cmd/kafka-dev ./cmd/demo-traffic)
fi

# --- 4. secrets (generated once, kept in run/secrets.env) ---------------------
SECRETS="$RUN_DIR/secrets.env"
if [ ! -s "$SECRETS" ]; then
  rnd() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
  umask 077
  printf 'USAGE_ADMIN_TOKEN=adm_%s\nUSAGE_TOKEN_SECRET=%s\n' "$(rnd)" "$(rnd)" >"$SECRETS"
  umask 022
fi
# shellcheck disable=SC1090
source "$SECRETS"
# The policy log's writers sign what they write and every reader checks it
# (docs/threat-model.md): one key for the operator's CLI, one for
# usage-api, generated once in run/keys/ with the keyring that trusts them.
KEYS="$RUN_DIR/keys"
if [ ! -s "$KEYS/keyring" ]; then
  mkdir -p "$KEYS" && chmod 700 "$KEYS" && rm -f "$KEYS"/*.pem
  { "$BIN_DIR/limiter" policy keygen operator --out "$KEYS/operator.pem" &&
    "$BIN_DIR/limiter" policy keygen usage-api --out "$KEYS/usage-api.pem"; } >"$KEYS/keyring.new" ||
    die "could not generate the policy log's keys in $KEYS"
  mv "$KEYS/keyring.new" "$KEYS/keyring"
fi

# --- 5. start (start, wait_until: scripts/lib.sh) -------------------------
if wants redis; then
  # Quota counters survive a restart: AOF fsynced every second; under memory
  # pressure buckets (short TTLs) go before quota counters (docs/backends.md).
  start redis redis-server -- --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$RUN_DIR/redis" \
    --save "" --appendonly yes --appendfsync everysec --maxmemory-policy volatile-ttl \
    --protected-mode yes --daemonize no
fi
if wants clickhouse; then
  CH="$RUN_DIR/clickhouse"
  mkdir -p "$CH/data" "$CH/tmp" "$CH/user_files" "$CH/format_schemas"
  sed -e "s#{{DIR}}#$CH#g" -e "s#{{TCP}}#$CH_TCP_PORT#g" -e "s#{{HTTP}}#$CH_HTTP_PORT#g" \
    -e "s#{{LOGS}}#$LOG_DIR#g" "$ROOT/scripts/clickhouse.xml" >"$CH/config.xml"
  start clickhouse clickhouse-server -- --config-file="$CH/config.xml"
fi
if wants kafka-dev; then
  # Its data under run/kafka: make down / make up keeps the policy log, its
  # overrides and the decisions (make down-clean starts over).
  start kafka-dev "$BIN_DIR/kafka-dev" KAFKA_DEV_ADDR="127.0.0.1:$KAFKA_PORT" KAFKA_DEV_DATA_DIR="$RUN_DIR/kafka"
fi
wait_until redis 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$REDIS_PORT"
wait_until kafka-dev 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$KAFKA_PORT"

if wants limiter; then
  start limiter "$BIN_DIR/limiter" LIMITER_ADDR="127.0.0.1:$LIMITER_PORT" REDIS_ADDRS="127.0.0.1:$REDIS_PORT" \
    KAFKA_BROKERS="127.0.0.1:$KAFKA_PORT" POLICY_FILE="$ROOT/deploy/policy.yaml" \
    POLICY_SOURCE=kafka POLICY_CACHE_DIR="$RUN_DIR/policy-cache" POLICY_TRUSTED_KEYS_FILE="$KEYS/keyring" \
    LIMITER_SPOOL_DIR="$RUN_DIR/spool"
fi
wait_until clickhouse 90 http_ok "http://127.0.0.1:$CH_HTTP_PORT/ping"
if wants meter-consumer; then
  start meter-consumer "$BIN_DIR/meter-consumer" KAFKA_BROKERS="127.0.0.1:$KAFKA_PORT" \
    CLICKHOUSE_ADDR="127.0.0.1:$CH_TCP_PORT" METER_ADDR="127.0.0.1:$METER_PORT" \
    REDIS_ADDRS="127.0.0.1:$REDIS_PORT" POLICY_FILE="$ROOT/deploy/policy.yaml" POLICY_TRUSTED_KEYS_FILE="$KEYS/keyring"
fi
if wants usage-api; then
  start usage-api "$BIN_DIR/usage-api" USAGE_API_ADDR="127.0.0.1:$USAGE_PORT" \
    CLICKHOUSE_ADDR="127.0.0.1:$CH_TCP_PORT" POLICY_FILE="$ROOT/deploy/policy.yaml" \
    REDIS_ADDRS="127.0.0.1:$REDIS_PORT" USAGE_ADMIN_TOKEN="$USAGE_ADMIN_TOKEN" USAGE_TOKEN_SECRET="$USAGE_TOKEN_SECRET" \
    POLICY_TRUSTED_KEYS_FILE="$KEYS/keyring" POLICY_SIGNING_KEY_FILE="$KEYS/usage-api.pem"
fi
wait_until limiter 30 http_ok "http://127.0.0.1:$LIMITER_PORT/readyz"

# --- 6. the policy log: deploy/policy.yaml as revision 1 of an empty log ------
# The limiter's CLI reaches the log with the limiter's variables. A log that
# already has a document (a second make up) is left as it is; with
# --expect-revision 0 a push that races another writer is refused, not
# stacked on top of it.
policy_cli() { KAFKA_BROKERS="127.0.0.1:$KAFKA_PORT" POLICY_TRUSTED_KEYS_FILE="$KEYS/keyring" \
  POLICY_SIGNING_KEY_FILE="$KEYS/operator.pem" "$BIN_DIR/limiter" "$@"; }
# A topic that does not exist yet is an empty log: readers (the limiter,
# history) create nothing, the first push creates it.
log_head() {
  local out
  if ! out="$(policy_cli policy history --limit 1 2>&1)"; then
    case "$out" in *"does not exist"*) echo 0; return 0 ;; esac
    printf '%s\n' "$out" >&2
    return 1
  fi
  printf '%s\n' "$out" | sed -n 's/^head: revision \([0-9]*\)$/\1/p'
}
head="$(log_head)" || die "cannot read the policy log (limiter policy history)"
if [ "${head:-0}" = 0 ]; then
  if ! policy_cli policy push "$ROOT/deploy/policy.yaml" --expect-revision 0 --author make-up \
    -m "make up: bootstrap from deploy/policy.yaml" >/dev/null; then
    head="$(log_head)" || true
    [ "${head:-0}" != 0 ] || die "could not push deploy/policy.yaml to the policy log (see above)"
  fi
fi
# The limiter switches from its bootstrap file to the log by itself.
wait_until limiter 30 bash -c "curl -fsS -m 2 http://127.0.0.1:$LIMITER_PORT/readyz | grep -q '\"source\": *\"kafka\"'"
if wants demo-traffic; then
  start demo-traffic "$BIN_DIR/demo-traffic" DEMO_LIMITER_URL="http://127.0.0.1:$LIMITER_PORT"
fi
wait_until meter-consumer 60 http_ok "http://127.0.0.1:$METER_PORT/readyz"
wait_until usage-api 60 http_ok "http://127.0.0.1:$USAGE_PORT/readyz"

# --- 7. a portal token, and what to do next -----------------------------------
DEMO_KEY=acct_demo_pro
resp="$(curl -fsS -m 10 -X POST "http://127.0.0.1:$USAGE_PORT/v1/admin/portal-tokens" \
  -H "Authorization: Bearer $USAGE_ADMIN_TOKEN" -H 'Content-Type: application/json' \
  -d "{\"key\":\"$DEMO_KEY\",\"ttl_seconds\":86400}")" || die "could not mint a portal token (see $LOG_DIR/usage-api.log)"
PORTAL_TOKEN="$(printf '%s' "$resp" | sed -n 's/.*"token":"\([^"]*\)".*/\1/p')"
[ -n "$PORTAL_TOKEN" ] || die "unexpected answer from POST /v1/admin/portal-tokens: $resp"
printf '%s\n' "$PORTAL_TOKEN" >"$RUN_DIR/portal-token"

cat <<EOF

ratewarden is up.  Logs: $LOG_DIR/   Stop: make down

  limiter         http://127.0.0.1:$LIMITER_PORT    POST /check, GET /readyz, /metrics
  usage API       http://127.0.0.1:$USAGE_PORT    dashboard: open it, paste the portal token below
  meter-consumer  http://127.0.0.1:$METER_PORT/metrics
  ClickHouse      127.0.0.1:$CH_TCP_PORT (native), http://127.0.0.1:$CH_HTTP_PORT   database "ratelimit"
  Redis           127.0.0.1:$REDIS_PORT
  Kafka (kfake)   127.0.0.1:$KAFKA_PORT   topics ratelimit.decisions, ratelimit.policy (data in $RUN_DIR/kafka)

Portal token for $DEMO_KEY (valid 24 h; also in $RUN_DIR/portal-token):
  $PORTAL_TOKEN
Admin token: USAGE_ADMIN_TOKEN in $SECRETS

Try:
  curl -s -X POST http://127.0.0.1:$LIMITER_PORT/check -H 'Content-Type: application/json' -d '{"key":"acct_demo_pro","scope":"api:orders"}'
  curl -s -H "Authorization: Bearer \$(cat $RUN_DIR/portal-token)" 'http://127.0.0.1:$USAGE_PORT/v1/usage?window=minute&group_by=scope'

Demo traffic (~40 requests/s from a few keys) is running; the dashboard fills within a minute.

The policy log (change it with limiter policy push / limiter override set,
KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT POLICY_SIGNING_KEY_FILE=$KEYS/operator.pem
POLICY_TRUSTED_KEYS_FILE=$KEYS/keyring; docs/policy.md, docs/threat-model.md):
EOF
policy_cli policy history --limit 10 || die "cannot read the policy log (limiter policy history)"
