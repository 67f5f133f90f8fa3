# Shared by scripts/up.sh and scripts/down.sh (sourced, not executed).
#
# Every process the local stack starts has a pid file in $RUN_DIR/pids/
# holding "<pid> <resolved executable path>". A process is "ours" only when
# the pid is alive AND /proc/<pid>/exe is that executable, so a recycled pid
# is never signalled.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN_DIR="${RUN_DIR:-$ROOT/run}"
BIN_DIR="${BIN_DIR:-$ROOT/bin}"
PID_DIR="$RUN_DIR/pids"
LOG_DIR="$RUN_DIR/logs"

# Fixed loopback ports (docs/reference.md, "Make targets"). The RW_*_PORT overrides exist for the
# test of this script, which runs it beside other servers on free ports.
REDIS_PORT="${RW_REDIS_PORT:-6379}"
CH_TCP_PORT="${RW_CLICKHOUSE_PORT:-9000}"
CH_HTTP_PORT="${RW_CLICKHOUSE_HTTP_PORT:-8123}"
KAFKA_PORT="${RW_KAFKA_PORT:-9092}"
LIMITER_PORT="${RW_LIMITER_PORT:-8080}"
USAGE_PORT="${RW_USAGE_PORT:-8081}"
METER_PORT="${RW_METER_PORT:-8082}"

# Start order; down.sh stops in reverse.
COMPONENTS=(redis clickhouse kafka-dev limiter meter-consumer usage-api demo-traffic)

say() { printf '==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# pid_of NAME: prints the pid when NAME is running and ours, else nothing.
pid_of() {
  local f="$PID_DIR/$1.pid" pid exe cur
  [ -f "$f" ] || return 0
  read -r pid exe <"$f" || return 0
  [ -n "${pid:-}" ] && [ -d "/proc/$pid" ] || return 0
  cur="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
  cur="${cur% (deleted)}"
  if [ "$cur" = "$exe" ]; then
    echo "$pid"
  fi
}

# port_free PORT: true when nothing listens on 127.0.0.1:PORT.
port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# who_listens PORT: a short description of the listener, when ss can tell.
who_listens() {
  if command -v ss >/dev/null 2>&1; then
    ss -Hltnp "sport = :$1" 2>/dev/null | sed -n 's/.*users:((\(.*\)))/\1/p' | head -1
  fi
}
