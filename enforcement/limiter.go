package enforcement

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ratewarden/ratewarden/limits"
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
	// store (its shadow) is trusted only within one epoch: a store that
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

// policyBox is one policy in force; a new box per SetPolicy. It interns
// the limits resolved under it (refs), so that the entries of a million
// keys of one tier share one copy of that tier's limit.
type policyBox struct {
	p     Policy
	refs  sync.Map     // refKey → *resolvedRef
	nrefs atomic.Int64 // len(refs)
}

// maxSharedRefs bounds a policy's interned limits. Policies resolve to few
// distinct limits (one per tier and rule); past the bound a limit is
// allocated for its entry alone and counted in the local tier's bytes.
const maxSharedRefs = 1 << 16

type refKey struct {
	tier string
	res  Resolved
}

// resolvedRef is a limit resolved under pol for a request naming tier.
// Immutable once published.
type resolvedRef struct {
	pol  *policyBox
	tier string // the requested tier res was resolved for
	res  Resolved
	own  bool // not interned: counted in the entry's bytes
}

var resolvedRefBytes = allocSize(int(unsafe.Sizeof(resolvedRef{})))

// ref returns the interned resolvedRef for (tier, res).
func (b *policyBox) ref(tier string, res Resolved) *resolvedRef {
	k := refKey{tier, res}
	if r, ok := b.refs.Load(k); ok {
		return r.(*resolvedRef)
	}
	r := &resolvedRef{pol: b, tier: tier, res: res}
	if b.nrefs.Load() >= maxSharedRefs {
		r.own = true
		return r
	}
	if got, loaded := b.refs.LoadOrStore(k, r); loaded {
		return got.(*resolvedRef)
	}
	b.nrefs.Add(1)
	return r
}

// entry is the local tier's state of one (key, scope). It is kept small
// (its node is 112 bytes; BenchmarkHeapPerKey): the limit is a pointer to
// one shared copy, and what only a rejecting or degraded entry needs lives
// in x, allocated when first needed and dropped when no longer.
type entry struct {
	mu    sync.Mutex
	epoch uint32 // the store epoch known was learned in (its low bits: a wrap needs 2³² failures between two uses)
	gone  bool   // not in the table (removed, or never kept): x is not counted
	res   *resolvedRef
	known learned // what the shared store last said, trusted within one store epoch
	local Bucket
	// lastUse is µs on the limiter's clock.
	lastUse int64
	x       *entryExtra
}

// entryExtra is the state of an entry that rejects or decides degraded.
type entryExtra struct {
	rej      rejection
	degraded Bucket
}

var entryExtraBytes = allocSize(int(unsafe.Sizeof(entryExtra{})))

// quotaEntry is one key's quota allowance (key, QuotaID) as the degraded
// path needs it. Limits of one key that share a QuotaID share it, as they
// share one counter in the store. It outlives store epochs: the last count
// the store reported is exactly what an outage must start from.
type quotaEntry struct {
	mu sync.Mutex
	// seenEnd and seenUsed are the store's last word on the key's quota
	// window: when it ends (unix seconds; 0 = nothing known) and the tokens
	// spent in it.
	seenEnd  uint32
	gone     bool  // not in the table: dq is not counted
	limit    int64 // the QuotaLimit the state here was learned under
	seenUsed int64
	dq       *degradedQuota // nil until an outage decides for the key
}

var degradedQuotaBytes = allocSize(int(unsafe.Sizeof(degradedQuota{})))

// degradedQuota is what this instance may spend of a quota while the store
// cannot be asked. Spending while degraded is never recorded in the store,
// so it is remembered for the whole window: a second outage in the same
// window starts from the store's newer count less what this instance
// already spent unrecorded.
type degradedQuota struct {
	end        int64 // unix seconds when the window ends; 0 = no window yet
	share      int64 // this instance's share of the remaining quota, fixed at the outage's first decision
	unrecorded int64 // tokens spent while degraded in this window
	stale      bool  // share must be recomputed (the store answered since)
}

