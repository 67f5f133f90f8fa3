package global_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/global"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// The tests below run three "regions" in one process: each its own
// redis-server and Global (pools, refiller), all sharing one home
// redis-server. The home is frozen (SIGSTOP) for a partition.

type region struct {
	name  string
	redis *testenv.Redis
	g     *global.Global
	stop  context.CancelFunc
	done  chan struct{}
}

func client(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second,
		ReadTimeout: time.Second, WriteTimeout: time.Second, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

func startRegions(t testing.TB, home *testenv.Redis, names ...string) []*region {
	t.Helper()
	out := make([]*region, len(names))
	for i, name := range names {
		r := testenv.StartRedis(t)
		g, err := global.New(global.Config{
			Region: name, Regions: len(names),
			Local: client(t, r.Addr()), Home: client(t, home.Addr()),
			Prefix: "t", HomePrefix: "t", Member: name + "-1",
			// Loaded machine: generous deadlines on loopback.
			Timeout: time.Second, HomeTimeout: 300 * time.Millisecond,
			// A pool idle for 60 holds (3 s) goes back whole.
			Hold: 50 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		reg := &region{name: name, redis: r, g: g, stop: cancel, done: make(chan struct{})}
		go func() { defer close(reg.done); _ = g.Run(ctx) }()
		t.Cleanup(reg.halt)
		out[i] = reg
	}
	return out
}

func (r *region) halt() {
	r.stop()
	<-r.done
}

// load asks region r for one token of (key, "api") every gap until ctx
// ends, counting what was allowed and how (global or regional).
type counts struct{ allowed, regional, rejected, errors atomic.Int64 }

func load(ctx context.Context, r *region, key string, lim enforcement.Limit, gap time.Duration, c *counts) {
	for ctx.Err() == nil {
		v, err := r.g.Take(context.Background(), key, "api", lim, 1)
		switch {
		case err != nil:
			c.errors.Add(1)
		case v.Allowed && v.Regional:
			c.regional.Add(1)
			c.allowed.Add(1)
		case v.Allowed:
			c.allowed.Add(1)
		default:
			c.rejected.Add(1)
		}
		time.Sleep(gap)
	}
}

func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(within))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// bound is the over-admission bound of the package doc for n regions and
// no cut: burst + rate × d + n × pool_max (pool_max at the largest
// horizon).
func bound(lim enforcement.Limit, d time.Duration, n int) float64 {
	return float64(lim.Burst) + lim.Rate*d.Seconds() + float64(n)*float64(global.PoolMax(lim, 1))
}

// TestGlobalLimitHeldAcrossThreeRegions: three regions, each with demand
// well above the whole limit, admit together no more than the bound; each
// admits something (the budget is shared, not taken by one).
func TestGlobalLimitHeldAcrossThreeRegions(t *testing.T) {
	home := testenv.StartRedis(t)
	regions := startRegions(t, home, "a", "b", "c")
	lim := enforcement.Limit{Rate: 200, Burst: 100}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	cs := make([]counts, len(regions))
	start := time.Now()
	for i, r := range regions {
		wg.Add(1)
		go func() { defer wg.Done(); load(ctx, r, "acct", lim, 2*time.Millisecond, &cs[i]) }()
	}
	time.Sleep(3 * time.Second)
	cancel()
	wg.Wait()
	d := time.Since(start)
	var total int64
	for i := range cs {
		a := cs[i].allowed.Load()
		total += a
		if cs[i].regional.Load() != 0 {
			t.Errorf("region %s decided %d on its escrow with the home up", regions[i].name, cs[i].regional.Load())
		}
		t.Logf("region %s: allowed %d rejected %d errors %d", regions[i].name, a, cs[i].rejected.Load(), cs[i].errors.Load())
	}
	b := bound(lim, d, len(regions))
	t.Logf("admitted %d in %v; ideal bucket %0.f; bound %.0f", total, d, float64(lim.Burst)+lim.Rate*d.Seconds(), b)
	if float64(total) > b {
		t.Fatalf("admitted %d in %v, over the bound %.0f", total, d, b)
	}
	eventually(t, 10*time.Second, "idle pools returned", func() bool {
		for _, r := range regions {
			if r.g.Status().PoolTokens != 0 {
				return false
			}
		}
		return true
	})
}

// TestDemandMovesBetweenRegions: all demand in region a, then all of it
// in region b: b gets the budget (a's idle pool goes back) and admits at
// about the limit's rate, eventually within a generous deadline (the real
// figure is BenchmarkDemandShift's).
func TestDemandMovesBetweenRegions(t *testing.T) {
	home := testenv.StartRedis(t)
	regions := startRegions(t, home, "a", "b", "c")
	lim := enforcement.Limit{Rate: 200, Burst: 100}
	var ca, cb counts
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); load(ctx, regions[0], "mover", lim, 2*time.Millisecond, &ca) }()
	eventually(t, 10*time.Second, "region a admits", func() bool { return ca.allowed.Load() > 200 })
	cancel()
	<-done
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go load(ctx, regions[1], "mover", lim, 2*time.Millisecond, &cb)
	eventually(t, 10*time.Second, "region a's pool handed back (all but its floor)", func() bool { return regions[0].g.Status().PoolTokens <= 1 })
	// b admits at no less than half the limit's rate over a 500ms window.
	eventually(t, 20*time.Second, "region b admits at the limit's rate", func() bool {
		before := cb.allowed.Load()
		time.Sleep(500 * time.Millisecond)
		return float64(cb.allowed.Load()-before) >= 0.5*lim.Rate*0.5
	})
}

