#!/usr/bin/env bash
# make stress-test: the fault and process tests, STRESS_RUNS times, while
# stress-ng keeps every core busy. The failure guarantees (degrade, recover,
# exact totals) must hold on a loaded machine, every time: a test that passes
# only on an idle machine depends on its speed, which no test may.
#
#   STRESS_RUNS=5      how many times each test runs
#   STRESS_CPUS=nproc  stress-ng CPU workers (default: one per core)
#   STRESS_RACE=1      with the race detector, the tests and the binaries
#                      they run as processes (RATEWARDEN_RACE_CHILDREN=1;
#                      make test builds those without it); 0: neither
#   STRESS_TESTS       "package regexp" lines, replacing the default set below
#   STRESS_OUT         directory for the logs (default: a new one under $TMPDIR)
#   STRESS_HOSTILE=1   then the hostile-traffic pass (0: without): the
#                      TestHostile* tests, with RATEWARDEN_HOSTILE=1, once
#                      each, after stress-ng has stopped (they report
#                      latencies beside a flood, slow clients and bad input)
#   STRESS_HOSTILE_RUNS=1   how many times the hostile pass runs
#   STRESS_HOSTILE_TESTS    "package regexp" lines, replacing the default set
#
# Prints a table (test, passed/runs) and exits non-zero if any test failed
# any run, or a package run failed without a test to blame (build error,
# TestMain, timeout). stress-ng is always stopped: on exit, on Ctrl-C, and by
# a watchdog if this script itself is killed.
set -uo pipefail

# The whole script is one compound command, read before any of it runs: a
# run takes many minutes, and bash otherwise reads a script as it goes, so
# an edit of this file during a run (a git pull, another engineer) would
# make it execute from the wrong offset.
{
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

GO="${GO:-go}"
RUNS="${STRESS_RUNS:-5}"
CPUS="${STRESS_CPUS:-$(nproc)}"
RACE="${STRESS_RACE:-1}"

# The packages whose tests kill, pause, restart or cut off real servers
# (redis-server, Cluster masters, clickhouse-server, the Kafka broker) or run
# the binaries as processes. Whole packages where every test is such a test,
# so that fault tests added later are stressed too; one test by name where
# the package is mostly something else.
DEFAULT_TESTS="
./cmd/limiter .
./cmd/meter-consumer .
./cmd/usage-api .
./enforcement/redisstore .
./enforcement/lease .
./enforcement/fleet .
./enforcement/envoyrls .
./metering/consumer .
./testkit/testenv .
./metering/kafkaemit .
./metering/reconcile .
./metering/usage ^TestClickHouseOutage\$
./deploy/deploytest ^TestUpDown\$
"
TESTS="${STRESS_TESTS:-$DEFAULT_TESTS}"

# The hostile-traffic tests (testkit/hostile): skipped by make test and by
# the stress runs above, run here with RATEWARDEN_HOSTILE=1. Loopback only,
# each bounded in count and time (the slow-client tests wait for the
# servers' real read timeouts, 5-30 s).
DEFAULT_HOSTILE_TESTS="
./cmd/limiter ^TestHostile
./cmd/usage-api ^TestHostile
"
HOSTILE="${STRESS_HOSTILE:-1}"
HRUNS="${STRESS_HOSTILE_RUNS:-1}"
HOSTILE_TESTS="${STRESS_HOSTILE_TESTS:-$DEFAULT_HOSTILE_TESTS}"

die() { printf 'stress-test: %s\n' "$*" >&2; exit 2; }

case "$RUNS" in '' | *[!0-9]* | 0) die "STRESS_RUNS must be a positive integer, got '$RUNS'" ;; esac
case "$CPUS" in '' | *[!0-9]* | 0) die "STRESS_CPUS must be a positive integer, got '$CPUS'" ;; esac
case "$HOSTILE" in 0 | 1) ;; *) die "STRESS_HOSTILE must be 0 or 1, got '$HOSTILE'" ;; esac
case "$HRUNS" in '' | *[!0-9]* | 0) die "STRESS_HOSTILE_RUNS must be a positive integer, got '$HRUNS'" ;; esac
command -v stress-ng >/dev/null 2>&1 || die "stress-ng is not installed (make stress-test installs it: scripts/deps.sh test)"
command -v "$GO" >/dev/null 2>&1 || die "go is not installed"

