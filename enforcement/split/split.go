// Package split is key splitting for hot keys (design study, section 6.3):
// an enforcement.Authority decorator that spreads the bucket of a limit with
// Split = N > 1 over N sub-keys "key#0" … "key#N-1", each holding 1/N of
// the rate and of the burst, and sends every decision to one of them chosen
// at random. The sub-keys carry different hash tags, so in Redis Cluster
// the load of one key spreads over N slots (and, usually, shards).
//
// # Early rejection (lumpiness)
//
// The aggregate stays roughly right, but with random assignment one
// sub-bucket can run dry while the others still have tokens, and the
// request that lands on it is rejected although the key as a whole is under
// its limit. From a full bucket of burst B split N ways, a burst of
// requests sees its first rejection after noticeably fewer than B requests,
// and admits fewer than B in total before the sub-buckets refill; both
// worsen as N grows (TestLumpiness measures them; BENCHMARKS.md has the
// figures). Each sub-bucket's capacity is floor(B/N): a request costing
// more than that can never be allowed on a split key, so a policy must keep
// burst/split at least the largest cost (such a request is answered with a
// rejection whose RetryAfter is the sub-bucket's time to full, and the
// Authority counts it in Oversized).
//
// What the caller sees is scaled back to the whole key: Remaining is the
// sub-bucket's × N and the times are the sub-bucket's (a sub-bucket refills
// 1/N of the tokens at 1/N of the rate, so its times equal the aggregate's).
package split

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"

	"github.com/ratewarden/ratewarden/enforcement"
)

// Authority is an enforcement.Authority that splits limits with Split > 1
// and passes the rest to next unchanged. It is safe for concurrent use.
type Authority struct {
	next      enforcement.Authority
	pick      func(n int) int
	oversized atomic.Int64
}

var _ enforcement.Authority = (*Authority)(nil)

// New wraps next. pick chooses a sub-key in [0, n); nil = uniformly at random.
func New(next enforcement.Authority, pick func(n int) int) *Authority {
	if pick == nil {
		pick = rand.IntN
	}
	return &Authority{next: next, pick: pick}
}

// SubKey is the rate-limit key of sub-bucket i of key.
func SubKey(key string, i int) string { return key + "#" + strconv.Itoa(i) }

// SubLimit is the limit each of the Split sub-buckets of lim enforces.
func SubLimit(lim enforcement.Limit) enforcement.Limit {
	n := lim.Split
	sub := lim
	sub.Split = 0
	sub.Rate = lim.Rate / float64(n)
	sub.Burst = max(1, lim.Burst/int64(n))
	return sub
}

// Oversized counts decisions whose cost exceeded a sub-bucket's capacity.
func (a *Authority) Oversized() int64 { return a.oversized.Load() }

// Take implements enforcement.Authority.
func (a *Authority) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	n := lim.Split
	if n <= 1 {
		return a.next.Take(ctx, key, scope, lim, cost)
	}
	sub := SubLimit(lim)
	i := a.pick(n)
	if cost > sub.Burst {
		a.oversized.Add(1)
		// Never allowed on this key: ask for nothing to learn the sub-bucket's state.
		v, err := a.next.Take(ctx, SubKey(key, i), scope, sub, 0)
		if err != nil {
			return v, err
		}
		v.Allowed = false
		v.RetryAfter = max(v.ResetAfter, 1)
		return scale(v, n, lim), nil
	}
	v, err := a.next.Take(ctx, SubKey(key, i), scope, sub, cost)
	if err != nil {
		return v, err
	}
	return scale(v, n, lim), nil
}

func scale(v enforcement.Verdict, n int, lim enforcement.Limit) enforcement.Verdict {
	v.Remaining = min(lim.Burst, v.Remaining*int64(n))
	return v
}
