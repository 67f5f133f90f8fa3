package global

import (
	"math"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// The refiller's arithmetic, free of Redis and of the clock, so that it
// is tested on its own (sizing_test.go).

// demandRate is the region's demand (cost asked per second) smoothed over
// window: prev moved toward the rate of asked tokens over dt, by the
// weight an exponential average of time constant window gives dt.
func demandRate(prev float64, asked int64, dt, window time.Duration) float64 {
	if dt <= 0 {
		return prev
	}
	inst := float64(max(0, asked)) / dt.Seconds()
	alpha := 1 - math.Exp(-dt.Seconds()/window.Seconds())
	return prev + alpha*(inst-prev)
}

// horizon is how far ahead of demand a pool is kept: a round trip to the
// home and two refill ticks (the tick that notices, the tick after),
// within [tick, maxHorizon].
func horizon(rtt, tick time.Duration) time.Duration {
	return min(max(rtt+2*tick, tick), maxHorizon)
}

const maxHorizon = 2 * time.Second

// poolMax is the most a region's pool of lim may hold: the global rate
// over the horizon, at least one request's largest cost seen (maxCost) so
// that any request the limit allows can be met, never more than the
// burst. It is the Σ pool_max term of the over-admission bound.
func poolMax(lim enforcement.Limit, h time.Duration, maxCost int64) int64 {
	m := int64(math.Ceil(lim.Rate * h.Seconds()))
	return min(lim.Burst, max(m, maxCost, 1))
}

// target is what the pool should hold: the region's demand over the
// horizon, capped by poolMax; 0 when there is no demand.
func target(rate float64, lim enforcement.Limit, h time.Duration, maxCost int64) int64 {
	if rate <= 0 {
		return 0
	}
	want := int64(math.Ceil(rate * h.Seconds()))
	return min(max(want, maxCost), poolMax(lim, h, maxCost))
}

// plan is what one refill tick does about one pool.
type plan struct {
	lease  int64 // lease this many from the global bucket (at most)
	giveUp int64 // take this many out of the pool and return them
}

// planFor decides a tick: lease up to the target when below it; once the
// region has asked nothing for hold, return all but floor (the largest
// cost seen: a key asked now and then finds its next request covered, and
// the refill of what it spent follows at once), and after idleHold
// everything; return what is beyond twice the target (demand fell) so
// that another region can have it. A pool in debt (tokens < 0) leases at
// least its debt, idle or not: the region owes it to the global bucket.
func planFor(tokens, tgt, floor int64, idleFor, hold time.Duration) plan {
	switch {
	case idleFor >= idleHold*hold && tokens < 0:
		return plan{lease: -tokens}
	case idleFor >= idleHold*hold:
		return plan{giveUp: max(0, tokens)}
	case idleFor >= hold && tokens > floor:
		return plan{giveUp: tokens - floor}
	case idleFor >= hold:
		return plan{lease: max(0, floor-tokens)}
	case tokens < tgt:
		return plan{lease: tgt - tokens}
	case tokens > 2*tgt && tokens-tgt > 0:
		return plan{giveUp: tokens - tgt}
	}
	return plan{}
}

// idleHold is how many holds a pool nobody asks of keeps its floor.
const idleHold = 60

// escrowOf is a region's escrow share of lim among n regions.
func escrowOf(lim enforcement.Limit, n int) (rate float64, burst int64) {
	return lim.Rate / float64(n), max(1, lim.Burst/int64(n))
}
