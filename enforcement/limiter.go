package enforcement

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratewarden/ratewarden/limits"
)

// Design: every (key, scope) has one local entry, held in a sharded table and
// guarded by its own mutex. The entry caches the limit resolved for it (so
// resolution costs nothing on the hot path; a policy swap invalidates it by
// pointer) and three pieces of in-process state, all checked or updated
// without network work:
//
//   - mirror: what the shared store last told this instance about the bucket
//     (tokens left at a time, refilled at the true rate, plus "not before"
//     after a rejection). The shared bucket only refills at that rate and
//     other instances only take from it, so when the mirror says the tokens
//     are not there, they are not: the request is rejected locally with a
//     retry time that is never earlier than the truth. This is what keeps a
//     flood on one key from becoming one Redis call per request.
//   - local: the flood filter for what the mirror cannot know yet (a burst
//     that arrives before the first verdict, or many instances at once). It
//     is sized loosely, the resolved rate × LocalHeadroom ÷ ExpectedInstances
//     with the full burst, so well-behaved traffic never trips it.
//   - degraded: the tightened limit (rate and burst ÷ the instance count, or
//     the safety ceiling if lower) that decides while the authority cannot
//     be asked, and the quota share it may spend meanwhile: the last
//     remaining the store reported ÷ the instance count, less what this
//     instance already spent unrecorded in the window.
//
// The instance count starts at ExpectedInstances and follows the fleet's
// live count (SetInstances, never below ExpectedInstances) while the store
// can report it, so a fleet that scaled out does not multiply the degraded
// limit by its size.
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

// Classes is a Policy that names priority classes (package policy's
// Policy): the share of a bucket a request of each may use (Limit.Share,
// Limit.Floor). A Policy without it gives every request the whole bucket.
type Classes interface {
	// PriorityShare is the class's share (0 < share ≤ 1); "" is the
	// default class; ok is false for a class the policy does not define.
	PriorityShare(name string) (share float64, ok bool)
	// Sheds reports whether some class has a share below 1.
	Sheds() bool
}

// ErrUnknownPriority: the request names a priority class the policy does
// not define (it wraps ErrInvalidRequest).
var ErrUnknownPriority = fmt.Errorf("%w: unknown priority class", ErrInvalidRequest)

// Shares is a policy's rule for the share of a bucket a request of each
// priority class may use, read once from the policy: the limiter's, and
// replay's of a candidate. The zero value gives every request the whole
// bucket.
type Shares struct {
	c     Classes // nil without classes
	sheds bool    // some class has a share below 1
}

// SharesOf reads p's priority classes (none unless p is Classes).
func SharesOf(p Policy) Shares {
	c, ok := p.(Classes)
	if !ok {
		return Shares{}
	}
	return Shares{c: c, sheds: c.Sheds()}
}

// Of is the share of a bucket a request of class priority may use: 1 (the
// whole bucket) without classes, and for the default class while no class
// sheds; ErrUnknownPriority for a class the policy does not define.
func (s Shares) Of(priority string) (float64, error) {
	if s.c == nil || (priority == "" && !s.sheds) {
		return 1, nil
	}
	share, ok := s.c.PriorityShare(priority)
	if !ok {
		return 0, fmt.Errorf("%w %q", ErrUnknownPriority, priority)
	}
	return share, nil
}

