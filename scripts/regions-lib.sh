# Shared by scripts/regions-up.sh, regions-down.sh and regions-cut.sh
# (sourced): the multi-region test bed's names, ports and files, on top of
# scripts/lib.sh's helpers (pid files, start, stop_pid).
#
#   region  redis-server  limiter          reaches the other regions' Redis on
#   a       127.0.0.1:16379  127.0.0.1:18080  b 16392, c 16393
#   b       127.0.0.1:26379  127.0.0.1:28080  a 26391, c 26393
#   c       127.0.0.1:36379  127.0.0.1:38080  a 36391, b 36392
#
# In region X, port X639Y (Y = 1, 2, 3 for a, b, c) is wan-dev's link from X
# to Y's Redis; wan-dev's control endpoint is 127.0.0.1:16400.
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RUN_DIR="${RW_REGIONS_RUN_DIR:-$ROOT/run/regions}"
PID_DIR="$RUN_DIR/pids"
LOG_DIR="$RUN_DIR/logs"
STOP_HINT="make regions-down"

REGIONS=(a b c)
HOME_REGION=a
# One-way delays in ms between two regions (either order).
declare -A WAN_DELAY_MS=([a-b]=15 [a-c]=40 [b-c]=75)
WAN_CONTROL="127.0.0.1:${RW_WAN_CONTROL_PORT:-16400}"

# Start order; regions-down.sh stops in reverse (limiters, links, Redis).
COMPONENTS=(redis-a redis-b redis-c wan-dev limiter-a limiter-b limiter-c)

# region_index R: 1 for a, 2 for b, 3 for c.
region_index() { case "$1" in a) echo 1 ;; b) echo 2 ;; c) echo 3 ;; *) return 1 ;; esac; }
redis_port() { echo "$(region_index "$1")6379"; }
limiter_port() { echo "$(region_index "$1")8080"; }
# link_port FROM TO: where region FROM reaches TO's Redis.
link_port() { echo "$(region_index "$1")639$(region_index "$2")"; }
# delay_ms R1 R2: the one-way delay between two regions.
delay_ms() {
  local k="$1-$2"
  [[ "$1" > "$2" ]] && k="$2-$1"
  echo "${WAN_DELAY_MS[$k]}"
}

# wan LINK-VERB REGION: POST /cut or /heal?region=REGION to wan-dev.
wan() {
  curl -fsS -m 5 -X POST "http://$WAN_CONTROL/$1?region=$2" -o /dev/null
}
