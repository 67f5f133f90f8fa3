package enforcement

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Design: every (key, scope) has one local entry, held in a sharded table and
// guarded by its own mutex. The entry caches the limit resolved for it (so
// resolution costs nothing on the hot path; a policy swap invalidates it by
// pointer) and three pieces of in-process state, all checked or updated
// without network work:
//
//   - shadow: what the shared store last told this instance about the bucket
//     (tokens left at a time, refilled at the true rate, plus "not before"
//     after a rejection). The shared bucket only refills at that rate and
//     other instances only take from it, so when the shadow says the tokens
//     are not there, they are not: the request is rejected locally with a
//     retry time that is never earlier than the truth. This is what keeps a
//     flood on one key from becoming one Redis call per request.
//   - local: the flood filter for what the shadow cannot know yet (a burst
//     that arrives before the first verdict, or many instances at once). It
//     is sized loosely, the resolved rate × LocalHeadroom ÷ ExpectedInstances
//     with the full burst, so well-behaved traffic never trips it.
//   - degraded: the tightened limit (rate and burst ÷ ExpectedInstances, or
//     the safety ceiling if lower) that decides while the authority cannot
//     be asked.
//
// The entry lock is never held across the authority call.

// Policy resolves the limit of a request. Implementations must be safe for
// concurrent use and immutable: a new policy is a new value given to
// Limiter.SetPolicy.
type Policy interface {
	// Resolve returns the limit for key in scope. tier is the caller's
	// tier, or empty for the policy's key-to-tier map and default tier.
	Resolve(key, scope, tier string) (Resolved, error)
}

// ErrUnknownTier is returned by a Policy for a tier it does not define.
var ErrUnknownTier = errors.New("unknown tier")

// Observer receives what the limiter does, for metrics. Implementations must
// be safe for concurrent use and cheap: they run on every decision.
type Observer interface {
	Decided(req Request, d Decision, took time.Duration)
	AuthorityFailed(err error)
	ClockBack()
}

// Recorder receives every decision, for metering. It must never block.
type Recorder interface {
	Record(req Request, d Decision, at time.Time)
}

// Config configures a Limiter. The zero value of each field is a documented default.
type Config struct {
	// Authority is the shared tier. Required (MemoryAuthority in single-node mode).
	Authority Authority
	// Policy is the initial policy. Required.
	Policy Policy
	// ExpectedInstances is how many replicas share the load (default 1).
	ExpectedInstances int
	// LocalHeadroom scales the local tier's rate above each instance's fair
	// share (default 2: an instance may see twice its share before the
	// local tier fires).
	LocalHeadroom float64
	// DegradedCeiling, when its Rate and Burst are positive, caps the
	// tightened limit used while the authority is unavailable.
	DegradedCeiling Limit
	// MaxKeys bounds the local tier's entries (default 1,000,000).
	MaxKeys int
	// IdleAfter is how long an unused entry whose buckets are full is kept
	// (default 1 minute).
	IdleAfter time.Duration
	// Observer and Recorder are optional.
	Observer Observer
	Recorder Recorder
	// Now is the clock (default time.Now). The local tier measures elapsed
	// time on it; tests use it to step time, including backwards.
	Now func() time.Time
}

// Limiter makes two-tier decisions. It is safe for concurrent use.
type Limiter struct {
	cfg Config
	// storeEpoch counts authority failures. What an entry learned from the
	// store (its shadow) is trusted only within one epoch: a store that
	// failed may come back empty, and a stale "empty" must not reject.
	storeEpoch atomic.Uint64
	policy     atomic.Pointer[policyBox]
	entries    *table[entry]
	epoch      time.Time
	instN      float64
	stop       chan struct{}
	stopOnce   sync.Once
	done       chan struct{}
}

type policyBox struct{ p Policy }