// ErrUnknownTier is returned by a Policy for a tier it does not define.
var ErrUnknownTier = limits.ErrUnknownTier

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
	// Global, optional, decides the limits resolved Global (scope: global)
	// in a deployment of several regions (enforcement/global): from the
	// region's pool of the key's global budget. Nil: Authority decides
	// every limit, as in a one-region deployment.
	Global Authority
	// Regions is how many regions share a global limit (≥ 1; default 1):
	// while the region's own store cannot be asked, a global limit's
	// tightened bucket is also divided by it.
	Regions int
	// Policy is the initial policy. Required.
	Policy Policy
	// ExpectedInstances is how many replicas share the load until the
	// fleet's live count is known (SetInstances), and the floor of that
	// count after; default 1.
	ExpectedInstances int
	// LocalHeadroom scales the local tier's rate above each instance's fair
	// share (default 2: an instance may see twice its share before the
	// local tier fires).
	LocalHeadroom float64
	// DegradedCeiling, when its Rate and Burst are positive, caps the
	// tightened limit used while the authority is unavailable.
	DegradedCeiling Limit
	// MaxKeys bounds the local tier's entries (default 1,000,000), and
	// separately its quota shares.
	MaxKeys int
	// MaxBytes bounds the local tier's heap (default 64 MiB): two thirds
	// for its (key, scope) entries, one third for the keys' quota shares,
	// each counted with its table (LocalStats). A full table evicts first
	// what would restart as it is (full buckets, the least recently used
	// first), never an entry that is rejecting or knows its bucket empty;
	// when only such entries are left, a new key is decided without being
	// kept (by the shared store, as every new key is).
	MaxBytes int64
	// IdleAfter is how long an unused entry whose buckets are full is kept
	// (default 1 minute).
	IdleAfter time.Duration
	// Observer and Recorder are optional.
	Observer Observer
	Recorder Recorder
	// Reservations, optional, is the store that keeps reservations and
	// charges costs after the fact (Request.Reserve, Settle, Charge): the
	// same buckets as Authority, without its wrappers. Nil: reserving,
	// settling and charging are ErrReserveUnsupported.
	Reservations Reserver
	// ReservationTTL is how long an unsettled reservation lives before it
	// is settled at its estimate (default DefaultReservationTTL).
	ReservationTTL time.Duration
	// SettleQueue bounds the settles and charges held while the store
	// cannot be asked (default DefaultSettleQueue).
	SettleQueue int
	// Peeker, optional, answers peeks (Limiter.Peek) for the limits
	// Authority decides: the same buckets, read without writing. Nil: the
	// Authority itself when it is a Peeker, else peeks are ErrPeekUnsupported.
	Peeker Peeker
	// Shadow, optional, evaluates shadow limits beside every decision
	// (Decision.Shadow); it never changes the enforced decision.
	Shadow ShadowEvaluator
	// Now is the clock. The local tier measures elapsed time on it; tests
	// use it to step time, including backwards. Default (nil): the
	// monotonic clock read alone, with wall times placed on an anchor the
	// limiter refreshes every second (clock.go).
	Now func() time.Time
}

// Limiter makes two-tier decisions. It is safe for concurrent use.
type Limiter struct {
	cfg Config
	// storeEpoch counts authority failures. What an entry learned from the
	// store (its mirror) is trusted only within one epoch: a store that
	// failed may come back empty, and a stale "empty" must not reject.
	// Each named store (Limit.Store) counts its own in storeEpochs, so that
	// one store's outage does not make the others' keys forget.
	storeEpoch atomic.Uint64
	policy     atomic.Pointer[policyBox]
	entries    *table[entry]
	quotas     *table[quotaEntry]
	epoch      time.Time                  // time 0 of the limiter's clock: bucket timestamps are µs since it
	anchor     atomic.Pointer[wallAnchor] // the default clock's wall time (clock.go)
	instances  atomic.Int64               // replicas sharing the load: ExpectedInstances, then the live count
	// lastStoreOK and lastStoreFail are when (µs on the limiter's clock) the
	// store last answered and last failed: readiness reports a store whose
	// latest call failed even before the breaker has seen enough to open.
	lastStoreOK, lastStoreFail atomic.Int64

	storeEpochs sync.Map // store name → *atomic.Uint64 (epochOf)

	settles settleQueue // settles and charges waiting for the store (reserve.go)
}

// New returns a Limiter. It starts nothing: Check works at once, and Run
// does the background work (the sweeper, the clock's wall anchor).
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
	if cfg.Regions < 1 {
		cfg.Regions = 1
	}
	if cfg.LocalHeadroom <= 0 {
		cfg.LocalHeadroom = 2
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = 1_000_000
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultLocalMaxBytes
	}
	if cfg.IdleAfter <= 0 {
		cfg.IdleAfter = time.Minute
	}
	if cfg.ReservationTTL <= 0 {
		cfg.ReservationTTL = DefaultReservationTTL
	}
	if cfg.SettleQueue <= 0 {
		cfg.SettleQueue = DefaultSettleQueue
	}
	l := &Limiter{cfg: cfg}
	l.entries = newTable(tableConfig[entry]{
		maxEntries: cfg.MaxKeys,
		maxBytes:   cfg.MaxBytes / 3 * 2,
		rank:       l.rankEntry,
		removed:    l.removedEntry,
	})
	l.quotas = newTable(tableConfig[quotaEntry]{
		maxEntries: cfg.MaxKeys,
		maxBytes:   cfg.MaxBytes / 3,
		rank:       l.rankQuota,
		removed:    l.removedQuota,
	})
	l.startClock()
	l.policy.Store(newPolicyBox(cfg.Policy))
	l.instances.Store(int64(cfg.ExpectedInstances))
	return l, nil
}

