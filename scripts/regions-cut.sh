#!/usr/bin/env bash
# make regions-cut REGION=b / make regions-heal REGION=b: cuts every WAN link
# of a region (to and from every other region) or heals them, through
# wan-dev's control endpoint. A cut is a blackhole, as a partition is:
# connections across it stall and new ones go nowhere; the region's clients
# find out by their own timeouts.
#
#   scripts/regions-cut.sh cut REGION    scripts/regions-cut.sh heal REGION
set -euo pipefail
source "$(dirname "$0")/regions-lib.sh"

verb="${1:-}" region="${2:-}"
case "$verb" in
  cut | heal) ;;
  *) die "usage: scripts/regions-cut.sh cut|heal REGION" ;;
esac
region_index "$region" >/dev/null 2>&1 || die "REGION=$region: want one of ${REGIONS[*]} (make regions-$verb REGION=b)"
[ -n "$(pid_of wan-dev)" ] || die "the test bed is not running (make regions-up)"
wan "$verb" "$region" || die "wan-dev did not $verb region $region (log: $LOG_DIR/wan-dev.log)"
if [ "$verb" = cut ]; then
  say "region $region is cut off: every link to and from it is a blackhole (make regions-heal REGION=$region)"
else
  say "region $region is reachable again"
fi