// learned is what an entry knows of the shared state from its verdicts.
// Each piece can only be pessimistic: the store refills at the known rate,
// other instances only take, and quota use only grows within a window.
// What a rejection adds is in the entry's extra (rejection).
type learned struct {
	shadow    Bucket // the shared bucket as last reported; TS 0 = nothing known
	quotaUsed int64  // tokens spent in the quota window as last reported
	quotaEnd  int64  // µs when that window ends; 0 = nothing known
}

// rejection is what an entry learned from rejections, kept with the entry's
// extra and forgotten with learned.
type rejection struct {
	// notBefore and blockedCost: the store rejected blockedCost until
	// notBefore (µs); a request costing as much is rejected locally.
	notBefore   int64
	blockedCost int64
	// The last rejection of the pieces above, remembered so that a flood
	// repeating it skips the arithmetic: a request costing rejectCost waits
	// until rejectUntil (µs; 0 = none remembered). It stands because
	// everything it was computed from only changes in learn, which forgets
	// it: a rejection spends nothing, and the shadow refills at a fixed
	// rate, so the wait shrinks exactly as the clock advances. It stops
	// answering shadowRoundingUS before its end, where the store decides
	// (localWait). rejectFull is when (µs) the shadow will be full, for
	// the rejection's reset time.
	rejectCost, rejectUntil, rejectFull int64
	// rejectResetAt is rejectFull's wall time, placed with rejectAnchor
	// (Limiter.rejectionResetAt).
	rejectResetAt time.Time
	rejectAnchor  *wallAnchor
}

// forget drops what the entry learned from the store. Called under e.mu.
func (e *entry) forget() {
	e.known = learned{}
	if e.x != nil {
		e.x.rej = rejection{}
	}
}

// extra returns the entry's extra, allocating it. Called under e.mu.
func (l *Limiter) extra(e *entry) *entryExtra {
	if e.x == nil {
		e.x = new(entryExtra)
		if !e.gone {
			l.entries.extra.Add(entryExtraBytes)
		}
	}
	return e.x
}

// trimExtra drops the entry's extra once it holds nothing: no rejection
// learned, and a degraded bucket that is full at now. Called under e.mu.
func (l *Limiter) trimExtra(e *entry, now int64) {
	x := e.x
	if x == nil || x.rej.notBefore > now || x.rej.rejectUntil > now {
		return
	}
	if x.degraded.TS != 0 {
		if e.res == nil {
			return
		}
		tight := l.tightened(e.res.res.Limit, l.instN())
		if !x.degraded.Full(now, tight.Rate, tight.Burst) {
			return
		}
	}
	e.x = nil
	if !e.gone {
		l.entries.extra.Add(-entryExtraBytes)
	}
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
	l.policy.Store(&policyBox{p: cfg.Policy})
	l.instances.Store(int64(cfg.ExpectedInstances))
	return l, nil
}

