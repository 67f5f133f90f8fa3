package enforcement_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// fixedPolicy resolves every request to one limit.
type fixedPolicy struct{ res enforcement.Resolved }

func (p fixedPolicy) Resolve(_, _, tier string) (enforcement.Resolved, error) {
	if tier != "" && tier != p.res.Tier {
		return enforcement.Resolved{}, enforcement.ErrUnknownTier
	}
	return p.res, nil
}

func policyOf(rate float64, burst int64) fixedPolicy {
	return fixedPolicy{enforcement.Resolved{Limit: enforcement.Limit{Rate: rate, Burst: burst}, Policy: "p", Tier: "t", Cost: 1}}
}

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }
func newClock() *clock               { return &clock{t: time.Date(2026, 7, 31, 9, 0, 0, 0, time.UTC)} }
func req(key string, cost int64) enforcement.Request {
	return enforcement.Request{Key: key, Scope: "s", Cost: cost, HasCost: true}
}

// countingAuthority counts calls and can be switched to failing, as a
// store that went away does.
type countingAuthority struct {
	next  enforcement.Authority
	calls atomic.Int64
	down  atomic.Bool
}

var errStoreDown = errors.New("store down")

func (a *countingAuthority) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	a.calls.Add(1)
	if a.down.Load() {
		return enforcement.Verdict{}, errStoreDown
	}
	return a.next.Take(ctx, key, scope, lim, cost)
}

type observer struct {
	failed, clockBack atomic.Int64
	bySource          sync.Map
}

func (o *observer) Decided(_ enforcement.Request, d enforcement.Decision, _ time.Duration) {
	v, _ := o.bySource.LoadOrStore(d.Source, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}
func (o *observer) AuthorityFailed(error) { o.failed.Add(1) }
func (o *observer) ClockBack()            { o.clockBack.Add(1) }

func newLimiter(t *testing.T, cfg enforcement.Config) *enforcement.Limiter {
	t.Helper()
	l, err := enforcement.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestFloodIsRejectedLocallyWithoutStoreCalls(t *testing.T) {
	clk := newClock()
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<20)}
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: policyOf(10, 20), Now: clk.Now})
	ctx := context.Background()
	allowed, local := 0, 0
	for i := 0; i < 10_000; i++ {
		d, err := l.Check(ctx, req("flood", 1))
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
		if d.Source == enforcement.SourceLocal {
			local++
			if d.RetryAfter <= 0 {
				t.Fatalf("local rejection without a retry time: %+v", d)
			}
		}
	}
	if allowed != 20 {
		t.Fatalf("allowed %d of a flood at one instant, want the burst (20)", allowed)
	}
	if calls := auth.calls.Load(); calls > 21 {
		t.Fatalf("%d store calls for a flood of 10,000 at one instant; the local tier should have absorbed it", calls)
	}
	if local < 9_900 {
		t.Fatalf("only %d local rejections", local)
	}
}

func TestLocalRejectionRetryIsNeverEarly(t *testing.T) {
	clk := newClock()
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<20)}
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: policyOf(10, 5), Now: clk.Now})
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		l.Check(ctx, req("k", 1))
	}
	// The mirror learned from the shared verdicts that the bucket is empty:
	// 3 tokens at 10/s = 300ms, decided locally.
	first, _ := l.Check(ctx, req("k", 3))
	if first.Allowed || first.Source != enforcement.SourceLocal || first.RetryAfter != 300*time.Millisecond {
		t.Fatalf("first rejection: %+v", first)
	}
	clk.Add(100 * time.Millisecond)
	second, _ := l.Check(ctx, req("k", 3))
	if second.Source != enforcement.SourceLocal || second.RetryAfter != 200*time.Millisecond {
		t.Fatalf("local rejection 100ms later: %+v, want local with 200ms", second)
	}
	clk.Add(second.RetryAfter)
	if d, _ := l.Check(ctx, req("k", 3)); !d.Allowed {
		t.Fatalf("rejected at the advertised time: %+v", d)
	}
}

