// Package lease is token leasing for hot keys (design study, section 6.3):
// an enforcement.Authority decorator that, for a (key, scope) it sees
// running hot, takes a block of tokens from the shared bucket in one atomic
// step and spends them in-process, so a key at 40,000 decisions a second
// costs Redis about 40,000 ÷ block round trips instead of 40,000.
//
// # Design
//
// Every (key, scope) that passes through has a small state, held in a
// sharded map and guarded by its own mutex: a counter of decisions in the
// current window (the hot-key detector) and, while hot, the tokens this
// instance holds. A decision on a hot key spends held tokens without any
// network work; when they run out, exactly one caller refreshes the lease
// (others wait for it, so a burst of callers costs one round trip), and the
// lease script never grants more than the bucket has. Cold keys, keys with
// a calendar quota (the quota must be counted per decision) and split keys
// pass straight to the next authority.
//
// The Authority's Run is its sweeper: it returns the unused remainder of
// every lease older than MaxHold, of every key that has cooled down, and,
// when its context ends, of every key. The state mutex is never held across
// a network call.
//
// # The over-admission bound
//
// Leased tokens are taken from the shared bucket, which counts them, so over
// any run that starts with no lease outstanding the fleet admits at most
// burst + rate × duration, exactly as without leasing. What leasing changes
// is when tokens are spent: tokens leased before an interval can be spent
// inside it. So for any interval of length d,
//
//	admitted(d) ≤ burst + rate × d + instances × block
//
// where block is the largest lease (BlockFor). That is the figure to choose
// the block size by. Leasing can also reject early: tokens held by one
// instance cannot be spent by another until they are returned (at most
// MaxHold later, or when that instance's traffic cools down).
package lease

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyname"
	"github.com/ratewarden/ratewarden/limits"
)

// Store leases and returns tokens of the shared bucket atomically: the
// lease half of enforcement.Store.
type Store interface {
	Lease(ctx context.Context, key, scope string, lim enforcement.Limit, need, want int64) (enforcement.Grant, error)
	Return(ctx context.Context, key, scope string, lim enforcement.Limit, n int64) (enforcement.Grant, error)
}

// Config tunes leasing. The zero value of each field is its documented default.
type Config struct {
	// Block is the most tokens one lease takes (default 100).
	Block int64
	// MaxBlockFraction caps a lease at this fraction of the bucket's burst,
	// so a small bucket is not emptied by one instance (default 0.1).
	MaxBlockFraction float64
	// MinGrant is the least fraction of a block a refresh must get
	// (default 0.5). When the bucket holds less, the lease takes nothing and
	// the rejection's RetryAfter says when that much will be there, so a key
	// held at its limit costs about rate ÷ (block × MinGrant) round trips a
	// second instead of one per admitted request. The price: while the
	// bucket refills to that level this instance rejects requests that a
	// few stray tokens could have covered (at most block × MinGrant tokens,
	// which stay in the bucket for whoever leases next). ExactRetry turns
	// this off: a refresh then needs only the request's cost.
	MinGrant   float64
	ExactRetry bool
	// HotOpsPerSec: a (key, scope) decided at least this often across the
	// fleet is leased (default 500 decisions per second); each instance
	// sees HotOpsPerSec ÷ its SetInstances count of it.
	HotOpsPerSec float64
	// CoolFraction: a leased key whose rate falls below HotOpsPerSec ×
	// CoolFraction returns its tokens and stops leasing (default 0.5; the
	// gap avoids flapping around the threshold).
	CoolFraction float64
	// Window is the rate measurement window (default 250ms). A key is hot
	// as soon as it reaches HotOpsPerSec × Window decisions in one window.
	Window time.Duration
	// MaxHold: leased tokens unused this long go back to the bucket (default 1s).
	MaxHold time.Duration
	// Tick is the sweeper's period (default 100ms).
	Tick time.Duration
	// Timeout is the deadline of a lease call made for a decision (default
	// 5ms, like the guard's); returns get ReturnTimeout (default 1s).
	Timeout       time.Duration
	ReturnTimeout time.Duration
	// FailBackoff: after a lease call fails, the key's decisions pass to the
	// next authority (normally the guard, whose breaker fails fast) for this
	// long instead of each waiting Timeout for a dead store (default 1s).
	FailBackoff time.Duration
	// MaxKeys bounds the tracked (key, scope) states (default 100,000);
	// beyond it new keys pass through untracked.
	MaxKeys int
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Log receives failed returns (default: discarded).
	Log *slog.Logger
	// Names names keys in log lines (keyname; the zero value logs no key).
	Names keyname.Namer
}

