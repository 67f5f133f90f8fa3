package enforcement_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// quotaPolicy: a bucket that never binds (rate 1000/s, burst 1000) and a
// monthly quota of 100.
func quotaPolicy(denyUnknown bool) fixedPolicy {
	return fixedPolicy{enforcement.Resolved{Limit: enforcement.Limit{Rate: 1000, Burst: 1000,
		QuotaLimit: 100, QuotaPeriod: enforcement.PeriodMonth, QuotaID: "tier:t", QuotaDenyUnknown: denyUnknown},
		Policy: "p", Tier: "t", Cost: 1}}
}

// spend makes n decisions of cost 1 and returns how many were allowed,
// failing on any decision not from want.
func spend(t *testing.T, l *enforcement.Limiter, key string, n int, want enforcement.Source) int {
	t.Helper()
	allowed := 0
	for i := 0; i < n; i++ {
		d, err := l.Check(context.Background(), req(key, 1))
		if err != nil {
			t.Fatal(err)
		}
		if d.Source != want && !(d.Source == enforcement.SourceLocal && !d.Allowed) {
			t.Fatalf("decision %d of %s: source %s, want %s", i, key, d.Source, want)
		}
		if d.Allowed {
			allowed++
		}
	}
	return allowed
}

func TestDegradedSpendsOnlyItsShareOfTheLastKnownQuota(t *testing.T) {
	clk := newClock()
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<20)}
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: quotaPolicy(false), ExpectedInstances: 2, Now: clk.Now})

	if got := spend(t, l, "k", 40, enforcement.SourceShared); got != 40 {
		t.Fatalf("shared: allowed %d of 40", got)
	}
	auth.down.Store(true)
	// 60 left, two instances: this one may spend 30.
	if got := spend(t, l, "k", 100, enforcement.SourceDegraded); got != 30 {
		t.Fatalf("degraded: allowed %d, want its share 30 of the 60 the store said were left", got)
	}
	d, _ := l.Check(context.Background(), req("k", 1))
	month := time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC).Sub(clk.Now())
	if d.Allowed || d.RetryAfter != month || d.Remaining != 0 {
		t.Fatalf("quota share spent: %+v, want a rejection until the month ends (%s) with 0 remaining", d, month)
	}

	// The store comes back (it never saw the 30) and takes 10 more: 50 of
	// 100 recorded. The next outage's share is 25, of which this instance
	// already spent 30 unrecorded: nothing.
	auth.down.Store(false)
	clk.Add(time.Second)
	if got := spend(t, l, "k", 10, enforcement.SourceShared); got != 10 {
		t.Fatalf("shared after recovery: allowed %d of 10", got)
	}
	auth.down.Store(true)
	if got := spend(t, l, "k", 20, enforcement.SourceDegraded); got != 0 {
		t.Fatalf("second outage: allowed %d, want 0 (30 already spent unrecorded ≥ share 25)", got)
	}

	// A new month: the unrecorded spend and the count belong to the old one.
	clk.Add(month)
	if got := spend(t, l, "k", 100, enforcement.SourceDegraded); got != 50 {
		t.Fatalf("new month, never reported: allowed %d, want the share of the whole quota, 50", got)
	}
}

func TestDegradedQuotaForAKeyNeverSeen(t *testing.T) {
	for _, tc := range []struct {
		deny bool
		want int
	}{{false, 25}, {true, 0}} {
		clk := newClock()
		auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<20)}
		auth.down.Store(true)
		l := newLimiter(t, enforcement.Config{Authority: auth, Policy: quotaPolicy(tc.deny), ExpectedInstances: 4, Now: clk.Now})
		if got := spend(t, l, "new", 100, enforcement.SourceDegraded); got != tc.want {
			t.Fatalf("deny unknown %v: allowed %d, want %d", tc.deny, got, tc.want)
		}
	}
}

func TestDegradedQuotaIsSharedAcrossScopes(t *testing.T) {
	clk := newClock()
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<20)}
	auth.down.Store(true)
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: quotaPolicy(false), Now: clk.Now})
	allowed := 0
	for _, scope := range []string{"a", "b", "c"} {
		for i := 0; i < 100; i++ {
			d, err := l.Check(context.Background(), enforcement.Request{Key: "k", Scope: scope, Cost: 1, HasCost: true})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				allowed++
			}
		}
	}
	if allowed != 100 {
		t.Fatalf("three scopes of one quota allowed %d while degraded, want the quota's 100 once", allowed)
	}
}

// cancellingAuthority fails as a store call does when its caller's context
// ends first.
type cancellingAuthority struct{ next enforcement.Authority }

func (a cancellingAuthority) Take(ctx context.Context, key, scope string, lim enforcement.Limit, cost int64) (enforcement.Verdict, error) {
	if err := ctx.Err(); err != nil {
		return enforcement.Verdict{}, err
	}
	return a.next.Take(ctx, key, scope, lim, cost)
}

