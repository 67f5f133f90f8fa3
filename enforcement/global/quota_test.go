package global_test

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/global"
	"github.com/ratewarden/ratewarden/limits"
)

// TestGlobalQuotaCountedAtTheHome: a global key's calendar quota is
// charged at the home with every lease, so three regions together admit
// no more than the quota, and once their idle pools are returned the
// home's counter is exactly what they admitted.
func TestGlobalQuotaCountedAtTheHome(t *testing.T) {
	home := startHome(t)
	regions := startRegions(t, home, "a", "b", "c")
	lim := enforcement.Limit{Rate: 1000, Burst: 500, QuotaLimit: 150, QuotaPeriod: limits.PeriodMonth, QuotaID: "tier:global"}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	cs := make([]counts, len(regions))
	for i, r := range regions {
		wg.Add(1)
		go func() { defer wg.Done(); load(ctx, r, "quota", lim, 2*time.Millisecond, &cs[i]) }()
	}
	eventually(t, 20*time.Second, "the quota spent", func() bool {
		var n int64
		for i := range cs {
			n += cs[i].allowed.Load()
		}
		return n >= lim.QuotaLimit
	})
	time.Sleep(500 * time.Millisecond) // more demand: nothing more admitted
	cancel()
	wg.Wait()
	var total int64
	for i := range cs {
		total += cs[i].allowed.Load()
	}
	if total != lim.QuotaLimit {
		t.Fatalf("admitted %d, quota %d", total, lim.QuotaLimit)
	}
	start, _ := lim.QuotaPeriod.Window(time.Now())
	rdb := client(t, home.Addr())
	eventually(t, 10*time.Second, "the home's counter equals what was admitted", func() bool {
		n, err := rdb.Get(context.Background(), limits.QuotaKey("t:g", "quota", lim.QuotaID, start)).Int64()
		return err == nil && n == total
	})
}

// TestEscrowSpendChargedToTheQuota: what a cut region admits on its
// escrow is charged to the home's quota counter once the home answers, so
// that the counter counts everything admitted in every region. It may
// count more, by one lease at most: a lease whose answer the cut lost may
// have run at the home (charged, never spent: the quota's favour).
func TestEscrowSpendChargedToTheQuota(t *testing.T) {
	home := startHome(t)
	regions := startRegions(t, home, "a", "b", "c")
	b := regions[1]
	lim := enforcement.Limit{Rate: 300, Burst: 150, QuotaLimit: 100000, QuotaPeriod: limits.PeriodMonth, QuotaID: "tier:global"}
	var before, during counts
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); load(ctx, b, "owed", lim, 2*time.Millisecond, &before) }()
	eventually(t, 10*time.Second, "region b admits from its pool", func() bool { return before.allowed.Load() > 50 })
	cancel()
	<-done
	if err := home.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	defer func() {
		if !thawed {
			home.Process().Signal(syscall.SIGCONT)
		}
	}()
	ctx, cancel = context.WithCancel(context.Background())
	done = make(chan struct{})
	go func() { defer close(done); load(ctx, b, "owed", lim, 2*time.Millisecond, &during) }()
	eventually(t, 10*time.Second, "decisions on the escrow", func() bool { return during.regional.Load() > 20 })
	cancel()
	<-done
	home.Process().Signal(syscall.SIGCONT)
	thawed = true
	total := before.allowed.Load() + during.allowed.Load()
	start, _ := lim.QuotaPeriod.Window(time.Now())
	rdb := client(t, home.Addr())
	var n int64
	key := limits.QuotaKey("t:g", "owed", lim.QuotaID, start)
	eventually(t, 20*time.Second, "the home's counter counts everything admitted, the pools back", func() bool {
		n, _ = rdb.Get(context.Background(), key).Int64()
		return n >= total && b.g.Status().PoolTokens == 0
	})
	time.Sleep(200 * time.Millisecond) // nothing more is charged
	n, _ = rdb.Get(context.Background(), key).Int64()
	t.Logf("admitted %d (%d on the escrow); the home counted %d", total, during.regional.Load(), n)
	if n < total || n > total+global.PoolMax(lim, 1) {
		t.Fatalf("the home counted %d for %d admitted: want at least that, and at most one lease more", n, total)
	}
}

// TestPoolQuotaCountFollowsAReturn: when an idle pool's tokens go back to
// the home, which refunds them to the quota, the pool's count of the
// quota follows, so that the region's decisions do not take the returned
// tokens for spent (nor warn of a soft limit for them).
func TestPoolQuotaCountFollowsAReturn(t *testing.T) {
	home := startHome(t)
	// Idle for 60 holds (1.2 s), the pool goes back whole.
	g := softRegion(t, home, "a", 1, 20*time.Millisecond)
	lim := enforcement.Limit{Rate: 1.0 / 3600, Burst: 10000, QuotaLimit: 1000, QuotaPeriod: limits.PeriodMonth, QuotaID: "tier:global"}
	ctx := context.Background()
	allowed := int64(0)
	for i := 0; allowed < 3; i++ {
		if i == 20 {
			t.Fatalf("%d allowed in 20 refill steps", allowed)
		}
		g.Tick(ctx)
		v, err := g.Take(ctx, "ret", "api", lim, softCost)
		if err != nil {
			t.Fatal(err)
		}
		if v.Allowed {
			allowed++
		}
	}
	g.Tick(ctx) // the demand is there: the pool leases again
	if p := g.Status().PoolTokens; p == 0 {
		t.Fatal("the pool leased nothing after the spending")
	}
	time.Sleep(1500 * time.Millisecond)
	g.Tick(ctx) // idle: everything goes back
	if p := g.Status().PoolTokens; p != 0 {
		t.Fatalf("the idle pool kept %d tokens", p)
	}
	v, err := g.Take(ctx, "ret", "api", lim, softCost)
	if err != nil {
		t.Fatal(err)
	}
	if v.Allowed || v.QuotaUsed != allowed*softCost {
		t.Fatalf("after the return: %+v; want a rejection with the quota used at what was admitted, %d", v, allowed*softCost)
	}
}