func TestDegradedUsesTightenedLimit(t *testing.T) {
	clk := newClock()
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<20)}
	obs := &observer{}
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: policyOf(100, 200), ExpectedInstances: 4, Observer: obs, Now: clk.Now})
	auth.down.Store(true)
	ctx := context.Background()
	allowed := 0
	for i := 0; i < 1000; i++ {
		d, err := l.Check(ctx, req("k", 1))
		if err != nil {
			t.Fatal(err)
		}
		if d.Source != enforcement.SourceDegraded && d.Source != enforcement.SourceLocal {
			t.Fatalf("decision while the store is down: %+v", d)
		}
		if d.Allowed {
			allowed++
		}
	}
	// Tightened: burst 200/4 = 50 at one instant.
	if allowed != 50 {
		t.Fatalf("allowed %d while degraded, want the tightened burst 50", allowed)
	}
	if got := l.Tightened(enforcement.Limit{Rate: 100, Burst: 200}); got.Rate != 25 || got.Burst != 50 {
		t.Fatalf("tightened = %+v", got)
	}
	if obs.failed.Load() == 0 {
		t.Fatal("authority failures were not observed")
	}
	// Recovery: the next decision is shared again, with no manual step.
	auth.down.Store(false)
	clk.Add(10 * time.Second)
	if d, _ := l.Check(ctx, req("k", 1)); d.Source != enforcement.SourceShared || !d.Allowed {
		t.Fatalf("after recovery: %+v", d)
	}
}

func TestDegradedCeilingCaps(t *testing.T) {
	l := newLimiter(t, enforcement.Config{
		Authority: enforcement.NewMemoryAuthority(nil, 10), Policy: policyOf(100, 200),
		DegradedCeiling: enforcement.Limit{Rate: 5, Burst: 10},
	})
	if got := l.Tightened(enforcement.Limit{Rate: 100, Burst: 200}); got.Rate != 5 || got.Burst != 10 {
		t.Fatalf("tightened with ceiling = %+v, want rate 5 burst 10", got)
	}
}

func TestClockJumpBackwardsNeverRemovesTokens(t *testing.T) {
	clk := newClock()
	obs := &observer{}
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<20)}
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: policyOf(1, 10), Observer: obs, Now: clk.Now})
	ctx := context.Background()
	d, _ := l.Check(ctx, req("k", 5))
	if d.Remaining != 5 {
		t.Fatalf("remaining %d", d.Remaining)
	}
	clk.Add(-time.Hour) // an NTP step or a VM restored from a snapshot
	d, _ = l.Check(ctx, req("k", 1))
	if !d.Allowed || d.Remaining != 4 {
		t.Fatalf("after the clock stepped back an hour: %+v, want allowed with 4 remaining", d)
	}
	if obs.clockBack.Load() == 0 {
		t.Fatal("the negative elapsed time was not counted")
	}
}

func TestCostRules(t *testing.T) {
	clk := newClock() // rate 1/s: on the real clock a slow machine refills a token between the calls
	l := newLimiter(t, enforcement.Config{Authority: enforcement.NewMemoryAuthority(clk.Now, 10), Policy: policyOf(1, 10), Now: clk.Now})
	ctx := context.Background()
	if _, err := l.Check(ctx, req("k", 11)); !errors.Is(err, enforcement.ErrCostExceedsLimit) {
		t.Fatalf("cost above capacity: err = %v", err)
	}
	if _, err := l.Check(ctx, req("k", -1)); !errors.Is(err, enforcement.ErrInvalidRequest) {
		t.Fatalf("negative cost: err = %v", err)
	}
	l.Check(ctx, req("k", 10))
	if d, _ := l.Check(ctx, req("k", 0)); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("cost 0 on an empty bucket: %+v", d)
	}
	d, _ := l.Check(ctx, enforcement.Request{Key: "k2", Scope: "s"}) // no cost: the policy's
	if d.Cost != 1 {
		t.Fatalf("default cost = %d", d.Cost)
	}
	if _, err := l.Check(ctx, enforcement.Request{Key: "k", Scope: "s", Tier: "nope"}); !errors.Is(err, enforcement.ErrUnknownTier) {
		t.Fatalf("unknown tier: err = %v", err)
	}
}