func (c *Config) defaults() {
	if c.Block <= 0 {
		c.Block = 100
	}
	if c.MaxBlockFraction <= 0 || c.MaxBlockFraction > 1 {
		c.MaxBlockFraction = 0.1
	}
	if c.MinGrant <= 0 || c.MinGrant > 1 {
		c.MinGrant = 0.5
	}
	if c.HotOpsPerSec <= 0 {
		c.HotOpsPerSec = 500
	}
	if c.CoolFraction <= 0 || c.CoolFraction > 1 {
		c.CoolFraction = 0.5
	}
	if c.Window <= 0 {
		c.Window = 250 * time.Millisecond
	}
	if c.MaxHold <= 0 {
		c.MaxHold = time.Second
	}
	if c.Tick <= 0 {
		c.Tick = 100 * time.Millisecond
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Millisecond
	}
	if c.ReturnTimeout <= 0 {
		c.ReturnTimeout = time.Second
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = 100_000
	}
	if c.FailBackoff <= 0 {
		c.FailBackoff = time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// Stats counts what the Authority did, for metrics and the round-trip figure.
type Stats struct {
	Decisions int64 // Take calls
	Local     int64 // decided from held tokens, no network work
	Leases    int64 // lease round trips
	Returns   int64 // return round trips
	Direct    int64 // passed to the next authority (cold keys, quotas, split keys, after a failed lease)
	Failures  int64 // lease calls that failed
	Hot       int64 // keys leased right now
}

// RoundTrips is the number of store calls made: leases, returns and direct decisions.
func (s Stats) RoundTrips() int64 { return s.Leases + s.Returns + s.Direct }

// Authority is an enforcement.Authority that leases tokens for hot keys and
// asks next for everything else. It is safe for concurrent use.
type Authority struct {
	next  enforcement.Authority
	store Store
	cfg   Config
	epoch time.Time

	shards [shardCount]shard

	decisions, local, leases, returns, direct, failures atomic.Int64
	hot                                                 atomic.Int64
	// instances is the fleet's size: a key is hot when the fleet, not this
	// instance, decides it HotOpsPerSec times a second, and each instance
	// sees about 1 ÷ instances of it.
	instances atomic.Int64

	hotMu  sync.Mutex
	hotSet map[*state]struct{} // hot states and states still holding tokens

	pendMu  sync.Mutex
	pending []pending // returns queued by decisions, sent by Run

	closed atomic.Bool // Run has ended: decisions pass straight through
}

var _ enforcement.Authority = (*Authority)(nil)

const shardCount = 32

type id struct{ key, scope string }

type shard struct {
	mu sync.RWMutex
	m  map[id]*state
}

type state struct {
	mu sync.Mutex
	id id // immutable

	// hot-key detector, µs on the Authority's clock
	winStart int64
	count    int64
	hot      bool
	lastUse  int64

	// the lease
	lim        enforcement.Limit // the limit the held tokens were leased under
	held       int64
	leasedAt   int64
	left       int64 // whole tokens left in the shared bucket at the last grant
	leftAt     int64
	refreshing chan struct{} // non-nil while one caller leases; closed when done
	failedAt   int64         // µs of the last failed lease; pass through for FailBackoff after it
}

var seed = maphash.MakeSeed()

// New returns a leasing Authority in front of next, leasing from store. It
// starts nothing: Take works at once, and Run returns what is held.
func New(next enforcement.Authority, store Store, cfg Config) *Authority {
	cfg.defaults()
	a := &Authority{next: next, store: store, cfg: cfg, epoch: cfg.Now(), hotSet: make(map[*state]struct{})}
	for i := range a.shards {
		a.shards[i].m = make(map[id]*state)
	}
	a.instances.Store(1)
	return a
}

// BlockFor is the most tokens one lease takes for lim: Block, capped at
// MaxBlockFraction of the burst, at least 1. The over-admission bound is
// instances × BlockFor(lim).
func (a *Authority) BlockFor(lim enforcement.Limit) int64 {
	return max(1, min(a.cfg.Block, int64(math.Floor(float64(lim.Burst)*a.cfg.MaxBlockFraction))))
}

// SetInstances sets the fleet's size (values below 1 are ignored): hot-key
// detection then fires at HotOpsPerSec ÷ n on this instance, so a key that
// is hot across the fleet is leased however many replicas share it.
func (a *Authority) SetInstances(n int) {
	if n >= 1 {
		a.instances.Store(int64(n))
	}
}

// hotOps is the per-instance rate that makes a key hot.
func (a *Authority) hotOps() float64 { return a.cfg.HotOpsPerSec / float64(a.instances.Load()) }

// Stats returns the counters so far.
func (a *Authority) Stats() Stats {
	return Stats{Decisions: a.decisions.Load(), Local: a.local.Load(), Leases: a.leases.Load(),
		Returns: a.returns.Load(), Direct: a.direct.Load(), Failures: a.failures.Load(), Hot: a.hot.Load()}
}

func (a *Authority) now() int64 {
	return max(1, int64(a.cfg.Now().Sub(a.epoch)/time.Microsecond)+1)
}

// shardOf is the shard index of k.
func shardOf(k id) uint64 {
	return (maphash.String(seed, k.key) ^ maphash.String(seed, k.scope)*31) % shardCount
}

func (a *Authority) lookup(k id) *state {
	s := &a.shards[shardOf(k)]
	s.mu.RLock()
	st := s.m[k]
	s.mu.RUnlock()
	if st != nil {
		return st
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st = s.m[k]; st != nil {
		return st
	}
	if len(s.m) >= a.cfg.MaxKeys/shardCount+1 {
		return nil
	}
	st = &state{id: k}
	s.m[k] = st
	return st
}

// Take implements enforcement.Authority.
func (a *Authority) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	a.decisions.Add(1)
	// A class below share 1 (lim.Share) asks the store, which keeps its
	// floor: tokens leased here have left the bucket, and spending them
	// in process would not see what higher classes are owed.
	if cost <= 0 || lim.HasQuota() || lim.Split > 1 || lim.Floor() > 0 || a.closed.Load() {
		return a.passThrough(ctx, key, scope, lim, cost)
	}
	st := a.lookup(id{key, scope})
	if st == nil {
		return a.passThrough(ctx, key, scope, lim, cost)
	}
	now := a.now()
	st.mu.Lock()
	st.lastUse = now
	st.count++
	a.roll(st, now)
	if !st.hot && float64(st.count) >= a.hotOps()*a.cfg.Window.Seconds() {
		a.markHot(st) // hot before the window ends: a flood is detected at once
	}
	if !st.hot || (st.failedAt != 0 && now-st.failedAt < a.cfg.FailBackoff.Microseconds()) {
		st.mu.Unlock()
		return a.passThrough(ctx, key, scope, lim, cost)
	}
	if st.lim != lim {
		// Learned under another limit (a policy change): give the old
		// tokens back before leasing under the new one.
		if st.held > 0 {
			a.later(pending{key, scope, st.lim, st.held}) // the sweeper returns them
			st.held = 0
		}
		st.lim = lim
	}
	for {
		if st.held >= cost {
			st.held -= cost
			v := a.localVerdict(st, now)
			st.mu.Unlock()
			a.local.Add(1)
			return v, nil
		}
		if ch := st.refreshing; ch != nil {
			st.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return enforcement.Verdict{}, ctx.Err()
			}
			st.mu.Lock()
			now = a.now()
			if st.lim != lim { // the limit changed while we waited: start over
				st.mu.Unlock()
				return a.Take(ctx, key, scope, lim, cost)
			}
			continue
		}
		ch := make(chan struct{})
		st.refreshing = ch
		need := cost - st.held
		block := a.BlockFor(lim)
		if !a.cfg.ExactRetry {
			need = max(need, int64(math.Ceil(float64(block)*a.cfg.MinGrant)))
		}
		st.mu.Unlock()

		lctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
		g, err := a.store.Lease(lctx, key, scope, lim, need, max(need, block))
		cancel()
		a.leases.Add(1)

		st.mu.Lock()
		st.refreshing = nil
		close(ch)
		if err != nil {
			// Let the next authority (and its breaker) decide for a while.
			st.failedAt = a.now()
			st.mu.Unlock()
			a.failures.Add(1)
			return a.passThrough(ctx, key, scope, lim, cost)
		}
		now = a.now()
		st.left, st.leftAt = g.Left, now
		if g.Granted == 0 {
			v := grantVerdict(false, g, st.held, lim)
			st.mu.Unlock()
			return v, nil
		}
		if st.held == 0 {
			st.leasedAt = now
		}
		st.held += g.Granted - cost
		v := grantVerdict(true, g, st.held, lim)
		st.mu.Unlock()
		return v, nil
	}
}

func (a *Authority) passThrough(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	a.direct.Add(1)
	return a.next.Take(ctx, key, scope, lim, cost)
}

// roll closes the rate window when it has elapsed and updates hot. Called
// under st.mu.
func (a *Authority) roll(st *state, now int64) {
	win := a.cfg.Window.Microseconds()
	if st.winStart == 0 {
		st.winStart = now
		return
	}
	elapsed := now - st.winStart
	if elapsed < win {
		return
	}
	rate := float64(st.count) / (float64(elapsed) / 1e6)
	st.winStart, st.count = now, 0
	switch {
	case !st.hot && rate >= a.hotOps():
		a.markHot(st)
	case st.hot && rate < a.hotOps()*a.cfg.CoolFraction:
		st.hot = false
		a.hot.Add(-1)
	}
}

// markHot makes st hot and puts it in the set the sweeper visits every
// tick. Called under st.mu (lock order: st.mu, then hotMu).
func (a *Authority) markHot(st *state) {
	st.hot = true
	a.hot.Add(1)
	a.hotMu.Lock()
	a.hotSet[st] = struct{}{}
	a.hotMu.Unlock()
}

// localVerdict answers from held tokens. What the shared bucket holds is
// estimated from the last grant plus the refill since (capped at burst),
// plus what this instance holds. Called under st.mu.
func (a *Authority) localVerdict(st *state, now int64) enforcement.Verdict {
	lim := st.lim
	bucket := math.Min(float64(lim.Burst), float64(st.left)+float64(now-st.leftAt)*lim.Rate/1e6)
	remaining := min(lim.Burst, int64(bucket)+st.held)
	reset := time.Duration(math.Ceil(float64(lim.Burst-remaining)/lim.Rate*1000)) * time.Millisecond
	return enforcement.Verdict{
		Allowed:    true,
		Remaining:  remaining,
		ResetAfter: reset,
		Now:        a.cfg.Now(),
		Warning:    softLimit(lim, remaining),
		InProcess:  true,
	}
}

// grantVerdict is the verdict of a refresh that got g while this instance
// holds held tokens: allowed (the grant covered the request) or not (it
// took nothing; g says when it could).
func grantVerdict(allowed bool, g enforcement.Grant, held int64, lim enforcement.Limit) enforcement.Verdict {
	v := enforcement.Verdict{
		Allowed:    allowed,
		Remaining:  g.Left + held,
		ResetAfter: lessHeld(g.ResetAfter, held, lim.Rate),
		Now:        g.Now,
		ClockBack:  g.ClockBack,
	}
	if !allowed {
		v.RetryAfter = g.RetryAfter
	}
	v.Warning = softLimit(lim, v.Remaining)
	return v
}

// lessHeld shortens the bucket's time to full by what this instance holds:
// the limiter learns "tokens there for me" from it.
func lessHeld(reset time.Duration, held int64, rate float64) time.Duration {
	d := reset - time.Duration(float64(held)/rate*float64(time.Second))
	return max(0, d.Round(time.Millisecond))
}

// softLimit is the bucket's soft-limit warning for whole tokens remaining
// (a leased decision has no quota: keys with one are not leased).
func softLimit(lim enforcement.Limit, remaining int64) bool {
	return limits.SoftLimitReached(float64(lim.Burst-remaining), float64(lim.Burst), lim.SoftLimitPercent)
}

func (a *Authority) giveBack(key, scope string, lim enforcement.Limit, n int64) {
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ReturnTimeout)
	defer cancel()
	a.returnTokens(ctx, key, scope, lim, n)
}

