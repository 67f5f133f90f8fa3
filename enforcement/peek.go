package enforcement

import (
	"context"
	"errors"
	"fmt"
)

// Peeker answers what Authority.Take would answer for cost on (key, scope)
// now, spending nothing and writing nothing: the question of an engineer
// (or a client) who wants to know where a key stands without moving it.
// Implementations are safe for concurrent use; redisstore.Shared and
// MemoryAuthority are two.
type Peeker interface {
	Peek(ctx context.Context, key, scope string, lim Limit, cost int64) (Verdict, error)
}

// Errors of Peek a caller branches on.
var (
	// ErrPeekUnsupported: the store that decides the request's limit
	// cannot answer without spending (no Peeker configured for it).
	ErrPeekUnsupported = errors.New("enforcement: peek is not supported for this limit")
	// ErrPeekUnavailable: the shared store could not be asked. A peek is a
	// question about the store, so it has no degraded answer.
	ErrPeekUnavailable = errors.New("enforcement: peek: the shared store could not be asked")
)

var _ Peeker = (*MemoryAuthority)(nil)

// Peek answers req as Check would — the rule, the bucket and the quota
// after a request of req's cost, the retry time of a rejection — without
// spending: nothing is written to the store, the local tier is neither
// charged nor taught, and no decision reaches the Recorder or the
// Observer (a peek is not a request). It always asks the shared store
// (Source shared), whose word is the truth the local tier only
// approximates; when the store cannot be asked it returns
// ErrPeekUnavailable rather than guess. req.Reserve is ignored.
func (l *Limiter) Peek(ctx context.Context, req Request) (Decision, error) {
	if req.Key == "" || req.Scope == "" || (req.HasCost && req.Cost < 0) {
		return Decision{}, fmt.Errorf("%w: key and scope are required and cost must be ≥ 0", ErrInvalidRequest)
	}
	box := l.policy.Load()
	share, err := box.shares.Of(req.Priority)
	if err != nil {
		return Decision{}, err
	}
	res, err := box.p.Resolve(req.Key, req.Scope, req.Tier)
	if err != nil {
		return Decision{}, err
	}
	if share < 1 {
		res.Share = share // answered for the request's class: its floor held back
	}
	cost := res.Cost
	if req.HasCost {
		cost = req.Cost
	}
	if capacity := res.Capacity(); cost > capacity {
		return Decision{}, fmt.Errorf("%w: cost %d, capacity %d", ErrCostExceedsLimit, cost, capacity)
	}
	var d Decision
	describeRule(&d, &res, cost)
	p := l.peeker(res.Global && l.cfg.Global != nil)
	if p == nil {
		return Decision{}, ErrPeekUnsupported
	}
	v, err := p.Peek(ctx, req.Key, req.Scope, res.Limit, cost)
	if err != nil {
		if ctx.Err() != nil {
			return Decision{}, fmt.Errorf("enforcement: peek abandoned by the caller: %w", ctx.Err())
		}
		return Decision{}, fmt.Errorf("%w: %w", ErrPeekUnavailable, err)
	}
	d.Source = SourceShared
	if v.Regional {
		d.Source = SourceRegional
	}
	d.DecidedUS = v.Now.UnixMicro()
	takeVerdict(&d, &res.Limit, &v)
	applyDryRun(&d)
	return d, nil
}

// peeker is what answers a peek of a limit the global authority decides
// (global) or the shared one.
func (l *Limiter) peeker(global bool) Peeker {
	if global {
		p, _ := l.cfg.Global.(Peeker)
		return p
	}
	if l.cfg.Peeker != nil {
		return l.cfg.Peeker
	}
	p, _ := l.cfg.Authority.(Peeker)
	return p
}

// Peek implements Peeker: Take on copies of the bucket and the quota
// window, so that nothing held changes (a key never seen is not added).
func (m *MemoryAuthority) Peek(_ context.Context, key, scope string, lim Limit, cost int64) (Verdict, error) {
	now := m.now()
	var b Bucket
	if got, ok := m.buckets.lookup(bucketID{key, scope}); ok {
		got.mu.Lock() // lock order: bucket, then quota
		defer got.mu.Unlock()
		b = got.bucket
	}
	var q *memQuota
	if lim.HasQuota() {
		q = &memQuota{limit: lim.QuotaLimit}
		if got, ok := m.quotas.lookup(bucketID{key, lim.QuotaID}); ok {
			got.mu.Lock()
			q.window, q.end, q.used = got.window, got.end, got.used
			got.mu.Unlock()
		}
	}
	return memDecide(now, &b, q, lim, cost), nil
}

// Peek implements Peeker on the limit's store.
func (s *Stores) Peek(ctx context.Context, key, scope string, lim Limit, cost int64) (Verdict, error) {
	st, err := s.of(lim.Store)
	if err != nil {
		return Verdict{}, err
	}
	p, ok := st.(Peeker)
	if !ok {
		return Verdict{}, ErrPeekUnsupported
	}
	return p.Peek(ctx, key, scope, lim, cost)
}
