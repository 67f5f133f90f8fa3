package slots

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// Checker decides the rate limit; *enforcement.Limiter is one.
type Checker interface {
	Check(ctx context.Context, req enforcement.Request) (enforcement.Decision, error)
}

// Policy is what the Gate reads of the policy in force: the resolution,
// and the shares of the priority classes (package policy's Policy and
// WithOverrides are both).
type Policy interface {
	enforcement.Policy
	PriorityShare(name string) (share float64, ok bool)
}

// concurrencyKnower is a policy that can say it has no concurrency limit
// at all, so that decisions skip the second resolution.
type concurrencyKnower interface{ HasConcurrency() bool }

// sheddingKnower is a policy that can say whether some priority class has
// a share below 1: then a class of share 1 holds a guarantee, which no
// full mark may refuse (full.go).
type sheddingKnower interface{ Sheds() bool }

// Observer counts what the Gate does. Implementations are safe for
// concurrent use and never block.
type Observer interface {
	// Slot counts an acquire's outcome: "admitted", or the rejection's
	// reason (enforcement.ReasonConcurrency, enforcement.ReasonShed), for
	// the request's class, and who decided; also a rate's decision for a
	// class below share 1, "admitted" (on a limit without a slot) or
	// enforcement.ReasonShed (refused by its floor in the bucket). The
	// source: enforcement.SourceShared (the store), SourceLocal (a
	// refusal on the store's last word, with no store call) or
	// SourceDegraded (the in-process set).
	Slot(outcome, priority string, source enforcement.Source)
	// Return counts a release or renew: "released", "unheld" (a release
	// that freed nothing), "renewed", "lost" (a renew of a lease not held).
	Return(outcome string)
}

// Config configures a Gate. The zero value of each optional field is a
// documented default.
type Config struct {
	// Next decides the rate limit of limits that have one. Required.
	Next Checker
	// Policy returns the policy in force (the limiter's, which a reload
	// swaps). Required.
	Policy func() enforcement.Policy
	// Store holds the default store's slots; Stores those of named stores
	// (limits.Limit.Store). Required; a name Stores lacks decides degraded.
	Store  Store
	Stores map[string]Store
	// TTL is a lease's time without a renewal (default DefaultTTL).
	TTL time.Duration
	// Timeout bounds one acquire at the store (default 1 s): past it the
	// decision is degraded. ReturnTimeout bounds a release or renew (default
	// 1 s, and never below Timeout): they are off the decision's path, and a
	// release that fails leaves the slot held until its lease ends.
	Timeout       time.Duration
	ReturnTimeout time.Duration
	// OpenFor is how long a store that failed a call is not asked again:
	// acquires decide degraded at once meanwhile, and renewals fail fast
	// (default 1 s).
	OpenFor time.Duration
	// Instances is how many limiters share the fleet's slots (the degraded
	// ceiling divides by it); nil = 1.
	Instances func() int
	// FullFor is how long at most a request is refused in process, with no
	// store call, after the store refused one of the same key and scope at
	// or below its class's limit (full.go): 0 = DefaultFullFor, negative =
	// never; at most RenewInterval(TTL). A slot released through another
	// limiter is refused here for at most that long.
	FullFor time.Duration
	// Observer counts outcomes; nil = none.
	Observer Observer
	// Recorder records each slot taken, refused, shed and released as a
	// decision event; nil = none.
	Recorder Recorder
}

// Gate takes a slot for every allowed decision on a concurrency limit, and
// gives it back on Release. It is a Checker itself: put it in front of
// the limiter on the doors whose callers release (POST /check with
// /release, the middleware, the Envoy door with its stream-done call). It
// is safe for concurrent use.
type Gate struct {
	cfg      Config
	degraded *Memory
	full     fullMarks
	// downUntil maps a store name to the time (Unix ns) before which it is
	// not asked (*atomic.Int64): one failure opens it for OpenFor.
	downUntil sync.Map
}

// errStoreDown: the store failed a call less than OpenFor ago.
var errStoreDown = errors.New("the slot store failed a call moments ago; not asked again yet")