func (a *Authority) returnTokens(ctx context.Context, key, scope string, lim enforcement.Limit, n int64) error {
	a.returns.Add(1)
	if _, err := a.store.Return(ctx, key, scope, lim, n); err != nil {
		// The tokens are lost to this run: the bucket under-admits by n
		// until it refills, the safe direction.
		a.cfg.Log.Warn("lease: could not return tokens", "key", a.cfg.Names.Name(key), "scope", scope, "tokens", n, "err", err)
		return err
	}
	return nil
}

type pending struct {
	key, scope string
	lim        enforcement.Limit
	n          int64
}

func (a *Authority) later(p pending) {
	a.pendMu.Lock()
	a.pending = append(a.pending, p)
	a.pendMu.Unlock()
}

// collect takes back, from the states, the tokens due for return: all of
// them when all is set, else those held longer than MaxHold or by keys that
// cooled down. It visits only the hot set, so a tick costs nothing for the
// many cold keys; forget (less often) drops idle cold states.
func (a *Authority) collect(all bool) []pending {
	now := a.now()
	hold := a.cfg.MaxHold.Microseconds()
	a.pendMu.Lock()
	out := a.pending
	a.pending = nil
	a.pendMu.Unlock()
	a.hotMu.Lock()
	hot := make([]*state, 0, len(a.hotSet))
	for st := range a.hotSet {
		hot = append(hot, st)
	}
	a.hotMu.Unlock()
	for _, st := range hot {
		st.mu.Lock()
		a.roll(st, now)
		if st.held > 0 && (all || !st.hot || now-st.leasedAt >= hold) {
			out = append(out, pending{st.id.key, st.id.scope, st.lim, st.held})
			st.held = 0
		}
		if !st.hot && st.held == 0 {
			a.hotMu.Lock()
			delete(a.hotSet, st)
			a.hotMu.Unlock()
		}
		st.mu.Unlock()
	}
	return out
}