func TestDryRunAllowsAndReportsWouldAllow(t *testing.T) {
	p := policyOf(1, 2)
	p.res.DryRun = true
	clk := newClock() // rate 1/s: on the real clock a slow machine refills a token between the calls
	l := newLimiter(t, enforcement.Config{Authority: enforcement.NewMemoryAuthority(clk.Now, 10), Policy: p, Now: clk.Now})
	ctx := context.Background()
	var last enforcement.Decision
	for i := 0; i < 3; i++ {
		last, _ = l.Check(ctx, req("k", 1))
	}
	if !last.Allowed || last.WouldAllow || !last.DryRun || last.RetryAfter != 0 {
		t.Fatalf("third request under a dry-run burst of 2: %+v", last)
	}
}

func TestPolicySwapReResolves(t *testing.T) {
	l := newLimiter(t, enforcement.Config{Authority: enforcement.NewMemoryAuthority(nil, 10), Policy: policyOf(1, 2)})
	ctx := context.Background()
	if d, _ := l.Check(ctx, req("k", 1)); d.Limit != 2 {
		t.Fatalf("limit %d", d.Limit)
	}
	l.SetPolicy(policyOf(1, 50))
	if d, _ := l.Check(ctx, req("k", 1)); d.Limit != 50 {
		t.Fatalf("after swap limit %d, want 50", d.Limit)
	}
}

func TestSweepBoundsMemory(t *testing.T) {
	clk := newClock()
	l := newLimiter(t, enforcement.Config{Authority: enforcement.NewMemoryAuthority(clk.Now, 1<<20), Policy: policyOf(100, 100), Now: clk.Now, IdleAfter: time.Second})
	ctx := context.Background()
	for i := 0; i < 500; i++ {
		l.Check(ctx, req(string(rune('a'+i%26))+string(rune('a'+i/26)), 1))
	}
	if n := l.Entries(); n != 500 {
		t.Fatalf("entries = %d", n)
	}
	clk.Add(2 * time.Second)
	l.Sweep()
	if n := l.Entries(); n != 0 {
		t.Fatalf("idle, refilled entries kept: %d", n)
	}
}

// A local rejection knows what the store said about the quota too: its
// retry time is the window's end, not the bucket's refill, and it warns.
func TestLocalRejectionKnowsTheQuota(t *testing.T) {
	clk := newClock() // 09:00 UTC
	p := fixedPolicy{enforcement.Resolved{Limit: enforcement.Limit{Rate: 1, Burst: 10, QuotaLimit: 12,
		QuotaPeriod: enforcement.PeriodDay, QuotaID: "q", SoftLimitPercent: 50}, Policy: "p", Tier: "t", Cost: 1}}
	l := newLimiter(t, enforcement.Config{Authority: enforcement.NewMemoryAuthority(clk.Now, 1<<20), Policy: p, Now: clk.Now})
	ctx := context.Background()
	if d, _ := l.Check(ctx, req("k", 10)); !d.Allowed {
		t.Fatalf("first 10: %+v", d)
	}
	clk.Add(2 * time.Second)
	if d, _ := l.Check(ctx, req("k", 2)); !d.Allowed { // quota now 12 of 12
		t.Fatalf("next 2: %+v", d)
	}
	d, _ := l.Check(ctx, req("k", 1)) // bucket empty and quota spent
	if d.Allowed || d.Source != enforcement.SourceLocal || d.RetryAfter != 15*time.Hour-2*time.Second {
		t.Fatalf("after the quota is spent: %+v, want a local rejection until midnight UTC", d)
	}
	if !d.Warning {
		t.Fatalf("a local rejection at 100%% of the quota must warn: %+v", d)
	}
}

