package enforcement

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrBreakerOpen is satisfied (errors.Is) by an Authority's error when a
// circuit breaker refused the call without asking the store: the store
// failed LIMITER_BREAKER_FAILURES times in a row, and the breaker stays
// open for LIMITER_BREAKER_OPEN_FOR. Every breaker of the limiter says so
// alike, so that one test can check each one's settings.
var ErrBreakerOpen = errors.New("breaker open")

// Authority is the shared tier: the one place whose answer makes every
// replica agree. Take must read, decide and write atomically. A rejection is a
// Verdict; an error means "could not decide", which is what the failure
// policy acts on.
type Authority interface {
	Take(ctx context.Context, key, scope string, lim Limit, cost int64) (Verdict, error)
}

// Verdict is an authority's answer.
type Verdict struct {
	Allowed bool
	// Shed: refused only because spending would take the bucket below the
	// floor of the request's priority class (Limit.Floor); the cost was
	// there. RetryAfter is then the time until floor + cost is there.
	Shed       bool
	Remaining  int64         // whole tokens left in the bucket
	RetryAfter time.Duration // 0 when allowed; the later of the bucket's and the quota's wait
	ResetAfter time.Duration // until the bucket is full again
	Now        time.Time     // the authority's clock when it decided
	Warning    bool          // bucket or quota consumption reached the soft limit
	QuotaUsed  int64         // tokens spent in the current quota window (0 without quota)
	ClockBack  bool          // the authority's clock was behind the bucket's last update
	// InProcess: decided in this process with no network work (spent from
	// tokens leased earlier); the decision's source is local, not shared.
	InProcess bool
	// Regional: a global limit decided on the region's escrow share while
	// its global budget could not be reached (SourceRegional).
	Regional bool
}

// MemoryAuthority is the in-process authority of single-node mode: the same
// semantics as the Redis script, correct for one limiter instance only. It is
// safe for concurrent use. The zero value is not usable; use NewMemoryAuthority.
type MemoryAuthority struct {
	now     func() time.Time
	buckets *table[memBucket]
	quotas  *table[memQuota]
	resv    memReservations // reserve_memory.go
}

type memBucket struct {
	mu     sync.Mutex
	bucket Bucket
	rate   float64
	burst  int64
}

type memQuota struct {
	mu     sync.Mutex
	window int64 // unix seconds of the window start
	end    int64 // unix seconds of the window end
	used   int64
	limit  int64 // the QuotaLimit of the last Take
}

// NewMemoryAuthority returns an in-process authority reading time from now
// (time.Now when nil) and holding at most maxKeys buckets (and as many
// quota windows). At the bound it forgets full buckets and ended windows
// first, the oldest first, and never an empty bucket or a spent quota: a
// new key is then decided without being kept. The bound holds per shard
// (a 64th of it each, at least one key), so a small bound can forget a key
// long before maxKeys are held: tests that must keep every key give room.
func NewMemoryAuthority(now func() time.Time, maxKeys int) *MemoryAuthority {
	return NewMemoryAuthorityBytes(now, maxKeys, 0)
}

// NewMemoryAuthorityBytes is NewMemoryAuthority also bounded in heap:
// maxBytes in all (0 = no bound in bytes), two thirds for buckets and one
// third for quota windows, counted as Config.MaxBytes counts the local
// tier's.
func NewMemoryAuthorityBytes(now func() time.Time, maxKeys int, maxBytes int64) *MemoryAuthority {
	if now == nil {
		now = time.Now
	}
	return &MemoryAuthority{
		now:     now,
		buckets: newTable(tableConfig[memBucket]{maxEntries: maxKeys, maxBytes: maxBytes / 3 * 2, rank: rankMemBucket}),
		quotas:  newTable(tableConfig[memQuota]{maxEntries: maxKeys, maxBytes: maxBytes / 3, rank: rankMemQuota}),
		resv:    memReservations{max: maxKeys},
	}
}

// rankMemBucket ranks a bucket for eviction at now (µs): full ones first,
// then partly spent ones, the oldest first; an empty one never.
func rankMemBucket(b *memBucket, now int64) (uint64, bool) {
	if !b.mu.TryLock() {
		return 0, false
	}
	defer b.mu.Unlock()
	if b.bucket.TS == 0 || b.bucket.Full(now, b.rate, b.burst) {
		return rankFull | uint64(max(0, b.bucket.TS)), true
	}
	if b.bucket.refilled(now, b.rate, b.burst) < 1 {
		return 0, false
	}
	return rankPartial | uint64(max(0, b.bucket.TS)), true
}

// rankMemQuota ranks a quota window for eviction at now (unix seconds):
// ended ones first, then the least spent; a spent one never.
func rankMemQuota(q *memQuota, now int64) (uint64, bool) {
	if !q.mu.TryLock() {
		return 0, false
	}
	defer q.mu.Unlock()
	if now >= q.end {
		return rankFull, true
	}
	if q.used >= q.limit {
		return 0, false
	}
	return rankPartial | uint64(max(0, q.used)), true
}