func TestCallerCancellationIsNotAStoreFailure(t *testing.T) {
	clk := newClock()
	obs := &observer{}
	l := newLimiter(t, enforcement.Config{Authority: cancellingAuthority{enforcement.NewMemoryAuthority(clk.Now, 1<<20)},
		Policy: policyOf(1, 10), Observer: obs, Now: clk.Now})
	// Learn that the bucket is empty.
	if d, _ := l.Check(context.Background(), req("k", 10)); !d.Allowed {
		t.Fatalf("first: %+v", d)
	}
	clk.Add(1500 * time.Millisecond) // 1.5 tokens: a cost of 1 goes to the store

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := l.Check(ctx, req("k", 1))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled caller's decision: err %v, want context.Canceled", err)
	}
	// What the limiter learned is intact: a cost of 2 is still known to be
	// unaffordable and is rejected in process.
	if d, _ := l.Check(context.Background(), req("k", 2)); d.Allowed || d.Source != enforcement.SourceLocal {
		t.Fatalf("after the cancellation: %+v, want a local rejection from what was learned", d)
	}
	if obs.failed.Load() != 0 || l.StoreFailing() {
		t.Fatalf("a caller's cancellation was counted as a store failure (failed %d, store failing %v)", obs.failed.Load(), l.StoreFailing())
	}
	if v, ok := obs.bySource.Load(enforcement.SourceDegraded); ok && v.(interface{ Load() int64 }).Load() > 0 {
		t.Fatal("a caller's cancellation produced a degraded decision")
	}
}

func TestStoreFailingUntilTheStoreAnswers(t *testing.T) {
	clk := newClock()
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<20)}
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: policyOf(100, 100), Now: clk.Now})
	spend(t, l, "k", 1, enforcement.SourceShared)
	if l.StoreFailing() {
		t.Fatal("store failing after a shared decision")
	}
	auth.down.Store(true)
	clk.Add(time.Millisecond)
	spend(t, l, "k", 1, enforcement.SourceDegraded)
	if !l.StoreFailing() {
		t.Fatal("one degraded decision: the store's latest call failed, readiness must say so")
	}
	auth.down.Store(false)
	clk.Add(time.Millisecond)
	spend(t, l, "k", 1, enforcement.SourceShared)
	if l.StoreFailing() {
		t.Fatal("store still failing after it answered")
	}
}

// leasedAuthority answers as a lease does: from tokens held in process.
type leasedAuthority struct{}

func (leasedAuthority) Take(context.Context, string, string, enforcement.Limit, int64) (enforcement.Verdict, error) {
	return enforcement.Verdict{Allowed: true, Remaining: 5, Now: time.Now(), InProcess: true}, nil
}

func TestLeasedDecisionIsLocal(t *testing.T) {
	l := newLimiter(t, enforcement.Config{Authority: leasedAuthority{}, Policy: policyOf(100, 100)})
	d, err := l.Check(context.Background(), req("k", 1))
	if err != nil || d.Source != enforcement.SourceLocal || !d.Allowed {
		t.Fatalf("decision from leased tokens: %+v %v, want allowed with source local", d, err)
	}
}

func TestInstancesFollowTheFleet(t *testing.T) {
	clk := newClock()
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<20)}
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: policyOf(100, 200), ExpectedInstances: 2, Now: clk.Now})
	lim := enforcement.Limit{Rate: 100, Burst: 200}
	if got := l.Tightened(lim); got.Burst != 100 {
		t.Fatalf("before the first count: %+v, want the variable's 2 instances", got)
	}
	l.SetInstances(8)
	if got := l.Tightened(lim); got.Burst != 25 || got.Rate != 12.5 {
		t.Fatalf("8 instances: %+v, want rate 12.5 burst 25", got)
	}
	l.SetInstances(0) // no count: keep the last one
	if l.Instances() != 8 {
		t.Fatalf("instances %d after an invalid count, want 8", l.Instances())
	}
	l.SetInstances(1) // fewer than the operator's figure: the figure is the floor
	if l.Instances() != 2 {
		t.Fatalf("instances %d after a count of 1, want the floor 2", l.Instances())
	}
	l.SetInstances(8)
	auth.down.Store(true)
	if got := spend(t, l, "k", 100, enforcement.SourceDegraded); got != 25 {
		t.Fatalf("degraded at 8 instances: allowed %d, want 25", got)
	}
}

func TestRemainingReportsTheBindingConstraint(t *testing.T) {
	clk := newClock()
	l := newLimiter(t, enforcement.Config{Authority: enforcement.NewMemoryAuthority(clk.Now, 1<<20), Policy: quotaPolicy(false), Now: clk.Now})
	monthEnd := time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC)
	ctx := context.Background()
	// The bucket (1000) binds first: 10 spent, 990 in the bucket, 90 in the quota → the quota binds.
	d, _ := l.Check(ctx, req("k", 10))
	if !d.Allowed || d.Remaining != 90 || d.Limit != 100 || !d.ResetAt.Equal(monthEnd) {
		t.Fatalf("quota binding: %+v, want remaining 90 of the quota's 100, resetting at the month's end", d)
	}
	// Spend the quota: the rejection reports 0 of 100 until the month ends.
	l.Check(ctx, req("k", 90))
	d, _ = l.Check(ctx, req("k", 1))
	if d.Allowed || d.Remaining != 0 || d.Limit != 100 || !d.ResetAt.Equal(monthEnd) {
		t.Fatalf("quota spent: %+v, want 0 of 100 resetting at the month's end", d)
	}

	// A quota far larger than the bucket: the bucket binds and is reported.
	big := fixedPolicy{enforcement.Resolved{Limit: enforcement.Limit{Rate: 1, Burst: 10,
		QuotaLimit: 1000, QuotaPeriod: enforcement.PeriodMonth, QuotaID: "q"}, Policy: "p", Tier: "t", Cost: 1}}
	l2 := newLimiter(t, enforcement.Config{Authority: enforcement.NewMemoryAuthority(clk.Now, 1<<20), Policy: big, Now: clk.Now})
	d, _ = l2.Check(ctx, req("k", 4))
	if !d.Allowed || d.Remaining != 6 || d.Limit != 10 || !d.ResetAt.Equal(clk.Now().Add(4*time.Second)) {
		t.Fatalf("bucket binding: %+v, want 6 of 10, full again in 4 s", d)
	}
}
