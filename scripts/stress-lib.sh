# stress-ng beside a test run, always stopped: shared by scripts/stress-test.sh
# and scripts/flake-hunt.sh (sourced, not executed).
#
#   start_stress CPUS SECONDS LOG   starts stress-ng --cpu CPUS for at most
#                                   SECONDS, its output in LOG; sets
#                                   stress_pid; returns non-zero if it did
#                                   not start
#   stop_stress                     stops it (and its watchdog); idempotent
#
# The caller sets `trap stop_stress EXIT` (and INT/TERM traps that exit):
# stress-ng is stopped on exit, on Ctrl-C, and by a watchdog if the script
# itself is killed outright (SIGKILL skips the trap).

stress_pid=""
watchdog_pid=""

stop_stress() {
  if [ -n "$watchdog_pid" ]; then
    kill "$watchdog_pid" 2>/dev/null
    wait "$watchdog_pid" 2>/dev/null
    watchdog_pid=""
  fi
  if [ -n "$stress_pid" ]; then
    # stress-ng leads its own process group (setsid): the group holds its
    # workers, so they stop with it.
    kill -TERM -- "-$stress_pid" 2>/dev/null
    wait "$stress_pid" 2>/dev/null
    stress_pid=""
  fi
}

start_stress() {
  local cpus="$1" seconds="$2" log="$3"
  # setsid runs stress-ng in a new session without forking (a background
  # job of a script is not a group leader), so $! is stress-ng and its
  # process group. --timeout caps its life in case both the trap and the
  # watchdog are bypassed.
  setsid stress-ng --cpu "$cpus" --timeout "${seconds}s" --quiet </dev/null >"$log" 2>&1 &
  stress_pid=$!
  # The watchdog stops stress-ng when the script ends without its trap
  # (SIGKILL): it polls the script's pid.
  (
    trap - EXIT INT TERM
    while kill -0 $$ 2>/dev/null; do sleep 2; done
    kill -TERM -- "-$stress_pid" 2>/dev/null
  ) </dev/null >/dev/null 2>&1 &
  watchdog_pid=$!
  sleep 1
  kill -0 "$stress_pid" 2>/dev/null
}