// Take implements Authority.
func (m *MemoryAuthority) Take(_ context.Context, key, scope string, lim Limit, cost int64) (Verdict, error) {
	now := m.now()
	b, _ := m.buckets.get(bucketID{key, scope}, now.UnixMicro(), nil)
	b.mu.Lock() // lock order: bucket, then quota
	defer b.mu.Unlock()
	b.rate, b.burst = lim.Rate, lim.Burst

	var q *memQuota
	if lim.HasQuota() {
		q, _ = m.quotas.get(bucketID{key, lim.QuotaID}, now.Unix(), nil)
		q.mu.Lock()
		defer q.mu.Unlock()
		q.limit = lim.QuotaLimit
	}
	return memDecide(now, &b.bucket, q, lim, cost), nil
}

// memDecide is one decision on bucket b and quota window q (nil without a
// quota), both held by the caller: Take's on the stored state, Peek's on
// copies of it.
func memDecide(now time.Time, b *Bucket, q *memQuota, lim Limit, cost int64) Verdict {
	quotaOK, quotaWait := true, time.Duration(0)
	if q != nil {
		start, end := lim.QuotaPeriod.Window(now)
		if q.window != start.Unix() {
			q.window, q.end, q.used = start.Unix(), end.Unix(), 0
		}
		if q.used+cost > lim.QuotaLimit {
			quotaOK, quotaWait = false, end.Sub(now)
		}
	}

	// A quota rejection must not spend bucket tokens: spend only what both allow.
	spend, floor := cost, lim.Floor()
	if !quotaOK {
		spend, floor = 0, 0
	}
	r := b.TakeFloor(now.UnixMicro(), lim.Rate, lim.Burst, spend, floor)
	v := Verdict{Now: now, Allowed: quotaOK && r.Allowed, Shed: quotaOK && r.Shed, ClockBack: r.ClockBack}
	if !quotaOK && r.Allowed && cost > 0 {
		// Would the bucket alone have allowed cost? Ask without spending.
		probe := *b
		r.RetryAfterUS = probe.TakeFloor(now.UnixMicro(), lim.Rate, lim.Burst, cost, lim.Floor()).RetryAfterUS
	}
	if v.Allowed {
		if q != nil {
			q.used += cost
		}
	} else {
		wait := time.Duration(ceilMS(r.RetryAfterUS)) * time.Millisecond
		v.RetryAfter = max(wait, ceilDurationMS(quotaWait))
	}
	v.Remaining = wholeTokens(r.Tokens)
	v.ResetAfter = time.Duration(r.ResetAfterUS) * time.Microsecond
	if q != nil {
		v.QuotaUsed = q.used
	}
	v.Warning = lim.SoftLimitReached(r.Tokens, v.QuotaUsed)
	return v
}

// ResetQuota sets key's count of lim's quota in the window current at the
// authority's clock back to zero, as a support reset of the quota does in
// the store (`limiter key reset --quota`). Nothing when lim has no quota.
func (m *MemoryAuthority) ResetQuota(key string, lim Limit) {
	if !lim.HasQuota() {
		return
	}
	now := m.now()
	q, _ := m.quotas.get(bucketID{key, lim.QuotaID}, now.Unix(), nil)
	q.mu.Lock()
	defer q.mu.Unlock()
	start, end := lim.QuotaPeriod.Window(now)
	q.window, q.end, q.used, q.limit = start.Unix(), end.Unix(), 0, lim.QuotaLimit
}

// Sweep forgets buckets that are full at now and quota windows that have
// ended: they would restart in exactly the state they are in. It returns
// how many entries were removed.
func (m *MemoryAuthority) Sweep(now time.Time) int {
	us, sec := now.UnixMicro(), now.Unix()
	n := m.buckets.sweep(func(b *memBucket) bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.bucket.Full(us, b.rate, b.burst)
	})
	n += m.quotas.sweep(func(q *memQuota) bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return sec >= q.end
	})
	m.resv.mu.Lock()
	defer m.resv.mu.Unlock()
	return n + m.resv.sweep(now)
}

// Run sweeps every 10 s until ctx ends (Sweep at the authority's clock):
// the background work of a long-lived MemoryAuthority, such as single-node
// mode's. It returns nil when ctx ends.
func (m *MemoryAuthority) Run(ctx context.Context) error {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			m.Sweep(m.now())
		}
	}
}

// Len is the number of buckets held.
func (m *MemoryAuthority) Len() int { return m.buckets.len() }

// Bytes is the heap its buckets and quota windows hold, as the bound
// counts it.
func (m *MemoryAuthority) Bytes() int64 { return m.buckets.stats().bytes + m.quotas.stats().bytes }

func ceilDurationMS(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}
