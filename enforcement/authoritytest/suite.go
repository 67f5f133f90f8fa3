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

	t.Run("WeightedCostAndExhaustion", func(t *testing.T) {
		k, lim := key(), enforcement.Limit{Rate: 1, Burst: 10}
		if v := take(t, k, lim, 7); !v.Allowed || v.Remaining != 3 {
			t.Fatalf("cost 7: %+v", v)
		}
		v := take(t, k, lim, 5)
		if v.Allowed {
			t.Fatalf("cost 5 with 3 left was allowed: %+v", v)
		}
		// deficit ≈ 2 tokens at 1/s: about 2 s, never less than the deficit needs.
		if v.RetryAfter < 1900*time.Millisecond || v.RetryAfter > 2000*time.Millisecond {
			t.Fatalf("retryAfter = %v, want about 2s", v.RetryAfter)
		}
		if v.Remaining != 3 {
			t.Fatalf("a rejection must spend nothing: remaining %d", v.Remaining)
		}
	})

	t.Run("CostZeroSpendsNothing", func(t *testing.T) {
		k, lim := key(), enforcement.Limit{Rate: 1, Burst: 3}
		take(t, k, lim, 3)
		v := take(t, k, lim, 0)
		if !v.Allowed || v.Remaining != 0 {
			t.Fatalf("cost 0 on an empty bucket: %+v, want allowed, 0 remaining", v)
		}
	})

	t.Run("RetryAfterIsHonest", func(t *testing.T) {
		for _, cost := range []int64{1, 4} {
			k, lim := key(), enforcement.Limit{Rate: 20, Burst: 4}
			take(t, k, lim, 4)
			v := take(t, k, lim, cost)
			answered := time.Now()
			if v.Allowed {
				t.Fatalf("cost %d on an empty bucket allowed", cost)
			}
			if want := time.Duration(cost) * 50 * time.Millisecond; v.RetryAfter > want || v.RetryAfter < want-5*time.Millisecond {
				t.Fatalf("cost %d: retryAfter %v, want about %v", cost, v.RetryAfter, want)
			}
			time.Sleep(v.RetryAfter / 3) // clearly earlier: still rejected
			if early := take(t, k, lim, cost); early.Allowed {
				t.Fatalf("cost %d allowed at a third of the advertised %v", cost, v.RetryAfter)
			}
			time.Sleep(time.Until(answered.Add(v.RetryAfter))) // at the advertised time: allowed
			if at := take(t, k, lim, cost); !at.Allowed {
				t.Fatalf("cost %d rejected at the advertised retry time %v: %+v", cost, v.RetryAfter, at)
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
		v := take(t, k, lim, 3)
		if v.Allowed {
			t.Fatalf("over quota allowed: %+v", v)
		}
		_, end := enforcement.PeriodDay.Window(time.Now())
		if want := time.Until(end); v.RetryAfter < want-2*time.Second || v.RetryAfter > want+time.Second {
			t.Fatalf("quota retryAfter = %v, want the window end (%v)", v.RetryAfter, want)
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