// SetPolicy swaps the policy. Decisions in flight finish under the policy
// they started with; the next decision of each key re-resolves its limit.
func (l *Limiter) SetPolicy(p Policy) { l.policy.Store(newPolicyBox(p)) }

// SetInstances sets how many replicas share the load (the fleet's live
// count). ExpectedInstances stays the floor: a count below it (an instance
// that cannot see the others yet) is raised to it, so the operator's figure
// is never loosened. Values below 1 are ignored. The local tier, the
// tightened limit and the degraded quota share divide by it from the next
// decision on.
func (l *Limiter) SetInstances(n int) {
	if n >= 1 {
		l.instances.Store(int64(max(n, l.cfg.ExpectedInstances)))
	}
}

// Instances is the replica count the limiter divides by.
func (l *Limiter) Instances() int { return int(l.instances.Load()) }

func (l *Limiter) instN() float64 { return float64(l.instances.Load()) }

// epochOf is the failure epoch of the named store ("" = the default).
func (l *Limiter) epochOf(store string) *atomic.Uint64 {
	if store == "" {
		return &l.storeEpoch
	}
	if e, ok := l.storeEpochs.Load(store); ok {
		return e.(*atomic.Uint64)
	}
	e, _ := l.storeEpochs.LoadOrStore(store, new(atomic.Uint64))
	return e.(*atomic.Uint64)
}

// StoreFailing reports whether the shared store's latest call failed (no
// answer since): decisions are degraded even if too few calls failed for
// the breaker to open.
func (l *Limiter) StoreFailing() bool { return l.lastStoreFail.Load() > l.lastStoreOK.Load() }

// Policy returns the policy in force.
func (l *Limiter) Policy() Policy { return l.policy.Load().p }

// micros is µs on the limiter's clock for an offset from its epoch, ≥ 1 so
// that 0 keeps meaning "never seen". With the default clock this is
// monotonic.
func micros(off time.Duration) int64 {
	return max(1, int64(off/time.Microsecond)+1)
}

// Check decides whether req may proceed. The error is non-nil only for a
// request that can never be decided (ErrInvalidRequest, ErrUnknownTier,
// ErrCostExceedsLimit), or when ctx ended before the shared store answered
// (the error wraps ctx.Err(): the caller went away, which is not the
// store's failure and changes nothing of what the limiter knows); an
// unreachable authority is handled by the failure policy and never
// surfaces as an error.
func (l *Limiter) Check(ctx context.Context, req Request) (d Decision, err error) {
	// d is the named result, filled in place: a Decision is large, and
	// copying a freshly written one costs store-forwarding stalls that
	// showed in the local tier's profile.
	if req.Peek {
		return l.Peek(ctx, req) // peek.go: nothing spent, nothing recorded
	}
	start := l.read() // one clock reading serves the whole local path
	if req.Key == "" || req.Scope == "" || (req.HasCost && req.Cost < 0) {
		return Decision{}, fmt.Errorf("%w: key and scope are required and cost must be ≥ 0", ErrInvalidRequest)
	}
	box := l.policy.Load()
	share, err := box.shares.Of(req.Priority)
	if err != nil {
		return Decision{}, err
	}
	nowUS := micros(start.off)
	e, tracked := l.entries.get(bucketID{req.Key, req.Scope}, nowUS, nil)
	if !tracked {
		e.gone = true
	}

	e.mu.Lock()
	if r := e.res; r == nil || r.pol != box || r.tier != req.Tier {
		res, err := box.p.Resolve(req.Key, req.Scope, req.Tier)
		if err != nil {
			e.mu.Unlock()
			return Decision{}, err
		}
		if r == nil || res.Limit != r.res.Limit || res.Global != r.res.Global {
			e.forget() // learned under another limit, or from another store
		}
		l.setRef(e, box.ref(req.Tier, res))
	}
	res := &e.res.res // read under e.mu; lim below is the copy used after unlocking
	cost := res.Cost
	if req.HasCost {
		cost = req.Cost
	}
	if !res.HasRate() {
		e.mu.Unlock()
		return Decision{}, ErrConcurrencyOnly
	}
	if capacity := res.Capacity(); cost > capacity {
		e.mu.Unlock()
		return Decision{}, fmt.Errorf("%w: cost %d, capacity %d", ErrCostExceedsLimit, cost, capacity)
	}
	e.lastUse = nowUS
	describeRule(&d, res, cost)
	if cost > 0 {
		if epoch := uint32(l.epochOf(res.Store).Load()); e.epoch != epoch {
			e.forget()
			e.epoch = epoch
		}
		// lw is filled through a pointer and read field by field: returning
		// it by value cost a store-forwarding stall in the flood's profile.
		var lw localVerdict
		// A class of share 1 under lower classes skips the local flood
		// bucket: the flood of the lower classes spends it, and would
		// refuse in process what the store keeps for the guarantee.
		if l.localWait(e, nowUS, cost, !(box.shares.sheds && share >= 1), &lw); lw.wait > 0 {
			wait := lw.wait
			reset := lw.mirrorResetUS
			if lw.mirrorKnown {
				d.Remaining = wholeTokens(lw.mirrorTokens)
				d.Warning = res.Limit.SoftLimitReached(lw.mirrorTokens, e.known.quotaUsed)
			} else {
				reset = ceilUS(float64(res.Burst) / res.Rate) // nothing known: at most an empty bucket's refill
			}
			d.ResetAt = l.rejectionResetAt(e, &lw, start, reset)
			d.Bucket.Remaining, d.Bucket.ResetAt = d.Remaining, d.ResetAt
			quotaUsed, quotaEnd, quotaLimit := e.known.quotaUsed, e.known.quotaEnd, res.QuotaLimit
			e.mu.Unlock()
			d.Source = SourceLocal
			d.RetryAfter = time.Duration(ceilMS(wait)) * time.Millisecond
			if quotaEnd > nowUS {
				bindQuota(&d, quotaLimit, quotaUsed, l.wallAfter(start, time.Duration(quotaEnd-nowUS)*time.Microsecond))
			}
			l.finish(&req, &d, start)
			return d, nil
		}
	}
	lim := res.Limit
	if share < 1 {
		// Below share 1 the store keeps the class's floor (Limit.Floor).
		// The local tier above only refuses what lacks the cost itself,
		// which no class may take, so it stands for every class.
		lim.Share = share
	}
	global := res.Global && l.cfg.Global != nil
	e.mu.Unlock()
	err = l.askStore(ctx, &req, &d, e, lim, global, cost, start, nowUS)
	return d, err
}

