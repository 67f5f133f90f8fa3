#!/usr/bin/env bash
# The one place that knows which Debian packages this project needs, and
# installs the missing ones with apt-get. `make test` (and so .ci/run),
# `make stress-test` and `make up` (scripts/up.sh) all start here, so a fresh
# Debian machine is set up by whichever of them a newcomer runs first.
#
#   scripts/deps.sh          what `make up` needs: the stack's servers and curl
#   scripts/deps.sh test     what the tests need on top (make test, make stress-test)
#   scripts/deps.sh regions  what `make regions-up` needs: redis-server and curl
#
# Nothing is installed when everything is there (only `command -v` checks),
# so the common case costs nothing and needs no root. When something is
# missing, installing it needs root and apt-get; otherwise the script stops
# and names the packages, because a test run without its servers would fail
# later with a far less obvious error.
set -euo pipefail

set_name="${1:-stack}"

# command package: a missing command is installed from that Debian package
# (a command starting with / is a file that must exist: zookeeper has no
# command on PATH; the harness runs its server class with java).
stack=(
  "redis-server redis-server"
  "clickhouse-server clickhouse-server"
  "clickhouse-client clickhouse-client"
  "curl curl"
)
test_extra=(
  "redis-cli redis-tools"          # creates the Redis Cluster the tests run against
  "redis-sentinel redis-sentinel"  # Redis Sentinel, for the tests of that topology
  "wrk wrk"                        # HTTP load in the /check tests and benchmarks
  "h2load nghttp2-client"          # HTTP/2 (gRPC) load for the reference flood row of bench/envoy.sh (a C client)
  "chromium chromium"              # the dashboard's browser test (headless)
  "promtool prometheus"            # `promtool test rules` on deploy/prometheus/rules
  "stress-ng stress-ng"            # load for the tests that prove behaviour on a busy machine, and make stress-test
  "/usr/share/java/zookeeper.jar zookeeper"  # coordinates the replicated ClickHouse cluster of the cluster-mode tests (pulls in a Java runtime)
)

case "$set_name" in
  stack) wanted=("${stack[@]}") ;;
  test) wanted=("${stack[@]}" "${test_extra[@]}") ;;
  regions) wanted=("redis-server redis-server" "curl curl") ;;
  *) echo "usage: $0 [stack|test|regions]" >&2; exit 2 ;;
esac

need=()
for pair in "${wanted[@]}"; do
  read -r cmd pkg <<<"$pair"
  case "$cmd" in
    /*) [ -e "$cmd" ] && continue ;;
    *) command -v "$cmd" >/dev/null 2>&1 && continue ;;
  esac
  need+=("$pkg")
  case "$pkg" in
    curl) need+=(ca-certificates) ;;
    # Headless Chromium renders the dashboard's text; without recommends
    # (below) it would have no font at all.
    chromium) need+=(fonts-liberation) ;;
  esac
done
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "error: missing packages: ${need[*]}. Run this as root, or: sudo apt-get install ${need[*]}" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: missing: ${need[*]} and no apt-get here; install them with your package manager" >&2
  exit 1
fi

echo "==> installing ${need[*]} (apt-get)"
# The packages' own system services (redis-server on 6379, clickhouse-server
# on 9000, prometheus on 9090) would take the ports that `make up` and the
# tests use: keep them from starting during the install (policy-rc.d, as in
# containers). A policy-rc.d that was already there is left as it is.
policy=/usr/sbin/policy-rc.d
added=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added=1
fi
rc=0
{ DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; } || rc=$?
[ -n "$added" ] && rm -f "$policy"
if [ $rc -ne 0 ]; then
  echo "error: apt-get install ${need[*]} failed (exit $rc)" >&2
  exit $rc
fi