type entry struct {
	mu       sync.Mutex
	pol      *policyBox // the policy res was resolved under
	tier     string     // the requested tier res was resolved for
	res      Resolved
	known    learned // what the shared store last said, trusted within one store epoch
	epoch    uint64  // the store epoch known was learned in
	local    Bucket
	degraded Bucket
	lastUse  int64 // µs on the limiter's clock
}

// learned is what an entry knows of the shared state from its verdicts.
// Each piece can only be pessimistic: the store refills at the known rate,
// other instances only take, and quota use only grows within a window.
type learned struct {
	shadow Bucket // the shared bucket as last reported; TS 0 = nothing known
	// notBefore and blockedCost: the store rejected blockedCost until
	// notBefore (µs); a request costing as much is rejected locally.
	notBefore   int64
	blockedCost int64
	quotaUsed   int64 // tokens spent in the quota window as last reported
	quotaEnd    int64 // µs when that window ends; 0 = nothing known
}

// New returns a Limiter and starts its sweeper; Close stops it.
func New(cfg Config) (*Limiter, error) {
	if cfg.Authority == nil {
		return nil, errors.New("enforcement: Config.Authority is required")
	}
	if cfg.Policy == nil {
		return nil, errors.New("enforcement: Config.Policy is required")
	}
	if cfg.ExpectedInstances < 1 {
		cfg.ExpectedInstances = 1
	}
	if cfg.LocalHeadroom <= 0 {
		cfg.LocalHeadroom = 2
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = 1_000_000
	}
	if cfg.IdleAfter <= 0 {
		cfg.IdleAfter = time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	l := &Limiter{
		cfg:     cfg,
		entries: newTable[entry](cfg.MaxKeys),
		epoch:   cfg.Now(),
		instN:   float64(cfg.ExpectedInstances),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	l.policy.Store(&policyBox{cfg.Policy})
	go l.sweepLoop()
	return l, nil
}

// SetPolicy swaps the policy. Decisions in flight finish under the policy
// they started with; the next decision of each key re-resolves its limit.
func (l *Limiter) SetPolicy(p Policy) { l.policy.Store(&policyBox{p}) }

// Policy returns the policy in force.
func (l *Limiter) Policy() Policy { return l.policy.Load().p }

// Close stops the sweeper. It is idempotent.
func (l *Limiter) Close(ctx context.Context) error {
	l.stopOnce.Do(func() { close(l.stop) })
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// now returns µs on the limiter's clock, ≥ 1 so that 0 keeps meaning
// "never seen". With the default clock this is monotonic.
func (l *Limiter) now() int64 { return l.micros(l.cfg.Now()) }

func (l *Limiter) micros(t time.Time) int64 {
	return max(1, int64(t.Sub(l.epoch)/time.Microsecond)+1)
}

// Check decides whether req may proceed. The error is non-nil only for a
// request that can never be decided (ErrInvalidRequest, ErrUnknownTier,
// ErrCostExceedsLimit); an unreachable authority is handled by the failure
// policy and never surfaces as an error.
func (l *Limiter) Check(ctx context.Context, req Request) (Decision, error) {
	start := l.cfg.Now() // one clock reading serves the whole local path
	if req.Key == "" || req.Scope == "" || (req.HasCost && req.Cost < 0) {
		return Decision{}, fmt.Errorf("%w: key and scope are required and cost must be ≥ 0", ErrInvalidRequest)
	}
	box := l.policy.Load()
	e := l.entries.get(bucketID{req.Key, req.Scope}, nil)
	nowUS := l.micros(start)

	e.mu.Lock()
	if e.pol != box || e.tier != req.Tier {
		res, err := box.p.Resolve(req.Key, req.Scope, req.Tier)
		if err != nil {
			e.mu.Unlock()
			return Decision{}, err
		}
		if res.Limit != e.res.Limit {
			e.known = learned{} // learned under another limit
		}
		e.pol, e.tier, e.res = box, req.Tier, res
	}
	res := e.res
	cost := res.Cost
	if req.HasCost {
		cost = req.Cost
	}
	if capacity := res.capacity(); cost > capacity {
		e.mu.Unlock()
		return Decision{}, fmt.Errorf("%w: cost %d, capacity %d", ErrCostExceedsLimit, cost, capacity)
	}
	e.lastUse = nowUS
	d := Decision{Limit: res.Burst, Policy: res.Policy, Tier: res.Tier, Cost: cost, DryRun: res.DryRun}
	if cost > 0 {
		if epoch := l.storeEpoch.Load(); e.epoch != epoch {
			e.known, e.epoch = learned{}, epoch
		}
		if wait := e.localWait(nowUS, cost, l.localRate(res.Rate)); wait > 0 {
			reset := ceilUS(float64(res.Burst) / res.Rate) // nothing known: at most an empty bucket's refill
			if k := &e.known; k.shadow.TS != 0 {
				tokens := min(float64(res.Burst), k.shadow.Tokens+float64(max(0, nowUS-k.shadow.TS))*res.Rate/1e6)
				reset = ceilUS((float64(res.Burst) - tokens) / res.Rate)
				d.Remaining = wholeTokens(tokens)
				d.Warning = softLimitReached(res.Limit, tokens, k.quotaUsed)
			}
			e.mu.Unlock()
			d.Source = SourceLocal
			d.RetryAfter = time.Duration(ceilMS(wait)) * time.Millisecond
			d.ResetAt = start.Add(time.Duration(reset) * time.Microsecond)
			return l.finish(&req, d, start), nil
		}
	}
	e.mu.Unlock()

	v, err := l.cfg.Authority.Take(ctx, req.Key, req.Scope, res.Limit, cost)
	if err == nil {
		if v.ClockBack && l.cfg.Observer != nil {
			l.cfg.Observer.ClockBack()
		}
		e.mu.Lock()
		if e.res.Limit == res.Limit { // not swapped for another limit meanwhile
			wall := l.cfg.Now()
			e.learn(l.micros(wall), wall, res.Limit, cost, &v)
		}
		e.mu.Unlock()
		d.Source = SourceShared
		d.WouldAllow = v.Allowed
		d.Remaining = v.Remaining
		d.RetryAfter = v.RetryAfter
		d.ResetAt = v.Now.Add(v.ResetAfter)
		d.Warning = v.Warning
		return l.finish(&req, d, start), nil
	}

	// Failure policy: fail open at the shared tier, while the tightened local
	// bucket keeps enforcing.
	l.storeEpoch.Add(1)
	if l.cfg.Observer != nil {
		l.cfg.Observer.AuthorityFailed(err)
	}
	tight := l.tightened(res.Limit)
	e.mu.Lock()
	dr := e.degraded.Take(nowUS, tight.Rate, tight.Burst, cost)
	e.mu.Unlock()
	if dr.ClockBack && l.cfg.Observer != nil {
		l.cfg.Observer.ClockBack()
	}
	d.Source = SourceDegraded
	d.WouldAllow = dr.Allowed
	d.Remaining = wholeTokens(dr.Tokens)
	d.Limit = tight.Burst
	d.ResetAt = start.Add(time.Duration(dr.ResetAfterUS) * time.Microsecond)
	if !dr.Allowed {
		d.RetryAfter = time.Duration(ceilMS(dr.RetryAfterUS)) * time.Millisecond
	}
	d.Warning = softLimitReached(tight, dr.Tokens, 0)
	return l.finish(&req, d, start), nil
}

// localWait is the local tier: it returns 0 when the request should go to
// the shared store, else the µs until it could pass. Called under e.mu.
func (e *entry) localWait(now, cost int64, localRate float64) int64 {
	k := &e.known
	var wait int64
	if now < k.notBefore && cost >= k.blockedCost {
		wait = k.notBefore - now
	}
	if now < k.quotaEnd && k.quotaUsed+cost > e.res.QuotaLimit {
		wait = max(wait, k.quotaEnd-now)
	}
	// The store's own retry time for this very cost needs no second opinion.
	if k.shadow.TS != 0 && !(wait > 0 && cost == k.blockedCost) {
		probe := k.shadow
		// The shadow is rounded to the store's millisecond; within that
		// rounding, let the store decide.
		if r := probe.Take(now, e.res.Rate, e.res.Burst, cost); !r.Allowed && r.RetryAfterUS > 1000 {
			wait = max(wait, r.RetryAfterUS)
		}
	}
	if wait > 0 {
		return wait
	}
	if r := e.local.Take(now, localRate, e.res.Burst, cost); !r.Allowed {
		return r.RetryAfterUS
	}
	return 0
}

// learn updates what the entry knows from a shared verdict. The store
// reports when the bucket will be full again, so the tokens left are
// burst − reset × rate (rounded down by the store's millisecond: never more
// than are there).
func (e *entry) learn(now int64, wall time.Time, lim Limit, cost int64, v *Verdict) {
	if lim.Split > 1 {
		// The verdict is one sub-bucket's; the others may well have room.
		return
	}
	k := &e.known
	tokens := float64(lim.Burst) - v.ResetAfter.Seconds()*lim.Rate
	k.shadow = Bucket{Tokens: max(0, tokens), TS: now}
	if lim.HasQuota() {
		// The window is the store's; its end is placed on this clock.
		_, end := lim.QuotaPeriod.Window(v.Now)
		k.quotaUsed, k.quotaEnd = v.QuotaUsed, now+end.Sub(wall).Microseconds()
	}
	if v.Allowed {
		k.notBefore = 0
		return
	}
	k.notBefore, k.blockedCost = now+v.RetryAfter.Microseconds(), cost
}

// finish applies dry run, reports and records the decision.
func (l *Limiter) finish(req *Request, d Decision, start time.Time) Decision {
	d.Allowed = d.WouldAllow || d.DryRun
	if d.Allowed {
		d.RetryAfter = 0
	}
	if l.cfg.Observer != nil {
		l.cfg.Observer.Decided(*req, d, max(0, time.Since(start)))
	}
	if l.cfg.Recorder != nil {
		l.cfg.Recorder.Record(*req, d, start)
	}
	return d
}

func (l *Limiter) localRate(rate float64) float64 {
	return rate * l.cfg.LocalHeadroom / l.instN
}

// tightened is the limit each instance enforces alone while the authority is
// unavailable: its fair share of the limit, or the safety ceiling if lower.
func (l *Limiter) tightened(lim Limit) Limit {
	t := Limit{
		Rate:             lim.Rate / l.instN,
		Burst:            max(1, int64(math.Floor(float64(lim.Burst)/l.instN))),
		SoftLimitPercent: lim.SoftLimitPercent,
	}
	if c := l.cfg.DegradedCeiling; c.Rate > 0 && c.Burst > 0 {
		t.Rate = math.Min(t.Rate, c.Rate)
		t.Burst = min(t.Burst, c.Burst)
	}
	return t
}

// Tightened returns the limit enforced per instance while the shared store is
// unavailable, for the resolved limit lim (documentation and tests).
func (l *Limiter) Tightened(lim Limit) Limit { return l.tightened(lim) }

// Entries is the number of (key, scope) entries the local tier holds.
func (l *Limiter) Entries() int { return l.entries.len() }

func (l *Limiter) sweepLoop() {
	defer close(l.done)
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.Sweep()
		}
	}
}

// Sweep forgets entries unused for IdleAfter whose buckets are full: they
// would restart exactly as they are.
func (l *Limiter) Sweep() int {
	now := l.now()
	idle := l.cfg.IdleAfter.Microseconds()
	return l.entries.sweep(func(e *entry) bool {
		if !e.mu.TryLock() {
			return false // in use right now
		}
		defer e.mu.Unlock()
		if now-e.lastUse < idle {
			return false
		}
		tight := l.tightened(e.res.Limit)
		return e.local.Full(now, l.localRate(e.res.Rate), e.res.Burst) &&
			e.degraded.Full(now, tight.Rate, tight.Burst)
	})
}