// NewGate returns a Gate. It starts nothing; Run sweeps its degraded set.
func NewGate(cfg Config) (*Gate, error) {
	if cfg.Next == nil || cfg.Policy == nil || cfg.Store == nil {
		return nil, errors.New("slots: Next, Policy and Store are required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < MinTTL {
		return nil, fmt.Errorf("slots: a lease TTL of %v is shorter than %v", cfg.TTL, MinTTL)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.ReturnTimeout <= 0 {
		cfg.ReturnTimeout = time.Second
	}
	cfg.ReturnTimeout = max(cfg.ReturnTimeout, cfg.Timeout)
	if cfg.OpenFor <= 0 {
		cfg.OpenFor = time.Second
	}
	if cfg.Instances == nil {
		cfg.Instances = func() int { return 1 }
	}
	if cfg.FullFor == 0 {
		cfg.FullFor = DefaultFullFor
	}
	cfg.FullFor = min(cfg.FullFor, RenewInterval(cfg.TTL))
	return &Gate{cfg: cfg, degraded: NewMemory(nil)}, nil
}

// TTL is the lease time.
func (g *Gate) TTL() time.Duration { return g.cfg.TTL }

// Run sweeps the degraded set's expired leases and the full marks that
// no longer stand, every TTL, until ctx ends.
func (g *Gate) Run(ctx context.Context) error {
	t := time.NewTicker(g.cfg.TTL)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			g.degraded.Sweep()
			g.full.sweep(now)
		}
	}
}

// Check decides req: the rate limit first (when the limit has one), then,
// for a limit with a concurrency, a slot. An allowed decision on a
// concurrency limit carries Lease and LeaseExpiresAt; a rejection for want
// of a slot carries Reason. A request turned away for want of a slot has
// spent its rate tokens: it was counted as an attempt.
func (g *Gate) Check(ctx context.Context, req enforcement.Request) (enforcement.Decision, error) {
	return g.check(ctx, req, g.cfg.TTL)
}

// Door is the Gate for a door whose holders do not renew (the Envoy door,
// whose streams end by the route's timeout): its leases last its own TTL.
// It is safe for concurrent use.
type Door struct {
	g   *Gate
	ttl time.Duration
}

// For returns the Gate's Door whose leases last ttl (at least MinTTL; 0 =
// the Gate's TTL). A renewal of such a lease extends it by the Gate's TTL.
func (g *Gate) For(ttl time.Duration) *Door {
	if ttl == 0 {
		ttl = g.cfg.TTL
	}
	return &Door{g: g, ttl: max(ttl, MinTTL)}
}

// Check is Gate.Check with the Door's lease time.
func (d *Door) Check(ctx context.Context, req enforcement.Request) (enforcement.Decision, error) {
	return d.g.check(ctx, req, d.ttl)
}

// Release is Gate.Release.
func (d *Door) Release(ctx context.Context, id string) (freed bool, err error) {
	return d.g.Release(ctx, id)
}

