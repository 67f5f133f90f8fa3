package enforcement

import (
	"context"
	"sync"
	"time"
)

var _ Reserver = (*MemoryAuthority)(nil)

// memReservations is single-node mode's reservation records: one
// instance, so one map is what every settle sees.
type memReservations struct {
	mu  sync.Mutex
	max int // records kept at most (0 = no bound)
	m   map[string]memReservation
}

type memReservation struct {
	estimate    int64
	expires     time.Time
	settled     bool
	quotaWindow int64 // unix seconds of the quota window the estimate counted in (0: none)
}

// Reserve implements Reserver: Take, and a record of id for ttl when
// allowed. At the record bound (the authority's maxKeys) expired records
// are forgotten first; when none is, the decision stands without a record
// and its settle is "not found": the estimate stands, as on expiry.
func (m *MemoryAuthority) Reserve(ctx context.Context, key, scope string, lim Limit, cost int64, id string, ttl time.Duration) (Verdict, error) {
	v, err := m.Take(ctx, key, scope, lim, cost)
	if err != nil || !v.Allowed {
		return v, err
	}
	rec := memReservation{estimate: cost, expires: v.Now.Add(ttl)}
	if lim.HasQuota() {
		start, _ := lim.QuotaPeriod.Window(v.Now)
		rec.quotaWindow = start.Unix()
	}
	r := &m.resv
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[string]memReservation)
	}
	if r.max > 0 && len(r.m) >= r.max {
		r.sweep(v.Now)
	}
	if r.max == 0 || len(r.m) < r.max {
		r.m[id] = rec
	}
	return v, nil
}

// Settle implements Reserver.
func (m *MemoryAuthority) Settle(_ context.Context, key, scope, id string, lim Limit, cost int64, unrecorded bool, ttl time.Duration) (Settlement, error) {
	now := m.now()
	r := &m.resv
	r.mu.Lock()
	rec, ok := r.m[id]
	if ok && !now.Before(rec.expires) {
		delete(r.m, id)
		ok = false
	}
	switch {
	case ok && rec.settled:
		r.mu.Unlock()
		return Settlement{}, ErrAlreadySettled
	case !ok && !unrecorded:
		r.mu.Unlock()
		return Settlement{}, ErrReservationNotFound
	case !ok:
		rec = memReservation{} // nothing was spent here: charge the whole cost
	}
	if r.m == nil {
		r.m = make(map[string]memReservation)
	}
	r.m[id] = memReservation{settled: true, expires: now.Add(ttl)}
	r.mu.Unlock()

	b, _ := m.buckets.get(bucketID{key, scope}, now.UnixMicro(), nil)
	b.mu.Lock() // lock order: bucket, then quota
	defer b.mu.Unlock()
	b.rate, b.burst = lim.Rate, lim.Burst
	tokens, resetUS := b.bucket.Charge(now.UnixMicro(), lim.Rate, lim.Burst, cost-rec.estimate)
	s := settlementOf(rec.estimate, cost, tokens, resetUS, lim.Rate, now)
	if lim.HasQuota() {
		q, _ := m.quotas.get(bucketID{key, lim.QuotaID}, now.Unix(), nil)
		q.mu.Lock()
		defer q.mu.Unlock()
		q.limit = lim.QuotaLimit
		start, end := lim.QuotaPeriod.Window(now)
		if q.window != start.Unix() {
			q.window, q.end, q.used = start.Unix(), end.Unix(), 0
		}
		// The difference belongs to the window the estimate counted in.
		// When that is this one, it applies here; when it is an earlier
		// one, this window is charged nothing (the earlier window's count
		// is gone from this process, and it decides nothing any more). A
		// settle with no record charges the whole cost here.
		switch rec.quotaWindow {
		case q.window:
			q.used += cost - rec.estimate
		case 0:
			q.used += cost
		}
		s.QuotaUsed = q.used
	}
	return s, nil
}

// settlementOf is the numbers of a settlement that left tokens in a
// bucket refilling at rate, full again resetUS µs after now.
func settlementOf(estimate, cost int64, tokens float64, resetUS int64, rate float64, now time.Time) Settlement {
	s := Settlement{
		Estimate: estimate, Charged: cost, Refunded: max(0, estimate-cost),
		Remaining: wholeTokens(tokens), Debt: debtOf(tokens),
		ResetAt: now.Add(time.Duration(resetUS) * time.Microsecond), Now: now,
	}
	if tokens+epsilon < 1 {
		s.RetryAfter = time.Duration(ceilMS(ceilUS((1-tokens)/rate))) * time.Millisecond
	}
	return s
}

// sweep forgets expired records. Called under r.mu.
func (r *memReservations) sweep(now time.Time) int {
	n := 0
	for id, rec := range r.m {
		if !now.Before(rec.expires) {
			delete(r.m, id)
			n++
		}
	}
	return n
}

// Reservations is the number of reservation records held (unsettled, and
// settled ones kept to answer a second settle).
func (m *MemoryAuthority) Reservations() int {
	m.resv.mu.Lock()
	defer m.resv.mu.Unlock()
	return len(m.resv.m)
}
