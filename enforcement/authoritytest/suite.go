// Package authoritytest is one contract suite that every enforcement.Authority
// must pass: the in-process authority and the Redis script are held to the
// same behaviour by running the same test body against each.
package authoritytest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// Run runs the suite against a. Every subtest uses keys of its own, so the
// suite stays isolated on a shared server without flushing it.
func Run(t *testing.T, a enforcement.Authority) {
	var n atomic.Int64
	key := func() string { return fmt.Sprintf("suite-%d-%d", time.Now().UnixNano(), n.Add(1)) }
	ctx := context.Background()
	take := func(t *testing.T, k string, lim enforcement.Limit, cost int64) enforcement.Verdict {
		t.Helper()
		v, err := a.Take(ctx, k, "s", lim, cost)
		if err != nil {
			t.Fatalf("Take(%s, cost %d): %v", k, cost, err)
		}
		return v
	}

	t.Run("NewKeyStartsFull", func(t *testing.T) {
		v := take(t, key(), enforcement.Limit{Rate: 1, Burst: 10}, 1)
		if !v.Allowed || v.Remaining != 9 || v.RetryAfter != 0 {
			t.Fatalf("first request: %+v, want allowed with 9 remaining", v)
		}
	})

	// Rates here are slow (a token an hour, a day) wherever a count must be
	// exact: however long the machine takes between two calls, the bucket
	// cannot refill a whole token meanwhile. Where a time is checked, its
	// bounds come from the wall time measured around the calls, never from
	// an assumption about how fast the machine is.

	t.Run("WeightedCostAndExhaustion", func(t *testing.T) {
		k, lim := key(), enforcement.Limit{Rate: 1.0 / 3600, Burst: 10} // one token an hour
		start := time.Now()
		if v := take(t, k, lim, 7); !v.Allowed || v.Remaining != 3 {
			t.Fatalf("cost 7: %+v", v)
		}
		v := take(t, k, lim, 5)
		took := time.Since(start) // at least the time between the two decisions
		if v.Allowed {
			t.Fatalf("cost 5 with 3 left was allowed: %+v", v)
		}
		if v.Remaining != 3 {
			t.Fatalf("a rejection must spend nothing: remaining %d", v.Remaining)
		}
		// The deficit is 2 tokens less what refilled between the decisions
		// (at most took): 2 h, never more, and less by at most took.
		if want := 2 * time.Hour; v.RetryAfter > want || v.RetryAfter < want-took-time.Millisecond {
			t.Fatalf("retryAfter = %v, want the 2-token deficit at 1/h: within [%v, %v] (the calls took %v)", v.RetryAfter, want-took, want, took)
		}
	})

	t.Run("CostZeroSpendsNothing", func(t *testing.T) {
		k, lim := key(), enforcement.Limit{Rate: 1.0 / 86400, Burst: 3} // one token a day
		if v := take(t, k, lim, 2); !v.Allowed || v.Remaining != 1 {
			t.Fatalf("cost 2: %+v, want allowed, 1 remaining", v)
		}
		if v := take(t, k, lim, 0); !v.Allowed || v.Remaining != 1 || v.RetryAfter != 0 {
			t.Fatalf("cost 0: %+v, want allowed, 1 remaining (nothing spent)", v)
		}
		take(t, k, lim, 1)
		if v := take(t, k, lim, 0); !v.Allowed || v.Remaining != 0 || v.RetryAfter != 0 {
			t.Fatalf("cost 0 on an empty bucket: %+v, want allowed, 0 remaining", v)
		}
	})

	// The advertised retry time is neither early (a third of it in, the
	// request is still rejected) nor late (at it, the request is allowed).
	// The first is only conclusive when the machine did not pause long
	// enough for the bucket to refill legitimately in between; such an
	// attempt is measured, logged and repeated on a fresh key at half the
	// rate (twice the time for the same tokens), never counted as a failure.
	t.Run("RetryAfterIsHonest", func(t *testing.T) {
		for _, cost := range []int64{1, 4} {
			rate := 4.0 // tokens per second: cost/rate is 250 ms or 1 s at first
			for attempt := 1; ; attempt++ {
				if retryAfterHonest(t, take, key(), rate, cost) {
					break
				}
				if attempt == 6 {
					t.Fatalf("cost %d: every attempt was inconclusive (the machine paused longer than the refill time each time, last at rate %v/s)", cost, rate)
				}
				rate /= 2
			}
		}
	})

	t.Run("ResetAfterIsTimeToFull", func(t *testing.T) {
		k, lim := key(), enforcement.Limit{Rate: 10, Burst: 10}
		v := take(t, k, lim, 5)
		if v.ResetAfter < 490*time.Millisecond || v.ResetAfter > 500*time.Millisecond {
			t.Fatalf("resetAfter = %v, want 500ms", v.ResetAfter)
		}
	})

	t.Run("Quota", func(t *testing.T) {
		k := key()
		lim := enforcement.Limit{Rate: 1e-3, Burst: 1000, QuotaLimit: 5, QuotaPeriod: enforcement.PeriodDay, QuotaID: "tier:test"}
		if v := take(t, k, lim, 3); !v.Allowed || v.QuotaUsed != 3 {
			t.Fatalf("within quota: %+v", v)
		}
		before := time.Now()
		v := take(t, k, lim, 3)
		after := time.Now()
		if v.Allowed {
			t.Fatalf("over quota allowed: %+v", v)
		}
		// The authority decided between before and after: the wait is until
		// the window's end from then (rounded up to the millisecond).
		_, end := enforcement.PeriodDay.Window(before)
		if _, end2 := enforcement.PeriodDay.Window(after); end2 != end {
			t.Skipf("the quota window ended during the call (%v); the counter started again", end)
		}
		if lo, hi := end.Sub(after), end.Sub(before)+time.Millisecond; v.RetryAfter < lo || v.RetryAfter > hi {
			t.Fatalf("quota retryAfter = %v, want the window end (%v) from the time of the decision: within [%v, %v]", v.RetryAfter, end, lo, hi)
		}
		if v.Remaining != 997 {
			t.Fatalf("a quota rejection must not spend bucket tokens: remaining %d", v.Remaining)
		}
		// Another scope of the same key shares the quota (same QuotaID).
		v2, err := a.Take(ctx, k, "other", lim, 2)
		if err != nil || !v2.Allowed || v2.QuotaUsed != 5 {
			t.Fatalf("second scope, same quota: %+v %v", v2, err)
		}
	})

	t.Run("SoftLimitWarning", func(t *testing.T) {
		k, lim := key(), enforcement.Limit{Rate: 1e-7, Burst: 10, SoftLimitPercent: 80}
		if v := take(t, k, lim, 7); v.Warning {
			t.Fatalf("70%% used warned: %+v", v)
		}
		if v := take(t, k, lim, 2); !v.Warning {
			t.Fatalf("90%% used did not warn: %+v", v)
		}
	})
}

