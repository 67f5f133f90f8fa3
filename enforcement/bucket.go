package enforcement

import "math"

// epsilon absorbs floating-point residue so that waiting exactly the
// advertised retry time always finds the tokens there.
const epsilon = 1e-9

// Bucket is the state of one token bucket: the tokens left and the time (µs)
// they were counted at. The zero value is "never seen", which starts full.
// A Bucket is not safe for concurrent use; its owner serialises access.
//
// The arithmetic here is the same as redisstore's state.lua, which every
// script that touches a bucket shares; redisstore's agree_test.go drives
// both through the same random sequences on a real redis-server.
type Bucket struct {
	Tokens float64
	TS     int64 // µs on the caller's clock; 0 = never seen
}

// TakeResult is what one Take decided.
type TakeResult struct {
	Allowed      bool
	Tokens       float64 // tokens left after the decision (fractional)
	RetryAfterUS int64   // 0 when allowed; else µs until cost tokens are there
	ResetAfterUS int64   // µs until the bucket is full again
	ClockBack    bool    // now was earlier than the last update (elapsed clamped to 0)
	// Shed: refused only by the floor (TakeFloor): cost tokens were there.
	Shed bool
}

// Take refills the bucket lazily up to now (µs) at rate tokens per second,
// capped at burst, and spends cost tokens if they are all there. Elapsed
// time is clamped at ≥ 0, so a clock that steps backwards never removes
// tokens. Cost 0 is always allowed and spends nothing.
func (b *Bucket) Take(now int64, rate float64, burst int64, cost int64) TakeResult {
	return b.TakeFloor(now, rate, burst, cost, 0)
}

// TakeFloor is Take for a request that must leave floor tokens in the
// bucket (Limit.Floor, its priority class's reserve for higher classes):
// it spends cost only if cost + floor tokens are there. Refused while cost
// tokens are there, the result is Shed, and RetryAfterUS is the time until
// cost + floor (at most burst) tokens are. decide.lua decides alike.
func (b *Bucket) TakeFloor(now int64, rate float64, burst int64, cost int64, floor float64) TakeResult {
	capacity := float64(burst)
	tokens := capacity
	var back bool
	if b.TS != 0 {
		elapsed := now - b.TS
		if elapsed < 0 {
			back, elapsed = true, 0
			now = b.TS
		}
		tokens = min(capacity, b.Tokens+float64(elapsed)*rate/1e6) // builtin: inlined, same NaN and ±0 rules as math.Min
	}
	r := TakeResult{ClockBack: back}
	c := float64(cost)
	if tokens+epsilon >= c+floor {
		r.Allowed = true
		tokens = max(0, tokens-c)
	} else {
		r.Shed = tokens+epsilon >= c
		need := c + floor
		if need > capacity {
			need = max(capacity, c) // a class whose share cannot hold cost waits for a full bucket
		}
		r.RetryAfterUS = ceilUS((need - tokens) / rate)
	}
	b.Tokens, b.TS = tokens, now
	r.Tokens = tokens
	r.ResetAfterUS = ceilUS((capacity - tokens) / rate)
	return r
}

// refilled is the bucket's tokens at now, spending nothing; a bucket never
// seen must not be asked. A now before TS (a clock that stepped back)
// counts as no time passed, as in Take.
func (b *Bucket) refilled(now int64, rate float64, burst int64) float64 {
	return min(float64(burst), b.Tokens+float64(max(0, now-b.TS))*rate/1e6)
}

// Full reports whether the bucket would be full at now: an idle entry that
// can be forgotten, because a forgotten bucket restarts full anyway.
func (b *Bucket) Full(now int64, rate float64, burst int64) bool {
	if b.TS == 0 {
		return true
	}
	return b.Tokens+float64(now-b.TS)*rate/1e6+epsilon >= float64(burst)
}

// maxWaitUS caps every wait (2⁵³ µs, 285 years): a deep debt on a slow
// bucket could take longer to pay off than a time.Duration holds, and a
// float beyond int64 converts to garbage. state.lua's wait_ms caps alike.
const maxWaitUS = 1 << 53

// ceilUS converts seconds to whole microseconds, rounding up, at most
// maxWaitUS.
func ceilUS(seconds float64) int64 {
	if seconds <= 0 {
		return 0
	}
	// math.Ceil without its call (it is not inlined on amd64 v1): truncate,
	// then round up what was cut off. Same result for every x below 2⁶³.
	x := seconds*1e6 - epsilon
	if x >= maxWaitUS {
		return maxWaitUS
	}
	i := int64(x)
	if float64(i) < x {
		i++
	}
	return i
}

// wholeTokens is the contract's "remaining": whole tokens, rounded down.
func wholeTokens(tokens float64) int64 {
	return int64(math.Floor(tokens + epsilon))
}

// ceilMS rounds microseconds up to whole milliseconds: retryAfterMs is
// never earlier than the truth.
func ceilMS(us int64) int64 {
	return (us + 999) / 1000
}