pkgs=()
regexps=()
while read -r pkg re; do
  [ -z "$pkg" ] && continue
  pkgs+=("$pkg")
  regexps+=("${re:-.}")
done <<<"$TESTS"
[ ${#pkgs[@]} -gt 0 ] || die "no tests selected (STRESS_TESTS is empty)"
hpkgs=()
hregexps=()
if [ "$HOSTILE" = 1 ]; then
  while read -r pkg re; do
    [ -z "$pkg" ] && continue
    hpkgs+=("$pkg")
    hregexps+=("${re:-^TestHostile}")
  done <<<"$HOSTILE_TESTS"
fi

OUT="${STRESS_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/ratewarden-stress.XXXXXX")}"
mkdir -p "$OUT" || die "cannot create $OUT"
race=()
if [ "$RACE" = 1 ]; then
  race=(-race)
  export RATEWARDEN_RACE_CHILDREN=1
fi

# Compile every test binary before the load starts, so that the runs time
# the tests and not the compiler (the binaries land in the build cache).
mapfile -t build_pkgs < <(printf '%s\n' "${pkgs[@]}" "${hpkgs[@]}" | sort -u)
echo "==> building the test binaries (${build_pkgs[*]})"
if ! "$GO" test "${race[@]}" -c -o "$OUT/bin/" "${build_pkgs[@]}" >"$OUT/build.log" 2>&1; then
  cat "$OUT/build.log" >&2
  die "build failed"
fi
rm -rf "$OUT/bin"

# --- stress-ng, always stopped ------------------------------------------------
. scripts/stress-lib.sh
trap stop_stress EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# A cap on its life: an hour per run is far beyond what a run takes.
start_stress "$CPUS" "$((RUNS * 3600))" "$OUT/stress-ng.log" || { cat "$OUT/stress-ng.log" >&2; die "stress-ng did not start"; }
echo "==> stress-ng --cpu $CPUS running (pid $stress_pid); $RUNS run(s); logs in $OUT"

# --- the runs -----------------------------------------------------------------
declare -A passed failed skipped notrun
order=()         # "pkg test" in the order first seen
pkg_failures=()  # package runs that failed with no failing test to blame
declare -A seen

declare -A runs_of  # how many runs a test's pass had (RUNS, or HRUNS for the hostile pass)

