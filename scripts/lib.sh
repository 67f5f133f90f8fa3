# Shared by scripts/up.sh, scripts/down.sh and scripts/regions-*.sh
# (sourced, not executed).
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

# start NAME EXE [ENV=V ...] -- [ARGS ...]: runs EXE in its own session with
# stdin/stdout/stderr detached (log in $LOG_DIR/NAME.log), records its pid
# in $PID_DIR/NAME.pid.
start() {
  local name="$1" exe="$2"; shift 2
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  # Run it by its own name (redis-server and clickhouse-server are symlinks
  # to multi-call binaries that look at argv[0]); the pid file records the
  # resolved executable, which is what /proc/<pid>/exe shows.
  local path real
  path="$(command -v "$exe")"
  real="$(readlink -f "$path")"
  (cd "$ROOT" && exec env "${envs[@]}" setsid "$path" "$@" </dev/null >>"$LOG_DIR/$name.log" 2>&1) &
  echo "$! $real" >"$PID_DIR/$name.pid"
  say "started $name (pid $!, log $LOG_DIR/$name.log)"
}

# wait_until NAME SECONDS CMD...: waits for CMD to succeed while NAME lives.
wait_until() {
  local name="$1" secs="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ! alive "$name"; then
      printf 'error: %s exited during start; last lines of %s:\n' "$name" "$LOG_DIR/$name.log" >&2
      tail -n 20 "$LOG_DIR/$name.log" >&2 || true
      echo "(what did start keeps running: ${STOP_HINT:-make down} stops it)" >&2
      exit 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      printf 'error: %s not ready after %ss; last lines of %s:\n' "$name" "$secs" "$LOG_DIR/$name.log" >&2
      tail -n 20 "$LOG_DIR/$name.log" >&2 || true
      echo "(what did start keeps running: ${STOP_HINT:-make down} stops it)" >&2
      exit 1
    fi
    sleep 0.2
  done
}
# alive NAME: the recorded pid runs (it may not have exec'd its binary yet).
alive() {
  local pid _
  read -r pid _ <"$PID_DIR/$1.pid" 2>/dev/null || return 1
  [ -d "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}
http_ok() { curl -fsS -m 2 -o /dev/null "$1"; }

# stop_pid NAME PID: SIGTERM, up to 20 s to finish, then SIGKILL.
stop_pid() {
  local c="$1" pid="$2"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 200); do
    [ -d "/proc/$pid" ] || break
    # a zombie (exited, not yet reaped by its parent) has stopped
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && break
    sleep 0.1
  done
  if [ -d "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]; then
    say "$c (pid $pid) did not stop within 20 s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
}

# stop_all: stops every component of COMPONENTS that has a pid file in
# PID_DIR, in reverse start order (stop_pid each), and removes the files.
stop_all() {
  local stopped=0 i c f pid
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    c="${COMPONENTS[$i]}"
    f="$PID_DIR/$c.pid"
    [ -f "$f" ] || continue
    pid="$(pid_of "$c")"
    if [ -z "$pid" ]; then
      say "$c was not running (stale pid file removed)"
      rm -f "$f"
      continue
    fi
    stop_pid "$c" "$pid"
    rm -f "$f"
    say "stopped $c (pid $pid)"
    stopped=$((stopped + 1))
  done
  if [ $stopped -eq 0 ]; then
    say "nothing was running"
  fi
}

# plan_start HINT: which of COMPONENTS must start (sets todo; one whose pid
# file names a live process is left running), and exits with HINT, having
# started nothing, when a port of PORTS (component → its ports) that one
# of them needs is in use.
plan_start() {
  local c p w pid busy=()
  todo=()
  for c in "${COMPONENTS[@]}"; do
    if pid="$(pid_of "$c")" && [ -n "$pid" ]; then
      say "$c already running (pid $pid)"
      continue
    fi
    rm -f "$PID_DIR/$c.pid"
    todo+=("$c")
    for p in ${PORTS[$c]}; do
      if ! port_free "$p"; then
        w="$(who_listens "$p")"
        busy+=("127.0.0.1:$p (needed by $c) is in use${w:+ by $w}")
      fi
    done
  done
  if [ ${#busy[@]} -gt 0 ]; then
    printf 'error: port busy, nothing was started:\n' >&2
    printf '  %s\n' "${busy[@]}" >&2
    printf '%s\n' "$1" >&2
    exit 1
  fi
}

# wants C: whether plan_start put C in todo.
wants() { local x; for x in "${todo[@]}"; do [ "$x" = "$1" ] && return 0; done; return 1; }