// TestRepeatedLocalRejectionAnswersAsTheFirst: a flood's repeated local
// rejection is remembered rather than computed again; at every instant
// (and after the bucket refills and is spent again) it must answer exactly
// what a limiter computing that rejection for the first time answers.
func TestRepeatedLocalRejectionAnswersAsTheFirst(t *testing.T) {
	pol := fixedPolicy{enforcement.Resolved{Limit: enforcement.Limit{Rate: 10, Burst: 5, SoftLimitPercent: 50}, Policy: "p", Tier: "t", Cost: 1}}
	// history brings a limiter's key to an empty bucket at the clock's start.
	history := func(clk *clock) *enforcement.Limiter {
		l := newLimiter(t, enforcement.Config{Authority: enforcement.NewMemoryAuthority(clk.Now, 1<<20), Policy: pol, Now: clk.Now})
		for i := 0; i < 5; i++ {
			if d, _ := l.Check(context.Background(), req("k", 1)); !d.Allowed {
				t.Fatalf("history: request %d rejected", i)
			}
		}
		return l
	}
	// Instants after the bucket emptied: across the remembered rejection,
	// its last millisecond (where the store decides) and its end.
	offsets := []time.Duration{0, 17 * time.Millisecond, 100 * time.Millisecond, 198900 * time.Microsecond,
		199200 * time.Microsecond, 199900 * time.Microsecond, 250 * time.Millisecond, 298900 * time.Microsecond,
		299200 * time.Microsecond, 299900 * time.Microsecond, 300 * time.Millisecond, 301 * time.Millisecond}
	// Costs asked in turn at each instant: each must get its own wait.
	for _, costs := range [][]int64{{3}, {2}, {2, 3}, {3, 2, 1}} {
		clk := newClock()
		flooded := history(clk)
		start := clk.Now()
	instants:
		for _, off := range offsets {
			clk.Add(start.Add(off).Sub(clk.Now()))
			for _, cost := range costs {
				got, err := flooded.Check(context.Background(), req("k", cost))
				if err != nil {
					t.Fatal(err)
				}
				// The same request, decided by a limiter that has the same
				// history and is asked for the first time.
				fresh := &clock{t: start}
				first := history(fresh)
				fresh.Add(off)
				want, _ := first.Check(context.Background(), req("k", cost))
				if got.Allowed != want.Allowed || got.Source != want.Source || got.RetryAfter != want.RetryAfter ||
					got.Remaining != want.Remaining || got.Limit != want.Limit || got.Warning != want.Warning ||
					!got.ResetAt.Equal(want.ResetAt) {
					t.Fatalf("costs %v, cost %d at +%v: repeated %+v, first time %+v", costs, cost, off, got, want)
				}
				if got.Source != enforcement.SourceLocal {
					break instants // the store answered: the key's history now differs from a fresh limiter's
				}
			}
		}
	}
}

// TestRememberedRejectionIsForgottenWhenTheStoreAnswers: a request of
// another cost that reaches the store changes the mirror; the rejection
// remembered before it must not answer after it.
func TestRememberedRejectionIsForgottenWhenTheStoreAnswers(t *testing.T) {
	clk := newClock()
	l := newLimiter(t, enforcement.Config{Authority: enforcement.NewMemoryAuthority(clk.Now, 1<<20), Policy: policyOf(10, 5), Now: clk.Now})
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		l.Check(ctx, req("k", 1))
	}
	clk.Add(200 * time.Millisecond) // 2 tokens back
	if d, _ := l.Check(ctx, req("k", 3)); d.Allowed || d.Source != enforcement.SourceLocal || d.RetryAfter != 100*time.Millisecond {
		t.Fatalf("3 tokens with 2 there: %+v, want a local rejection with 100ms", d)
	}
	if d, _ := l.Check(ctx, req("k", 1)); !d.Allowed {
		t.Fatalf("1 token with 2 there: %+v", d)
	}
	// 1 token left: 3 need 200ms now, not the 100ms remembered.
	if d, _ := l.Check(ctx, req("k", 3)); d.Allowed || d.RetryAfter != 200*time.Millisecond {
		t.Fatalf("3 tokens with 1 there: %+v, want a rejection with 200ms", d)
	}
}