func (g *Gate) check(ctx context.Context, req enforcement.Request, ttl time.Duration) (enforcement.Decision, error) {
	if req.Peek {
		// A peek spends nothing, so it takes no slot: it is answered for
		// the limit's rate alone.
		return g.cfg.Next.Check(ctx, req)
	}
	pol := g.cfg.Policy()
	share, class, err := g.share(pol, req.Priority)
	if err != nil {
		return enforcement.Decision{}, err
	}
	if k, ok := pol.(concurrencyKnower); ok && !k.HasConcurrency() {
		return g.rate(ctx, req, share, class, false)
	}
	if req.Key == "" || req.Scope == "" || (req.HasCost && req.Cost < 0) {
		return enforcement.Decision{}, fmt.Errorf("%w: key and scope are required and cost must be ≥ 0", enforcement.ErrInvalidRequest)
	}
	res, err := pol.Resolve(req.Key, req.Scope, req.Tier)
	if err != nil {
		return enforcement.Decision{}, err
	}
	if res.Concurrency <= 0 {
		return g.rate(ctx, req, share, class, false)
	}
	var d enforcement.Decision
	if res.HasRate() {
		if d, err = g.rate(ctx, req, share, class, true); err != nil || !d.WouldAllow {
			return d, err
		}
	} else {
		d = enforcement.Decision{Allowed: true, WouldAllow: true, DryRun: res.DryRun, Source: enforcement.SourceShared,
			Policy: res.Policy, Tier: res.Tier, Cost: res.Cost, Limit: res.Concurrency}
		if req.HasCost {
			d.Cost = req.Cost
		}
	}
	s := Slot{Key: req.Key, Scope: req.Scope, Store: res.Store, Member: NewMember()}
	guaranteed := share >= 1 && sheds(pol)
	at := time.Now()
	gr, source, err := g.acquire(ctx, &s, share, res.Concurrency, ttl, guaranteed)
	if err != nil {
		return enforcement.Decision{}, err
	}
	if g.cfg.Observer != nil {
		outcome := "admitted"
		if !gr.Admitted {
			outcome = gr.Reason
		}
		g.cfg.Observer.Slot(outcome, class, source)
	}
	if source != enforcement.SourceShared {
		d.Source = source
	}
	if !res.HasRate() {
		d.Remaining = max(0, res.Concurrency-gr.Held)
		d.ResetAt = gr.Now
	}
	if gr.Admitted {
		d.Lease, d.LeaseExpiresAt = LeaseID(s), gr.ExpiresAt
		g.recordSlot(req, d, gr, class, !res.HasRate(), at)
		return d, nil
	}
	d.Allowed, d.WouldAllow = res.DryRun, false
	d.Reason = gr.Reason
	d.RetryAfter = gr.RetryAfter
	if !res.HasRate() {
		d.Remaining, d.ResetAt = 0, gr.Now.Add(gr.RetryAfter)
	}
	g.recordSlot(req, d, gr, class, !res.HasRate(), at)
	return d, nil
}

// rate is the rate's decision (Next), counted with the slots' when the
// class's share splits the bucket (share < 1): a shed, and, on a limit
// without a slot to count it (slot false), an admission. So
// limiter_slot_decisions_total{outcome="shed"} and its alert count every
// request shed, by a class's floor in a bucket or its share of the slots.
func (g *Gate) rate(ctx context.Context, req enforcement.Request, share float64, class string, slot bool) (enforcement.Decision, error) {
	d, err := g.cfg.Next.Check(ctx, req)
	if err != nil || share >= 1 || g.cfg.Observer == nil {
		return d, err
	}
	switch {
	case d.Reason == enforcement.ReasonShed:
		g.cfg.Observer.Slot(enforcement.ReasonShed, class, d.Source)
	case d.WouldAllow && !slot:
		g.cfg.Observer.Slot("admitted", class, d.Source)
	}
	return d, nil
}

// share is the priority class's share and its name for metrics;
// ErrUnknownPriority when the policy does not define the class. A policy
// without classes gives every request the whole capacity, counted as
// the default class (the label never takes a value the caller made up).
func (g *Gate) share(pol enforcement.Policy, priority string) (share float64, class string, err error) {
	p, ok := pol.(Policy)
	if !ok {
		return 1, "", nil
	}
	share, ok = p.PriorityShare(priority)
	if !ok {
		return 0, "", fmt.Errorf("%w %q", ErrUnknownPriority, priority)
	}
	return share, priority, nil
}

// sheds reports whether pol has a priority class below share 1.
func sheds(pol enforcement.Policy) bool {
	k, ok := pol.(sheddingKnower)
	return ok && k.Sheds()
}

// acquire refuses on the set's full mark when it stands (unless the class
// is guaranteed), else asks the slot's store, else, when it cannot be
// asked, the degraded set with the tightened ceiling ⌈capacity ÷
// instances⌉. The source says which decided.
func (g *Gate) acquire(ctx context.Context, s *Slot, share float64, capacity int64, ttl time.Duration, guaranteed bool) (Grant, enforcement.Source, error) {
	id := setID{s.Store, s.Key, s.Scope}
	limit := ClassLimit(share, capacity)
	if g.cfg.FullFor > 0 && !guaranteed {
		if gr, ok := g.full.refuse(id, limit, capacity, time.Now()); ok {
			return gr, enforcement.SourceLocal, nil
		}
	}
	st := g.storeOf(s.Store)
	if st != nil && g.up(s.Store) {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
		gr, err := st.Acquire(cctx, *s, limit, capacity, ttl)
		cancel()
		if err == nil {
			switch {
			case gr.Admitted:
				g.full.clear(id)
			case g.cfg.FullFor > 0:
				g.full.mark(id, start, gr, g.cfg.FullFor)
			}
			return gr, enforcement.SourceShared, nil
		}
		if ctx.Err() != nil {
			return Grant{}, 0, fmt.Errorf("acquire a slot: %w", ctx.Err())
		}
		g.failed(s.Store)
	}
	s.Degraded = true
	inst := int64(max(1, g.cfg.Instances()))
	ceiling := (capacity + inst - 1) / inst
	gr, err := g.degraded.Acquire(ctx, *s, ClassLimit(share, ceiling), ceiling, ttl)
	return gr, enforcement.SourceDegraded, err
}