// askStore completes a decision the local tier passed on: the shared
// authority decides, or the failure policy when it cannot be asked. It is
// its own function so that the local tier's path, which answers floods,
// keeps a small stack frame.
//
//go:noinline
func (l *Limiter) askStore(ctx context.Context, req *Request, d *Decision, e *entry, lim Limit, global bool, cost int64, start reading, nowUS int64) error {
	var v Verdict
	var err error
	if req.Reserve {
		v, err = l.reserveTake(ctx, req, d, lim, global, cost, start)
	} else if global {
		v, err = l.cfg.Global.Take(ctx, req.Key, req.Scope, lim, cost)
	} else {
		v, err = l.cfg.Authority.Take(ctx, req.Key, req.Scope, lim, cost)
	}
	if err == nil {
		if v.ClockBack && l.cfg.Observer != nil {
			l.cfg.Observer.ClockBack()
		}
		r := l.read()
		wall, now := l.wall(r), micros(r.off)
		if l.lastStoreFail.Load() > l.lastStoreOK.Load() {
			// Written only after a failure: a store per decision would
			// bounce one cache line between every core deciding.
			l.lastStoreOK.Store(now)
		}
		// The local tier learns the bucket as the store left it; a shed
		// verdict is not learned: it refused a cost that was there, and
		// the mirror would refuse it to every class.
		base := lim
		base.Share = 0
		e.mu.Lock()
		if e.res != nil && e.res.res.Limit == base && !v.Shed { // not swapped for another limit meanwhile
			l.learn(e, now, wall, base, cost, &v)
		}
		e.mu.Unlock()
		if lim.HasQuota() && lim.Split <= 1 {
			l.learnQuota(req.Key, lim, &v)
		}
		d.Source = SourceShared
		if v.InProcess {
			d.Source = SourceLocal
		} else {
			if v.Regional {
				d.Source = SourceRegional
			}
			d.DecidedUS = v.Now.UnixMicro()
		}
		takeVerdict(d, &lim, &v)
		l.finish(req, d, start)
		return nil
	}
	if ctx.Err() != nil {
		// The caller went away (or its own deadline passed): nobody is
		// left to answer, and the store did nothing wrong.
		*d = Decision{}
		return fmt.Errorf("enforcement: decision abandoned by the caller: %w", ctx.Err())
	}

	// Failure policy: fail open at the shared tier, while the tightened local
	// bucket and the quota share keep enforcing.
	l.epochOf(lim.Store).Add(1)
	if !errors.Is(err, ErrUnknownStore) {
		// A store this limiter lacks is not a failing store: readiness
		// names it as missing, and the other stores stay as they are.
		l.lastStoreFail.Store(nowUS)
	}
	if l.cfg.Observer != nil {
		l.cfg.Observer.AuthorityFailed(err)
	}
	if global && l.cfg.Regions > 1 {
		// Every region's fleet may be deciding this limit degraded:
		// each gets its share, as the escrow does.
		n := l.cfg.Regions
		lim.Rate, lim.Burst = lim.Rate/float64(n), max(1, lim.Burst/int64(n))
	}
	*d = l.degradedDecision(req, *d, lim, cost, e, start, nowUS)
	return nil
}