// TestCutRegionFallsToEscrowAndRejoins: the home frozen, a region decides
// on what its pool holds, then on its escrow (marked regional, within
// burst/N + rate/N × cut), reports the home unreachable, and rejoins by
// itself once the home answers again.
func TestCutRegionFallsToEscrowAndRejoins(t *testing.T) {
	home := testenv.StartRedis(t)
	regions := startRegions(t, home, "a", "b", "c")
	b := regions[1]
	lim := enforcement.Limit{Rate: 300, Burst: 150}
	var before counts
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); load(ctx, b, "cut", lim, 2*time.Millisecond, &before) }()
	eventually(t, 10*time.Second, "region b admits from its pool", func() bool { return before.allowed.Load() > 100 })
	cancel()
	<-done
	pool := b.g.Status().PoolTokens

	if err := home.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = home.Process().Signal(syscall.SIGCONT)
		}
	}
	defer resume()
	var during counts
	ctx, cancel = context.WithCancel(context.Background())
	done = make(chan struct{})
	cutAt := time.Now()
	go func() { defer close(done); load(ctx, b, "cut", lim, 2*time.Millisecond, &during) }()
	eventually(t, 10*time.Second, "the home reported unreachable", func() bool { return b.g.Status().Global == "unreachable" })
	eventually(t, 10*time.Second, "decisions on the escrow, marked regional", func() bool { return during.regional.Load() > 0 })
	time.Sleep(time.Second)
	cancel()
	<-done
	cut := time.Since(cutAt)
	erate, eburst := lim.Rate/3, lim.Burst/3
	limit := float64(pool) + float64(global.PoolMax(lim, 1)) + float64(eburst) + erate*cut.Seconds()
	t.Logf("cut %v: allowed %d (regional %d); pool before %d; bound %.0f", cut, during.allowed.Load(), during.regional.Load(), pool, limit)
	if float64(during.allowed.Load()) > limit {
		t.Fatalf("cut region admitted %d, over pool + escrow %.0f", during.allowed.Load(), limit)
	}
	if s := b.g.Status(); s.Cause == "" || s.Name != "b" || s.Regions != 3 {
		t.Errorf("status while cut: %+v", s)
	}

	resume()
	eventually(t, 10*time.Second, "the home reachable again", func() bool { return b.g.Status().Global == "ok" })
	var after counts
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go load(ctx, b, "cut", lim, 2*time.Millisecond, &after)
	eventually(t, 10*time.Second, "decisions from the pool again", func() bool { return after.allowed.Load() > 50 })
	if n := after.regional.Load(); n != 0 {
		t.Errorf("%d decisions on the escrow after the heal", n)
	}
}

