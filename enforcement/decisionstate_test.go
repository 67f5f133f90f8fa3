package enforcement_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// Bucket and Quota report the bucket and the quota one by one on every
// path (shared, local rejection, degraded), while Limit, Remaining and
// ResetAt report whichever binds.
func TestDecisionReportsBucketAndQuotaApart(t *testing.T) {
	clk := newClock()
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<20)}
	// bucket 1000 at 1000/s, monthly quota 100 (quotaPolicy): the quota binds.
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: quotaPolicy(false), Now: clk.Now})
	_, monthEnd := enforcement.PeriodMonth.Window(clk.Now())

	d, err := l.Check(context.Background(), req("k", 10))
	if err != nil {
		t.Fatal(err)
	}
	if d.Source != enforcement.SourceShared || d.Limit != 100 || d.Remaining != 90 || !d.ResetAt.Equal(monthEnd) {
		t.Fatalf("shared: the quota binds: %+v", d)
	}
	if b := d.Bucket; b.Rate != 1000 || b.Burst != 1000 || b.Remaining != 990 || !b.ResetAt.After(clk.Now()) || b.ResetAt.After(clk.Now().Add(20*time.Millisecond)) {
		t.Fatalf("shared: bucket %+v", b)
	}
	if q := d.Quota; q.Limit != 100 || q.Period != enforcement.PeriodMonth || !q.Known || q.Remaining != 90 || !q.ResetAt.Equal(monthEnd) {
		t.Fatalf("shared: quota %+v", q)
	}

	// A bucket alone (no quota): Bucket is the decision's own view.
	l2 := newLimiter(t, enforcement.Config{Authority: enforcement.NewMemoryAuthority(clk.Now, 1<<20), Policy: policyOf(1, 3), Now: clk.Now})
	for i := 0; i < 3; i++ {
		l2.Check(context.Background(), req("b", 1))
	}
	var rej enforcement.Decision
	for i := 0; i < 5 && rej.Source != enforcement.SourceLocal; i++ { // until the local tier answers the flood
		if rej, err = l2.Check(context.Background(), req("b", 1)); err != nil {
			t.Fatal(err)
		}
	}
	if rej.Allowed || rej.Source != enforcement.SourceLocal || rej.Quota != (enforcement.QuotaState{}) ||
		rej.Bucket.Rate != 1 || rej.Bucket.Burst != 3 || rej.Bucket.Remaining != rej.Remaining || !rej.Bucket.ResetAt.Equal(rej.ResetAt) {
		t.Fatalf("local rejection: %+v", rej)
	}

	// Degraded: the tightened bucket (one instance: the same limits) and
	// this instance's share of the quota.
	auth.down.Store(true)
	d, err = l.Check(context.Background(), req("k", 10))
	if err != nil {
		t.Fatal(err)
	}
	if d.Source != enforcement.SourceDegraded || d.Bucket.Burst == 0 || d.Bucket.Rate == 0 ||
		!d.Quota.Known || d.Quota.Remaining != d.Remaining || !d.Quota.ResetAt.Equal(monthEnd) {
		t.Fatalf("degraded: %+v", d)
	}
}
