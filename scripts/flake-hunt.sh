#!/usr/bin/env bash
# make flake-hunt: the whole test run of `make test`, as CI runs it
# (make test-run: every package, -race, -p TEST_P, the same environment),
# FLAKE_RUNS times in a fresh clone, while stress-ng keeps FLAKE_CPUS cores
# busy. A test that fails in any run depends on timing or hides a bug: the
# table names it with how often it failed, and the logs hold its output.
#
#   FLAKE_RUNS=8     how many times the suite runs
#   FLAKE_CPUS=1     stress-ng CPU workers beside it (0: no stress-ng)
#   FLAKE_PKGS       the packages (default ./..., and the bench module's
#                    tests as make test runs them); a narrower set, such as
#                    ./internal/tracing, is a smoke run of this script
#   FLAKE_REV=HEAD   the commit to clone and test
#   FLAKE_OUT        directory for the clone and the logs (default: a new
#                    one under $TMPDIR, kept for reading)
#   RATEWARDEN_TEST_TIMEOUT_SCALE   passed through, as to any test run
#
# The clone is of committed work only (FLAKE_REV): what CI would test.
# Exits non-zero if any test failed any run, or a run failed with no test
# to blame (build error, TestMain, timeout). stress-ng is always stopped:
# on exit, on Ctrl-C, and by a watchdog if this script itself is killed.
set -uo pipefail

# One compound command, read whole before it runs: a hunt takes an hour,
# and an edit of this file meanwhile must not change what runs.
{
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
export PATH="$PATH:/usr/local/go/bin"

RUNS="${FLAKE_RUNS:-8}"
CPUS="${FLAKE_CPUS:-1}"
PKGS="${FLAKE_PKGS:-./...}"
REV="${FLAKE_REV:-HEAD}"

die() { printf 'flake-hunt: %s\n' "$*" >&2; exit 2; }

case "$RUNS" in '' | *[!0-9]* | 0) die "FLAKE_RUNS must be a positive integer, got '$RUNS'" ;; esac
case "$CPUS" in '' | *[!0-9]*) die "FLAKE_CPUS must be a non-negative integer, got '$CPUS'" ;; esac
if [ "$CPUS" -gt 0 ]; then
  command -v stress-ng >/dev/null 2>&1 || die "stress-ng is not installed (make flake-hunt installs it: scripts/deps.sh test)"
fi
command -v go >/dev/null 2>&1 || die "go is not installed"
sha="$(git rev-parse --verify "$REV^{commit}" 2>/dev/null)" || die "FLAKE_REV=$REV is not a commit"
# The bench module's tests belong to the whole suite only.
bench=""
[ -z "${FLAKE_PKGS:-}" ] && bench="./..."

OUT="${FLAKE_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/ratewarden-flake-hunt.XXXXXX")}"
mkdir -p "$OUT" || die "cannot create $OUT"
clone="$OUT/ratewarden"
rm -rf "$clone"
git clone --quiet --no-hardlinks "$ROOT" "$clone" || die "git clone failed"
git -C "$clone" checkout --quiet --detach "$sha" || die "checkout $sha failed"

# The runs time the tests, not the compiler: every test binary is built
# (into the build cache) before the load starts.
echo "==> $(git -C "$clone" log -1 --format='%h %s'): building the test binaries"
# With the Makefile's GOFLAGS (build tags, -trimpath), which key the cache.
goflags="$(make -s -C "$clone" --no-print-directory -f Makefile -f - print-goflags <<<'print-goflags: ; @echo $(GOFLAGS)')"
# -exec true runs none of them (go test -c -o dir refuses two packages
# of one name, such as the two regionstest).
if ! (cd "$clone" && GOFLAGS="$goflags" go test -race -count=1 -exec true $PKGS) >"$OUT/build.log" 2>&1; then
  cat "$OUT/build.log" >&2
  die "build failed"
fi

