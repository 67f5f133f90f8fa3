package lease_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestReserveSettleBesideALease: on a hot key whose decisions spend a
// leased block, reservations and settles go to the Redis bucket itself
// (the limiter does not send them through the lease). A settle that takes
// the bucket into debt refuses the next lease; once every lease is back,
// the bucket holds exactly burst − Σ admitted decisions − Σ actual costs.
func TestReserveSettleBesideALease(t *testing.T) {
	r := testenv.StartRedis(t)
	c := client(t, r)
	s := redisstore.NewShared(c, redisstore.SharedConfig{Prefix: "leaseres",
		Guard: redisstore.GuardSettings{Timeout: 5 * time.Second, MaxWait: time.Minute}})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })
	a := lease.New(s, s, lease.Config{Block: 50, HotOpsPerSec: 1, Timeout: 5 * time.Second, MaxHold: time.Hour})
	stop := running(t, a)
	lim := enforcement.Limit{Rate: 1e-6, Burst: 1000}
	bg := context.Background()

	admitted := int64(0)
	take := func(n int) {
		for range n {
			v, err := a.Take(bg, "hot", "s", lim, 1)
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed {
				admitted++
			}
		}
	}
	take(200) // hot: decided from leased blocks
	if a.Stats().Leases == 0 {
		t.Fatalf("no lease was taken: %+v", a.Stats())
	}
	v, err := s.Reserve(bg, "hot", "s", lim, 100, "r1", time.Minute)
	if err != nil || !v.Allowed {
		t.Fatalf("reserve beside a lease: %+v, %v", v, err)
	}
	st, err := s.Settle(bg, "hot", "s", "r1", lim, 1500, false, time.Minute) // far beyond what is left: debt
	if err != nil || st.Debt == 0 {
		t.Fatalf("settle into debt: %+v, %v", st, err)
	}
	spent := int64(1500)
	take(200) // the blocks held are spent; no new lease while in debt
	g, err := s.Lease(bg, "hot", "s", lim, 1, 50)
	if err != nil || g.Granted != 0 {
		t.Fatalf("a lease on a bucket in debt: %+v, %v", g, err)
	}
	if err := stop(); err != nil { // every unused leased token goes back
		t.Fatal(err)
	}
	b, found, err := redisstore.ReadBucket(bg, c, s.Store().BucketKey("hot", "s"))
	if err != nil || !found {
		t.Fatalf("bucket: %v (found %v)", err, found)
	}
	want := float64(lim.Burst - admitted - spent)
	if math.Abs(b.Tokens-want) > 0.01 {
		t.Fatalf("bucket %.6f, want %d − %d admitted − %d actual = %.0f", b.Tokens, lim.Burst, admitted, spent, want)
	}
	t.Logf("admitted %d from leases, settled %d actual: bucket %.3f", admitted, spent, b.Tokens)
}