// retryAfterHonest runs one attempt of RetryAfterIsHonest on key k at rate
// tokens per second (burst 4) for cost. It fails t when the authority is
// wrong, and returns false when the attempt was inconclusive: the time
// measured around the calls was long enough for the bucket to refill
// legitimately where the check expects it empty.
func retryAfterHonest(t *testing.T, take func(*testing.T, string, enforcement.Limit, int64) enforcement.Verdict, k string, rate float64, cost int64) bool {
	t.Helper()
	lim := enforcement.Limit{Rate: rate, Burst: 4}
	refill := time.Duration(float64(cost) / rate * float64(time.Second)) // for cost tokens from empty
	start := time.Now()
	take(t, k, lim, 4)
	v := take(t, k, lim, cost)
	answered := time.Now()
	took := answered.Sub(start) // at least the time between the two decisions
	if v.Allowed {
		if took >= refill {
			t.Logf("cost %d at %v/s: inconclusive, the calls took %v, enough to refill %d token(s) (%v); again, slower", cost, rate, took, cost, refill)
			return false
		}
		t.Fatalf("cost %d on an empty bucket allowed %v after it was emptied (refill needs %v)", cost, took, refill)
	}
	// The deficit is cost tokens less what refilled between the decisions.
	if v.RetryAfter > refill || v.RetryAfter < refill-took-time.Millisecond {
		t.Fatalf("cost %d at %v/s: retryAfter %v, want within [%v, %v] (the calls took %v)", cost, rate, v.RetryAfter, refill-took, refill, took)
	}
	time.Sleep(v.RetryAfter / 3) // clearly earlier: still rejected
	early := take(t, k, lim, cost)
	if early.Allowed {
		// The tokens are there only if the decision came RetryAfter or more
		// after the rejected one, which happened after start.
		if since := time.Since(start); since >= v.RetryAfter {
			t.Logf("cost %d at %v/s: inconclusive, the early request was decided up to %v after the rejection (advertised %v); again, slower", cost, rate, since, v.RetryAfter)
			return false
		}
		t.Fatalf("cost %d allowed at a third of the advertised %v", cost, v.RetryAfter)
	}
	// The rejection was decided before answered: at answered + RetryAfter
	// the tokens are there, however late this call is.
	time.Sleep(time.Until(answered.Add(v.RetryAfter)))
	if at := take(t, k, lim, cost); !at.Allowed {
		t.Fatalf("cost %d rejected at the advertised retry time %v: %+v", cost, v.RetryAfter, at)
	}
	return true
}
