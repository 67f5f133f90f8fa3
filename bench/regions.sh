#!/usr/bin/env bash
# Global limits across regions, each figure beside its goal, on the multi-region
# test bed: regions a, b, c, each a redis-server and a limiter, the WAN
# between them through wanproxy links (15, 40, 75 ms one-way, 10% jitter),
# home a; bench/regionload drives /check from one process and prints each
# target figure beside its goal, with the load average before and after.
# Ground truth: every arrival of a phase replayed through one ideal token
# bucket with no latency.
#
#   PHASE_SECONDS (default 15)  each measuring phase (the jumping one at least 4 jumps)
#   CUT_SECONDS   (default 60)  how long region b is cut off
#   RATE, BURST, COST (default 1000, 1000, 10)  the global limit and the tokens a request
#   ONLY          (default all) latency,spread,jump,demand3x,shift,cut
#
# At the default rate, rate × the largest round trip (b-c, 150 ms) is 150
# tokens, over the issue's 100; COST 10 keeps the load at 100 to 300
# requests/s, which two shared cores can send and serve.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${BENCH_OUT:-$(mktemp -d /tmp/ratewarden-regions.XXXXXX)}
source bench/lib.sh
require_tools redis-server
$GO build -o "$OUT/bin/" ./cmd/limiter
$GO build -C bench -o "$(realpath -m "$OUT")/bin/" ./regionload
echo "# $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), limiter $(git rev-parse --short HEAD)"
"$OUT/bin/regionload" -limiter "$OUT/bin/limiter" -phase "${PHASE_SECONDS:-15}s" -cut "${CUT_SECONDS:-60}s" \
  -rate "${RATE:-1000}" -burst "${BURST:-1000}" -cost "${COST:-10}" -store-timeout "${STORE_TIMEOUT:-}" -only "${ONLY:-}"