// forget drops cold states unused for two windows: they would start over
// exactly as they are — except one still backing off a failed lease, which
// would otherwise lease from a dead store again as soon as it ran hot.
func (a *Authority) forget() {
	now := a.now()
	idle := 2 * a.cfg.Window.Microseconds()
	for i := range a.shards {
		s := &a.shards[i]
		s.mu.Lock()
		for k, st := range s.m {
			if !st.mu.TryLock() {
				continue // in use right now
			}
			backingOff := st.failedAt != 0 && now-st.failedAt < a.cfg.FailBackoff.Microseconds()
			if !st.hot && st.held == 0 && st.refreshing == nil && !backingOff && now-st.lastUse >= idle {
				delete(s.m, k)
			}
			st.mu.Unlock()
		}
		s.mu.Unlock()
	}
}

// Run is the sweeper, until ctx ends: every Tick it returns the tokens due
// back (held longer than MaxHold, or by keys that cooled down) and now and
// then forgets idle keys. When ctx ends, later decisions pass straight to
// the next authority, and Run returns every token still held, within
// ReturnTimeout, before it returns; the error says which returns failed
// (those tokens are lost to the bucket until it refills: the safe
// direction). Stop Run before the store closes.
func (a *Authority) Run(ctx context.Context) error {
	t := time.NewTicker(a.cfg.Tick)
	defer t.Stop()
	forgetEvery := max(1, int(a.cfg.Window/a.cfg.Tick)*4)
	for tick := 1; ; tick++ {
		select {
		case <-ctx.Done():
			return a.returnAll(context.WithoutCancel(ctx))
		case <-t.C:
			for _, p := range a.collect(false) {
				a.giveBack(p.key, p.scope, p.lim, p.n)
			}
			if tick%forgetEvery == 0 {
				a.forget()
			}
		}
	}
}

// returnAll stops leasing and returns every held token within ReturnTimeout.
func (a *Authority) returnAll(ctx context.Context) error {
	a.closed.Store(true)
	ctx, cancel := context.WithTimeout(ctx, a.cfg.ReturnTimeout)
	defer cancel()
	var errs []error
	for _, p := range a.collect(true) {
		if err := a.returnTokens(ctx, p.key, p.scope, p.lim, p.n); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