. scripts/stress-lib.sh
trap stop_stress EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [ "$CPUS" -gt 0 ]; then
  # A cap on its life: an hour per run is far beyond what a run takes.
  start_stress "$CPUS" "$((RUNS * 3600))" "$OUT/stress-ng.log" || { cat "$OUT/stress-ng.log" >&2; die "stress-ng did not start"; }
  echo "==> stress-ng --cpu $CPUS running (pid $stress_pid); $RUNS run(s) of $PKGS; logs in $OUT"
else
  echo "==> no stress-ng; $RUNS run(s) of $PKGS; logs in $OUT"
fi

# fails_of LOG: "package test" for each test that failed in the go test
# -json stream LOG, then "package -" for each package that failed with no
# failing test (a build error, a panic in TestMain, the timeout).
fails_of() {
  local line pkg test
  declare -A blamed=()
  local failed_pkgs=()
  while IFS= read -r line; do
    pkg="$(sed -n -E 's/.*"Package":"([^"]*)".*/\1/p' <<<"$line")"
    test="$(sed -n -E 's/.*"Test":"([^"]*)".*/\1/p' <<<"$line")"
    if [ -n "$test" ]; then
      echo "$pkg $test"
      blamed[$pkg]=1
    else
      failed_pkgs+=("$pkg")
    fi
  done < <(grep -E '"Action":"fail"' "$1")
  for pkg in "${failed_pkgs[@]}"; do
    [ -z "${blamed[$pkg]:-}" ] && echo "$pkg -"
  done
  return 0
}

declare -A count=() runs_failed=()
bad_runs=0
for ((run = 1; run <= RUNS; run++)); do
  if [ "$CPUS" -gt 0 ] && ! kill -0 "$stress_pid" 2>/dev/null; then
    die "stress-ng exited before run $run ($OUT/stress-ng.log): the results would not be under load"
  fi
  log="$OUT/run$run.json"
  start=$SECONDS
  # make -s: only go test's output, one JSON object a line.
  make -s -C "$clone" --no-print-directory test-run PKGS="$PKGS" BENCH_PKGS="$bench" TEST_FLAGS=-json >"$log" 2>"$OUT/run$run.stderr"
  rc=$?
  mapfile -t fails < <(fails_of "$log")
  if [ $rc -ne 0 ] && [ ${#fails[@]} -eq 0 ]; then
    fails=("make test-run exited $rc with no test or package to blame ($OUT/run$run.stderr)")
  fi
  for f in "${fails[@]}"; do
    count[$f]=$((${count[$f]:-0} + 1))
    runs_failed[$f]="${runs_failed[$f]:-}${runs_failed[$f]:+,}$run"
  done
  [ ${#fails[@]} -gt 0 ] && bad_runs=$((bad_runs + 1))
  printf '    run %d/%d  %4ds  %s\n' "$run" "$RUNS" "$((SECONDS - start))" \
    "$([ ${#fails[@]} -eq 0 ] && echo ok || echo "${#fails[@]} failed ($log)")"
done
stop_stress

echo
if [ ${#count[@]} -eq 0 ]; then
  echo "flake-hunt: $RUNS of $RUNS runs passed, nothing failed (stress-ng --cpu $CPUS; $PKGS; logs: $OUT)"
  exit 0
fi
printf '%-90s %s\n' "failed test (stress-ng --cpu $CPUS; \"-\": the package, no test to blame)" "failed/runs"
mapfile -t keys < <(printf '%s\n' "${!count[@]}" | sort)
for f in "${keys[@]}"; do
  printf '%-90s %d/%d  in run %s\n' "$f" "${count[$f]}" "$RUNS" "${runs_failed[$f]}"
done
echo
echo "flake-hunt: $bad_runs of $RUNS runs failed; a test's output: grep '\"Test\":\"<name>\"' $OUT/run<N>.json | jq -r .Output"
exit 1
}
