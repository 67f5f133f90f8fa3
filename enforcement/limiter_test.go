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
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

func TestFloodIsRejectedLocallyWithoutStoreCalls(t *testing.T) {
	clk := newClock()
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 100)}
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
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 100)}
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: policyOf(10, 5), Now: clk.Now})
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		l.Check(ctx, req("k", 1))
	}
	// The shadow learned from the shared verdicts that the bucket is empty:
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
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 100)}
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
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 100)}
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
	l := newLimiter(t, enforcement.Config{Authority: enforcement.NewMemoryAuthority(clk.Now, 100), Policy: policyOf(100, 100), Now: clk.Now, IdleAfter: time.Second})
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
	l := newLimiter(t, enforcement.Config{Authority: enforcement.NewMemoryAuthority(clk.Now, 100), Policy: p, Now: clk.Now})
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