// SetPolicy swaps the policy. Decisions in flight finish under the policy
// they started with; the next decision of each key re-resolves its limit.
func (l *Limiter) SetPolicy(p Policy) { l.policy.Store(&policyBox{p: p}) }

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
	start := l.read() // one clock reading serves the whole local path
	if req.Key == "" || req.Scope == "" || (req.HasCost && req.Cost < 0) {
		return Decision{}, fmt.Errorf("%w: key and scope are required and cost must be ≥ 0", ErrInvalidRequest)
	}
	box := l.policy.Load()
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
	d.Limit, d.Policy, d.Tier, d.Cost, d.DryRun = res.Burst, res.Policy, res.Tier, cost, res.DryRun
	d.Bucket.Rate, d.Bucket.Burst = res.Rate, res.Burst
	if res.HasQuota() {
		d.Quota.Limit, d.Quota.Period = res.QuotaLimit, res.QuotaPeriod
	}
	if cost > 0 {
		if epoch := uint32(l.epochOf(res.Store).Load()); e.epoch != epoch {
			e.forget()
			e.epoch = epoch
		}
		// lw is filled through a pointer and read field by field: returning
		// it by value cost a store-forwarding stall in the flood's profile.
		var lw localVerdict
		if l.localWait(e, nowUS, cost, &lw); lw.wait > 0 {
			wait := lw.wait
			reset := lw.shadowResetUS
			if lw.shadowKnown {
				d.Remaining = wholeTokens(lw.shadowTokens)
				d.Warning = res.Limit.SoftLimitReached(lw.shadowTokens, e.known.quotaUsed)
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
		e.mu.Lock()
		if e.res != nil && e.res.res.Limit == lim { // not swapped for another limit meanwhile
			l.learn(e, now, wall, lim, cost, &v)
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
		d.WouldAllow = v.Allowed
		d.Remaining = v.Remaining
		d.RetryAfter = v.RetryAfter
		d.ResetAt = v.Now.Add(v.ResetAfter)
		d.Bucket.Remaining, d.Bucket.ResetAt = d.Remaining, d.ResetAt
		d.Warning = v.Warning
		if lim.HasQuota() {
			_, end := lim.QuotaPeriod.Window(v.Now)
			bindQuota(d, lim.QuotaLimit, v.QuotaUsed, end)
		}
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

// degradedDecision decides with the tightened limit and the quota share
// while the authority cannot be asked.
func (l *Limiter) degradedDecision(req *Request, d Decision, lim Limit, cost int64, e *entry, start reading, nowUS int64) Decision {
	wall := l.wall(start)
	inst := l.instN()
	tight := l.tightened(lim, inst)
	d.Source = SourceDegraded
	d.Limit = tight.Burst
	d.Bucket.Rate, d.Bucket.Burst = tight.Rate, tight.Burst

	var q *quotaEntry
	var quotaEndAt time.Time
	var quotaUsed int64 // the window's spend as this instance knows it: the store's count and its own unrecorded spend
	quotaLeft, quotaWait := int64(math.MaxInt64), time.Duration(0)
	e.mu.Lock() // lock order: entry, then quota
	x := l.extra(e)
	if lim.HasQuota() {
		q = l.quota(req.Key, lim.QuotaID, wall)
		q.mu.Lock()
		_, end := lim.QuotaPeriod.Window(wall)
		quotaEndAt = end
		quotaLeft = l.degradedLeft(q, lim, inst, end.Unix())
		if cost > quotaLeft {
			quotaWait = ceilDurationMS(end.Sub(wall))
		}
	}
	spend := cost
	if quotaWait > 0 {
		spend = 0 // a quota rejection spends no bucket tokens, as in the store
	}
	dr := x.degraded.Take(nowUS, tight.Rate, tight.Burst, spend)
	allowed := dr.Allowed && quotaWait == 0
	var bucketWaitUS int64 // how long the bucket alone would make cost wait
	switch {
	case !dr.Allowed:
		bucketWaitUS = dr.RetryAfterUS
	case quotaWait > 0: // refused by the quota: would the bucket alone have allowed cost?
		probe := x.degraded
		if r := probe.Take(nowUS, tight.Rate, tight.Burst, cost); !r.Allowed {
			bucketWaitUS = r.RetryAfterUS
		}
	}
	if q != nil {
		if allowed {
			q.dq.unrecorded += cost
			quotaLeft -= cost
		}
		quotaUsed = q.dq.unrecorded
		if int64(q.seenEnd) == q.dq.end {
			quotaUsed += q.seenUsed
		}
		q.mu.Unlock()
	}
	e.mu.Unlock()
	if dr.ClockBack && l.cfg.Observer != nil {
		l.cfg.Observer.ClockBack()
	}
	d.WouldAllow = allowed
	d.Remaining = wholeTokens(dr.Tokens)
	d.ResetAt = wall.Add(time.Duration(dr.ResetAfterUS) * time.Microsecond)
	d.Bucket.Remaining, d.Bucket.ResetAt = d.Remaining, d.ResetAt
	if q != nil {
		d.Quota.Known, d.Quota.Remaining, d.Quota.ResetAt = true, max(0, quotaLeft), quotaEndAt
	}
	if q != nil && quotaLeft < d.Remaining {
		// This instance's share of the quota binds: report it.
		d.Remaining, d.Limit, d.ResetAt = max(0, quotaLeft), lim.QuotaLimit, quotaEndAt
	}
	if !allowed {
		d.RetryAfter = max(time.Duration(ceilMS(bucketWaitUS))*time.Millisecond, quotaWait)
	}
	soft := Limit{Burst: tight.Burst, SoftLimitPercent: lim.SoftLimitPercent, QuotaLimit: lim.QuotaLimit, QuotaPeriod: lim.QuotaPeriod}
	d.Warning = soft.SoftLimitReached(dr.Tokens, quotaUsed)
	l.degradedReservation(req, &d, start)
	l.finish(req, &d, start)
	return d
}

// learnQuota keeps the store's count of the key's quota window for the
// degraded path.
func (l *Limiter) learnQuota(key string, lim Limit, v *Verdict) {
	_, end := lim.QuotaPeriod.Window(v.Now)
	q := l.quota(key, lim.QuotaID, v.Now)
	q.mu.Lock()
	q.reset(lim.QuotaLimit)
	q.seenUsed, q.seenEnd = v.QuotaUsed, uint32(end.Unix())
	if q.dq != nil {
		q.dq.stale = true // the next outage starts from this count
	}
	q.mu.Unlock()
}

// reset forgets what was learned under another quota limit. Called under q.mu.
func (q *quotaEntry) reset(limit int64) {
	if q.limit != limit {
		q.limit, q.seenUsed, q.seenEnd = limit, 0, 0
		if q.dq != nil {
			*q.dq = degradedQuota{}
		}
	}
}

// degradedLeft is what this instance may still spend of the quota window
// ending at end (unix seconds) while the store cannot be asked. Called
// under q.mu.
func (l *Limiter) degradedLeft(q *quotaEntry, lim Limit, inst float64, end int64) int64 {
	q.reset(lim.QuotaLimit)
	if q.dq == nil {
		q.dq = new(degradedQuota)
		if !q.gone {
			l.quotas.extra.Add(degradedQuotaBytes)
		}
	}
	dq := q.dq
	if dq.end != end { // a new window: nothing spent unrecorded in it yet
		*dq = degradedQuota{end: end, stale: true}
	}
	if dq.stale {
		// The outage's first decision: this instance's share of what the
		// store last said was left. A key the store never reported in this
		// window shares the whole quota, or gets nothing when the policy
		// says so.
		remaining := lim.QuotaLimit
		if int64(q.seenEnd) != end {
			if lim.QuotaDenyUnknown {
				remaining = 0
			}
		} else {
			remaining -= q.seenUsed
		}
		dq.share = int64(math.Floor(float64(max(0, remaining)) / inst))
		dq.stale = false
	}
	return max(0, dq.share-dq.unrecorded)
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

// localVerdict is the local tier's answer: wait is 0 when the request
// should go to the shared store, else the µs until it could pass. A
// rejection made while the shared bucket's shadow is known reports the
// shadow refilled to now: its tokens, and the µs until it is full.
type localVerdict struct {
	wait          int64
	remembered    bool // the rejection remembered in learned was repeated
	shadowKnown   bool
	shadowTokens  float64
	shadowResetUS int64
}

// shadowRoundingUS is the shadow's rounding (the store reports to the
// millisecond): a rejection the shadow alone would make within it is left
// to the store, and a remembered one stops answering that long before its
// end.
const shadowRoundingUS = 1000

// localWait is the local tier: it fills v, which starts zero. Called
// under e.mu.
func (l *Limiter) localWait(e *entry, now, cost int64, v *localVerdict) {
	k, res := &e.known, &e.res.res
	if x := e.x; x != nil {
		r := &x.rej
		if now < r.rejectUntil-shadowRoundingUS && cost == r.rejectCost {
			v.wait, v.remembered = r.rejectUntil-now, true
			if k.shadow.TS != 0 {
				v.shadowKnown = true
				v.shadowTokens = k.shadow.refilled(now, res.Rate, res.Burst)
				v.shadowResetUS = r.rejectFull - now
			}
			return
		}
		if now < r.notBefore && cost >= r.blockedCost {
			v.wait = r.notBefore - now
		}
	}
	if now < k.quotaEnd && k.quotaUsed+cost > res.QuotaLimit {
		v.wait = max(v.wait, k.quotaEnd-now)
	}
	probed := false
	// The store's own retry time for this very cost needs no second opinion.
	if k.shadow.TS != 0 && !(v.wait > 0 && e.x != nil && cost == e.x.rej.blockedCost) {
		probe := k.shadow
		// The shadow is rounded to the store's millisecond; within that
		// rounding, let the store decide.
		if r := probe.Take(now, res.Rate, res.Burst, cost); !r.Allowed {
			// Refused: nothing was spent, so r is the shadow refilled to now.
			probed = true
			v.shadowTokens, v.shadowResetUS = r.Tokens, r.ResetAfterUS
			if r.RetryAfterUS > shadowRoundingUS {
				v.wait = max(v.wait, r.RetryAfterUS)
			}
		}
	}
	if v.wait > 0 {
		if k.shadow.TS != 0 {
			v.shadowKnown = true
			if !probed {
				v.shadowTokens = k.shadow.refilled(now, res.Rate, res.Burst)
				v.shadowResetUS = ceilUS((float64(res.Burst) - v.shadowTokens) / res.Rate)
			}
		}
		r := &l.extra(e).rej
		r.rejectCost, r.rejectUntil = cost, now+v.wait
		r.rejectFull = now + v.shadowResetUS
		return
	}
	// The local bucket's rejections are not remembered: its rate follows
	// the instance count, and the requests it allows spend from it.
	if r := e.local.Take(now, l.localRate(res.Rate), res.Burst, cost); !r.Allowed {
		v.wait = r.RetryAfterUS
	}
}

// rejectionResetAt is the wall time a local rejection reports the bucket
// full at, reset µs after start. While a rejection is remembered that is a
// fixed instant (the shadow refills at its rate and nothing is spent), so
// its wall time is kept with the rejection and computed again only when the
// clock's wall anchor has moved. Called under e.mu.
func (l *Limiter) rejectionResetAt(e *entry, lw *localVerdict, start reading, reset int64) time.Time {
	if !lw.shadowKnown || l.cfg.Now != nil || e.x == nil {
		return l.wallAfter(start, time.Duration(reset)*time.Microsecond)
	}
	r := &e.x.rej
	if a := l.anchor.Load(); !lw.remembered || a != r.rejectAnchor {
		r.rejectAnchor, r.rejectResetAt = a, l.wallAfter(start, time.Duration(reset)*time.Microsecond)
	}
	return r.rejectResetAt
}

// learn updates what the entry knows from a shared verdict. The store
// reports when the bucket will be full again, so the tokens left are
// burst − reset × rate (rounded down by the store's millisecond: never more
// than are there). Called under e.mu.
func (l *Limiter) learn(e *entry, now int64, wall time.Time, lim Limit, cost int64, v *Verdict) {
	if lim.Split > 1 {
		// The verdict is one sub-bucket's; the others may well have room.
		return
	}
	k := &e.known
	if e.x != nil {
		e.x.rej.rejectUntil = 0 // computed from what is replaced below
	}
	// Below zero when the bucket is in debt (a settle or a charge took
	// more than was there): the shadow then rejects until it is paid off.
	tokens := float64(lim.Burst) - v.ResetAfter.Seconds()*lim.Rate
	k.shadow = Bucket{Tokens: tokens, TS: now}
	if lim.HasQuota() {
		// The window is the store's; its end is placed on this clock.
		_, end := lim.QuotaPeriod.Window(v.Now)
		k.quotaUsed, k.quotaEnd = v.QuotaUsed, now+end.Sub(wall).Microseconds()
	}
	if v.Allowed {
		if e.x != nil {
			e.x.rej.notBefore = 0
			l.trimExtra(e, now)
		}
		return
	}
	r := &l.extra(e).rej
	r.notBefore, r.blockedCost = now+v.RetryAfter.Microseconds(), cost
}

// setRef gives the entry its resolved limit, counting one of its own in
// the entry's bytes. Called under e.mu.
func (l *Limiter) setRef(e *entry, r *resolvedRef) {
	if !e.gone {
		if e.res != nil && e.res.own {
			l.entries.extra.Add(-resolvedRefBytes)
		}
		if r.own {
			l.entries.extra.Add(resolvedRefBytes)
		}
	}
	e.res = r
}

// quota returns the quota share of (key, quotaID); wall is the time now.
// One the table could not keep is new and kept nowhere: the degraded path
// then knows nothing of the key's window, as after a restart.
func (l *Limiter) quota(key, quotaID string, wall time.Time) *quotaEntry {
	q, tracked := l.quotas.get(bucketID{key, quotaID}, wall.Unix(), nil)
	if !tracked {
		q.gone = true
	}
	return q
}

// Eviction ranks: the lower score goes first.
const (
	rankFull    = 0 << 62 // restarts as it is: the store forgot it too
	rankPartial = 1 << 62 // restarts full: up to a burst more for its key
)

// rankEntry ranks an entry for eviction at now (µs): full buckets first,
// then partly spent ones, the least recently used first within each; an
// entry that knows its bucket empty (a remembered rejection, the store's
// "not before", an exhausted quota, an empty shadow or local bucket) is
// never evicted, since forgetting it is what a flood needs. Called under
// the shard's mutex.
func (l *Limiter) rankEntry(e *entry, now int64) (uint64, bool) {
	if !e.mu.TryLock() {
		return 0, false // in use right now
	}
	defer e.mu.Unlock()
	age := uint64(max(0, e.lastUse)) // older (smaller) first
	r := e.res
	if r == nil {
		return rankFull | age, true // never decided
	}
	lim := &r.res.Limit
	rate, burst := lim.Rate, lim.Burst
	trusted := e.epoch == uint32(l.epochOf(lim.Store).Load())
	k := &e.known
	if x := e.x; x != nil {
		if trusted && (now < x.rej.rejectUntil || now < x.rej.notBefore) {
			return 0, false
		}
		tight := l.tightened(*lim, l.instN())
		if x.degraded.TS != 0 && x.degraded.refilled(now, tight.Rate, tight.Burst) < 1 {
			return 0, false
		}
	}
	if trusted && now < k.quotaEnd && k.quotaUsed >= lim.QuotaLimit && lim.HasQuota() {
		return 0, false
	}
	if e.local.TS != 0 && e.local.refilled(now, l.localRate(rate), burst) < 1 {
		return 0, false
	}
	full := e.local.Full(now, l.localRate(rate), burst)
	if trusted && k.shadow.TS != 0 {
		t := k.shadow.refilled(now, rate, burst)
		if t < 1 {
			return 0, false
		}
		full = full && t+epsilon >= float64(burst)
	}
	if e.x != nil && e.x.degraded.TS != 0 {
		tight := l.tightened(*lim, l.instN())
		full = full && e.x.degraded.Full(now, tight.Rate, tight.Burst)
	}
	if full {
		return rankFull | age, true
	}
	return rankPartial | age, true
}

// removedEntry marks an entry the table dropped: what it still holds is no
// longer counted. Called under the shard's mutex.
func (l *Limiter) removedEntry(e *entry) {
	e.mu.Lock()
	e.gone = true
	if e.x != nil {
		l.entries.extra.Add(-entryExtraBytes)
	}
	if e.res != nil && e.res.own {
		l.entries.extra.Add(-resolvedRefBytes)
	}
	e.mu.Unlock()
}

// rankQuota ranks a quota share for eviction at now (unix seconds): ended
// windows first, then the least spent; a share that spent unrecorded while
// degraded in its window, or that the store reported exhausted, is never
// evicted (forgetting either would let this instance spend it again).
func (l *Limiter) rankQuota(q *quotaEntry, now int64) (uint64, bool) {
	if !q.mu.TryLock() {
		return 0, false
	}
	defer q.mu.Unlock()
	end := int64(q.seenEnd)
	if q.dq != nil {
		end = max(end, q.dq.end)
		if q.dq.end > now && q.dq.unrecorded > 0 {
			return 0, false
		}
	}
	if end <= now {
		return rankFull, true
	}
	if q.seenUsed >= q.limit {
		return 0, false
	}
	return rankPartial | uint64(max(0, q.seenUsed)), true
}

// removedQuota is removedEntry's counterpart for quota shares.
func (l *Limiter) removedQuota(q *quotaEntry) {
	q.mu.Lock()
	q.gone = true
	if q.dq != nil {
		l.quotas.extra.Add(-degradedQuotaBytes)
	}
	q.mu.Unlock()
}

// DefaultLocalMaxBytes is Config.MaxBytes's default: under a flood of new
// keys (every request a new key) it keeps a limiter within 256 MiB resident
// (BENCHMARKS.md, "Key rotation").
const DefaultLocalMaxBytes = 64 << 20

// LocalStats is what the local tier holds.
type LocalStats struct {
	Entries, QuotaEntries int   // (key, scope) entries; (key, quota) shares
	Bytes, QuotaBytes     int64 // their heap, as the bound counts it
	// Evictions and QuotaEvictions count entries removed to make room;
	// Untracked and QuotaUntracked count new ones that were decided
	// without being kept, every entry being one that protects.
	Evictions, QuotaEvictions uint64
	Untracked, QuotaUntracked uint64
}

// LocalStats returns what the local tier holds now.
func (l *Limiter) LocalStats() LocalStats {
	e, q := l.entries.stats(), l.quotas.stats()
	return LocalStats{
		Entries: e.entries, QuotaEntries: q.entries,
		Bytes: e.bytes, QuotaBytes: q.bytes,
		Evictions: e.evictions, QuotaEvictions: q.evictions,
		Untracked: e.untracked, QuotaUntracked: q.untracked,
	}
}

// finish applies dry run, evaluates the shadow limit, reports and records
// the decision.
func (l *Limiter) finish(req *Request, d *Decision, start reading) {
	d.Allowed = d.WouldAllow || d.DryRun
	if d.Allowed {
		d.RetryAfter = 0
	}
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

func (l *Limiter) localRate(rate float64) float64 {
	return rate * l.cfg.LocalHeadroom / l.instN()
}

// tightened is the limit each instance enforces alone while the authority is
// unavailable: its fair share of the limit, or the safety ceiling if lower.
func (l *Limiter) tightened(lim Limit, inst float64) Limit {
	t := Limit{
		Rate:             lim.Rate / inst,
		Burst:            max(1, int64(math.Floor(float64(lim.Burst)/inst))),
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
func (l *Limiter) Tightened(lim Limit) Limit { return l.tightened(lim, l.instN()) }

// Entries is the number of (key, scope) entries the local tier holds.
func (l *Limiter) Entries() int { return l.entries.len() }

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

// Sweep forgets entries unused for IdleAfter whose buckets are full: they
// would restart exactly as they are.
func (l *Limiter) Sweep() int {
	r := l.read()
	wall, now := l.wall(r), micros(r.off)
	idle := l.cfg.IdleAfter.Microseconds()
	// A quota window that has ended holds nothing the next one needs.
	l.quotas.sweep(func(q *quotaEntry) bool {
		if !q.mu.TryLock() {
			return false
		}
		defer q.mu.Unlock()
		end := int64(q.seenEnd)
		if q.dq != nil {
			end = max(end, q.dq.end)
		}
		return end <= wall.Unix()
	})
	return l.entries.sweep(func(e *entry) bool {
		if !e.mu.TryLock() {
			return false // in use right now
		}
		defer e.mu.Unlock()
		if now-e.lastUse < idle {
			return false
		}
		if e.res == nil {
			return true
		}
		lim := &e.res.res.Limit
		if e.x != nil {
			tight := l.tightened(*lim, l.instN())
			if !e.x.degraded.Full(now, tight.Rate, tight.Burst) {
				return false
			}
		}
		return e.local.Full(now, l.localRate(lim.Rate), lim.Burst)
	})
}