// TestDeadRegionsTokensComeBack: a region whose pool holds tokens dies
// (its refiller and its Redis gone): the global bucket gets them back by
// its refill, within pool ÷ rate, so another region admits at the
// limit's rate again.
func TestDeadRegionsTokensComeBack(t *testing.T) {
	home := testenv.StartRedis(t)
	regions := startRegions(t, home, "a", "c")
	a, c := regions[0], regions[1]
	lim := enforcement.Limit{Rate: 200, Burst: 100}
	var cc counts
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); load(ctx, c, "dead", lim, 2*time.Millisecond, &cc) }()
	eventually(t, 10*time.Second, "region c holds a pool", func() bool { return c.g.Status().PoolTokens > 0 })
	c.redis.Process().Kill() // the region's Redis dies with the pool...
	cancel()
	<-done
	c.halt() // ...and its limiters
	var ca counts
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go load(ctx, a, "dead", lim, 2*time.Millisecond, &ca)
	eventually(t, 20*time.Second, "region a admits at the limit's rate", func() bool {
		before := ca.allowed.Load()
		time.Sleep(500 * time.Millisecond)
		return float64(ca.allowed.Load()-before) >= 0.5*lim.Rate*0.5
	})
}

// BenchmarkDemandShift measures how long the budget takes to follow all
// demand jumping from region a to region b: from the jump to b's first
// 100 ms at ≥ 90% of the limit's rate.
func BenchmarkDemandShift(b *testing.B) {
	home := testenv.StartRedis(b)
	regions := startRegions(b, home, "a", "b")
	lim := enforcement.Limit{Rate: 200, Burst: 100} // a rate the load below offers 5× over
	var total time.Duration
	for i := 0; i < b.N; i++ {
		key := fmt.Sprintf("shift-%d", i)
		var ca, cb counts
		ctx, cancel := context.WithCancel(context.Background())
		go load(ctx, regions[0], key, lim, 500*time.Microsecond, &ca)
		time.Sleep(time.Second)
		cancel()
		jump := time.Now()
		ctx, cancel = context.WithCancel(context.Background())
		go load(ctx, regions[1], key, lim, 500*time.Microsecond, &cb)
		for time.Since(jump) < 10*time.Second {
			before := cb.allowed.Load()
			time.Sleep(100 * time.Millisecond)
			if float64(cb.allowed.Load()-before) >= 0.9*lim.Rate*0.1 {
				break
			}
		}
		total += time.Since(jump)
		cancel()
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/shift")
}

func startHome(t testing.TB) *testenv.Redis { return testenv.StartRedis(t) }

// TestBreakerFailsFastOnADeadRegionalRedis: once the region's Redis has
// failed BreakerFailures decisions in a row, decisions fail at once.
func TestBreakerFailsFastOnADeadRegionalRedis(t *testing.T) {
	home := startHome(t)
	r := testenv.StartRedis(t)
	g, err := global.New(global.Config{Region: "a", Regions: 1, Local: client(t, r.Addr()), Home: client(t, home.Addr()),
		Member: "a-1", Timeout: 200 * time.Millisecond, BreakerFailures: 3, BreakerOpenFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	lim := enforcement.Limit{Rate: 10, Burst: 10}
	if _, err := g.Take(context.Background(), "k", "s", lim, 1); err != nil {
		t.Fatal(err)
	}
	r.Process().Kill()
	for i := 0; i < 3; i++ {
		if _, err := g.Take(context.Background(), "k", "s", lim, 1); err == nil {
			t.Fatal("a decision on a dead Redis succeeded")
		}
	}
	_, err = g.Take(context.Background(), "k", "s", lim, 1)
	if err == nil || !strings.Contains(err.Error(), "breaker open") {
		t.Fatalf("after 3 failures: %v", err)
	}
}