// up reports whether store name may be asked: it has not failed a call
// in the last OpenFor.
func (g *Gate) up(name string) bool {
	v, ok := g.downUntil.Load(name)
	return !ok || time.Now().UnixNano() >= v.(*atomic.Int64).Load()
}

// failed opens store name for OpenFor.
func (g *Gate) failed(name string) {
	v, _ := g.downUntil.LoadOrStore(name, new(atomic.Int64))
	v.(*atomic.Int64).Store(time.Now().Add(g.cfg.OpenFor).UnixNano())
}

func (g *Gate) storeOf(name string) Store {
	if name == "" {
		return g.cfg.Store
	}
	return g.cfg.Stores[name]
}

// storeFor is the store that holds s: the degraded set for a lease it
// issued; ErrLeaseNotFound for a store this limiter does not have.
func (g *Gate) storeFor(s Slot) (Store, error) {
	if s.Degraded {
		return g.degraded, nil
	}
	if st := g.storeOf(s.Store); st != nil {
		return st, nil
	}
	return nil, ErrLeaseNotFound
}

// Release gives the slot of lease id back. freed is false when it was not
// held (released before, or expired): then nothing changed. The errors are
// ErrInvalidLease, or the store's.
func (g *Gate) Release(ctx context.Context, id string) (freed bool, err error) {
	s, err := ParseLeaseID(id)
	if err != nil {
		return false, err
	}
	st, err := g.storeFor(s)
	if errors.Is(err, ErrLeaseNotFound) {
		return false, nil
	}
	cctx, cancel := context.WithTimeout(ctx, g.cfg.ReturnTimeout)
	defer cancel()
	freed, err = st.Release(cctx, s)
	if err != nil {
		return false, fmt.Errorf("release a slot: %w", err)
	}
	if freed {
		g.recordRelease(s, time.Now())
	}
	if freed && !s.Degraded {
		g.full.clear(setID{s.Store, s.Key, s.Scope})
	}
	if g.cfg.Observer != nil {
		outcome := "released"
		if !freed {
			outcome = "unheld"
		}
		g.cfg.Observer.Return(outcome)
	}
	return freed, nil
}

// Renew extends lease id by the TTL. The errors are ErrInvalidLease,
// ErrLeaseNotFound (the slot is not held: stop the work, or take a new
// slot), or the store's.
func (g *Gate) Renew(ctx context.Context, id string) (expiresAt time.Time, err error) {
	s, err := ParseLeaseID(id)
	if err != nil {
		return time.Time{}, err
	}
	st, err := g.storeFor(s)
	switch {
	case err != nil:
	case !s.Degraded && !g.up(s.Store):
		err = errStoreDown
	default:
		cctx, cancel := context.WithTimeout(ctx, g.cfg.ReturnTimeout)
		expiresAt, err = st.Renew(cctx, s, g.cfg.TTL)
		cancel()
		if err != nil && !errors.Is(err, ErrLeaseNotFound) && !s.Degraded && ctx.Err() == nil {
			g.failed(s.Store)
		}
	}
	if g.cfg.Observer != nil && (err == nil || errors.Is(err, ErrLeaseNotFound)) {
		outcome := "renewed"
		if err != nil {
			outcome = "lost"
		}
		g.cfg.Observer.Return(outcome)
	}
	if err != nil && !errors.Is(err, ErrLeaseNotFound) {
		err = fmt.Errorf("renew a slot: %w", err)
	}
	return expiresAt, err
}

func reasonOf(held, capacity int64) string {
	if held >= capacity {
		return enforcement.ReasonConcurrency
	}
	return enforcement.ReasonShed
}