// describeRule fills in what d says of the rule that decides it: the
// policy, the bucket's shape and the quota's, and the cost charged. Check
// and Peek describe a decision alike.
func describeRule(d *Decision, res *Resolved, cost int64) {
	d.Limit, d.Policy, d.Tier, d.Cost, d.DryRun = res.Burst, res.Policy, res.Tier, cost, res.DryRun
	d.Bucket.Rate, d.Bucket.Burst = res.Rate, res.Burst
	if res.HasQuota() {
		d.Quota.Limit, d.Quota.Period = res.QuotaLimit, res.QuotaPeriod
	}
}

// takeVerdict makes d say what the store's verdict v on lim says: the
// outcome, the bucket after it, the retry time and the quota. The source
// is the caller's to set.
func takeVerdict(d *Decision, lim *Limit, v *Verdict) {
	d.WouldAllow = v.Allowed
	if v.Shed {
		d.Reason = ReasonShed
	}
	d.Remaining = v.Remaining
	d.RetryAfter = v.RetryAfter
	d.ResetAt = v.Now.Add(v.ResetAfter)
	d.Bucket.Remaining, d.Bucket.ResetAt = d.Remaining, d.ResetAt
	d.Warning = v.Warning
	if lim.HasQuota() {
		_, end := lim.QuotaPeriod.Window(v.Now)
		bindQuota(d, lim.QuotaLimit, v.QuotaUsed, end)
	}
}

// applyDryRun sets d.Allowed: what enforcement decided, or yes in a dry
// run; an allowed request has nothing to wait for.
func applyDryRun(d *Decision) {
	d.Allowed = d.WouldAllow || d.DryRun
	if d.Allowed {
		d.RetryAfter = 0
	}
}

// bindQuota makes d report the quota when it binds tighter than the bucket
// (fewer tokens left in the window than in the bucket): remaining, limit and
// reset are then the quota's, so that a caller pacing itself on them (and
// the RateLimit-* headers built from them) sees the constraint that will
// reject it. used is the window's spend after this decision; end is when
// the window resets. d.Quota records the quota's own state either way.
func bindQuota(d *Decision, quotaLimit, used int64, end time.Time) {
	left := max(0, quotaLimit-used)
	d.Quota.Known, d.Quota.Remaining, d.Quota.ResetAt = true, left, end
	if left < d.Remaining {
		d.Remaining, d.Limit, d.ResetAt = left, quotaLimit, end
	}
}

// finish applies dry run, evaluates the shadow limit, reports and records
// the decision.
func (l *Limiter) finish(req *Request, d *Decision, start reading) {
	applyDryRun(d)
	if l.cfg.Shadow == nil && l.cfg.Observer == nil && l.cfg.Recorder == nil {
		return
	}
	wall := l.wall(start)
	if l.cfg.Shadow != nil {
		d.Shadow = l.cfg.Shadow.Evaluate(l.Policy(), *req, *d, wall)
	}
	if l.cfg.Observer != nil {
		l.cfg.Observer.Decided(*req, *d, l.elapsed(start))
	}
	if l.cfg.Recorder != nil {
		l.cfg.Recorder.Record(*req, *d, wall)
	}
}

// Run does the limiter's background work until ctx ends: every 10 s it
// sweeps idle entries (Sweep), and every second it re-reads the default
// clock's wall anchor (clock.go). Without Run the local tier only grows to
// its bounds and evicts from there. Run returns nil when ctx ends.
func (l *Limiter) Run(ctx context.Context) error {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	a := time.NewTicker(anchorEvery)
	defer a.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			l.Sweep()
		case <-a.C:
			l.reanchor()
		}
	}
}
