package split

import (
	"context"

	"github.com/ratewarden/ratewarden/enforcement"
)

var _ enforcement.Peeker = (*Authority)(nil)

// Peek implements enforcement.Peeker when next does (else every peek is
// enforcement.ErrPeekUnsupported). A limit that is not split is next's
// peek. A split one is answered for the key as a whole, from every
// sub-bucket read without spending: allowed when at least one sub-bucket
// would allow the cost (a request lands on one at random), Remaining the
// sum of the sub-buckets', and a rejection's retry time the soonest any
// sub-bucket has the tokens.
func (a *Authority) Peek(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	p, ok := a.next.(enforcement.Peeker)
	if !ok {
		return enforcement.Verdict{}, enforcement.ErrPeekUnsupported
	}
	n := lim.Split
	if n <= 1 {
		return p.Peek(ctx, key, scope, lim, cost)
	}
	sub := SubLimit(lim)
	var out enforcement.Verdict
	for i := range n {
		c := min(cost, sub.Burst) // an oversized cost is never allowed; its state still counts
		v, err := p.Peek(ctx, SubKey(key, i), scope, sub, c)
		if err != nil {
			return enforcement.Verdict{}, err
		}
		if cost > sub.Burst {
			v.Allowed, v.RetryAfter = false, max(v.ResetAfter, 1)
		}
		if i == 0 {
			out = v
			out.Remaining = 0
		}
		out.Remaining += v.Remaining
		out.ResetAfter = max(out.ResetAfter, v.ResetAfter)
		out.Warning = out.Warning || v.Warning
		out.QuotaUsed = max(out.QuotaUsed, v.QuotaUsed)
		switch {
		case v.Allowed && !out.Allowed:
			out.Allowed, out.RetryAfter = true, 0
		case !v.Allowed && !out.Allowed && i > 0:
			out.RetryAfter = min(out.RetryAfter, v.RetryAfter)
		}
	}
	out.Remaining = min(lim.Burst, out.Remaining)
	return out, nil
}