# run_pkg PASS RUN OF PKG REGEXP [go test flags...]: one package run, tallied.
run_pkg() {
  local pass="$1" run="$2" of="$3" pkg="$4" re="$5"
  shift 5
  local log="$OUT/$pass$run-$(printf '%s' "${pkg#./}" | tr '/' '_').log"
  local start=$SECONDS
  "$GO" test "${race[@]}" -count=1 -v -timeout 30m -run "$re" "$@" "$pkg" >"$log" 2>&1
  local rc=$?
  # Top-level results are the unindented "--- PASS/FAIL/SKIP: Name" lines;
  # a test that started ("=== RUN   Name") and has none was cut off by a
  # panic or the timeout, which is a failure.
  declare -A result=()
  local kind name key
  while read -r kind name; do
    case "$kind" in
      RUN) [ -z "${result[$name]:-}" ] && result[$name]=cut ;;
      PASS) result[$name]=pass ;;
      FAIL) result[$name]=fail ;;
      SKIP) result[$name]=skip ;;
    esac
  done < <(sed -n -E \
    -e 's/^=== RUN +([^/ ]+)$/RUN \1/p' \
    -e 's/^--- (PASS|FAIL|SKIP): ([^/ ]+) .*/\1 \2/p' "$log")
  local blamed=0 np=0 nf=0
  local suffix=""
  [ "$pass" != run ] && suffix=" ($pass)" # a test in both passes is two rows
  for name in "${!result[@]}"; do
    key="$pkg $name$suffix"
    if [ -z "${seen[$key]:-}" ]; then
      seen[$key]=1
      order+=("$key")
    fi
    runs_of[$key]=$of
    case "${result[$name]}" in
      pass) passed[$key]=$((${passed[$key]:-0} + 1)); np=$((np + 1)) ;;
      skip) skipped[$key]=$((${skipped[$key]:-0} + 1)) ;;
      *) failed[$key]="${failed[$key]:-}${failed[$key]:+,}$run"; blamed=1; nf=$((nf + 1)) ;;
    esac
  done
  if [ $rc -ne 0 ] && [ $blamed = 0 ]; then
    pkg_failures+=("$pass $run: $pkg exited $rc with no failing test (build, TestMain or timeout): $log")
  fi
  printf '    %s %d/%d %-26s %3d passed %3d failed  %4ds  %s\n' "$pass" "$run" "$of" "$pkg" "$np" "$nf" "$((SECONDS - start))" \
    "$([ $rc -eq 0 ] && echo ok || echo "FAIL ($log)")"
}

for ((run = 1; run <= RUNS; run++)); do
  for i in "${!pkgs[@]}"; do
    if ! kill -0 "$stress_pid" 2>/dev/null; then
      die "stress-ng exited before run $run ($OUT/stress-ng.log): the results would not be under load"
    fi
    # The hostile tests have their own pass below.
    run_pkg run "$run" "$RUNS" "${pkgs[$i]}" "${regexps[$i]}" -skip '^TestHostile'
  done
done
stop_stress

# --- the hostile pass ---------------------------------------------------------
# Without stress-ng: the latencies these tests report (normal keys beside a
# flood, slow clients) then describe the server, not the load generator.
if [ ${#hpkgs[@]} -gt 0 ]; then
  echo "==> the hostile-traffic pass (RATEWARDEN_HOSTILE=1), $HRUNS run(s)"
  for ((run = 1; run <= HRUNS; run++)); do
    for i in "${!hpkgs[@]}"; do
      RATEWARDEN_HOSTILE=1 run_pkg hostile "$run" "$HRUNS" "${hpkgs[$i]}" "${hregexps[$i]}"
    done
  done
fi

# --- the table ----------------------------------------------------------------
# A test that did not run at all in some run (added or renamed meanwhile by
# a concurrent change) is shown as such rather than as a failure.
bad=0
echo
printf '%-72s %s\n' "test (stress-ng --cpu $CPUS, race=$RACE)" "passed/runs"
mapfile -t order < <(printf '%s\n' "${order[@]}" | sort)
for key in "${order[@]}"; do
  p=${passed[$key]:-0} s=${skipped[$key]:-0} f="${failed[$key]:-}"
  nf=0
  [ -n "$f" ] && nf=$(($(tr -cd ',' <<<"$f" | wc -c) + 1))
  absent=$((${runs_of[$key]:-$RUNS} - p - s - nf))
  note=""
  [ -n "$f" ] && note="  failed in run ${f}" && bad=1
  [ "$s" -gt 0 ] && note="$note  skipped $s"
  [ "$absent" -gt 0 ] && note="$note  not run $absent"
  printf '%-72s %d/%d%s\n' "${key#./}" "$p" "${runs_of[$key]:-$RUNS}" "$note"
done
for f in "${pkg_failures[@]}"; do
  echo "package failure, $f"
  bad=1
done
echo
if [ $bad -ne 0 ]; then
  echo "stress-test: FAILED (logs: $OUT)"
  exit 1
fi
echo "stress-test: every test passed every run (logs: $OUT)"
exit 0
}
