package lease_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// fixedPolicy resolves every request to one limit.
type fixedPolicy struct{ lim enforcement.Limit }

func (p fixedPolicy) Resolve(_, _, tier string) (enforcement.Resolved, error) {
	return enforcement.Resolved{Limit: p.lim, Policy: "test", Tier: tier, Cost: 1}, nil
}

func client(tb testing.TB, r *testenv.Redis) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), PoolSize: 16, MaxRetries: -1})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// evalCalls is how many scripts the server ran: the real round-trip count.
func evalCalls(tb testing.TB, c *redis.Client) int64 {
	tb.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				v, _ := strconv.ParseInt(calls, 10, 64)
				n += v
			}
		}
	}
	return n
}

func TestLeaseScriptNeverGrantsMoreThanThere(t *testing.T) {
	r := testenv.StartRedis(t)
	c := client(t, r)
	s := redisstore.New(c, "t1")
	ctx := context.Background()
	lim := enforcement.Limit{Rate: 0.001, Burst: 10} // no refill to speak of during the test

	g, err := s.Lease(ctx, "k", "s", lim, 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	if g.Granted != 10 || g.Left != 0 {
		t.Fatalf("first lease of a full bucket of 10 asking for 100: granted %d left %d, want 10 and 0", g.Granted, g.Left)
	}
	g, err = s.Lease(ctx, "k", "s", lim, 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	if g.Granted != 0 || g.RetryAfter <= 0 {
		t.Fatalf("lease of an empty bucket: granted %d retry %v, want 0 and a wait", g.Granted, g.RetryAfter)
	}
	// A return refills the same bucket that Take (bucket.lua) spends.
	if _, err := s.Return(ctx, "k", "s", lim, 4); err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for range 6 {
		v, err := s.Take(ctx, "k", "s", lim, 1)
		if err != nil {
			t.Fatal(err)
		}
		if v.Allowed {
			allowed++
		}
	}
	if allowed != 4 {
		t.Fatalf("after returning 4 tokens Take allowed %d of 6, want 4", allowed)
	}
	// And a lease sees what Take spent: the bucket is empty again.
	if g, _ = s.Lease(ctx, "k", "s", lim, 1, 1); g.Granted != 0 {
		t.Fatalf("lease after Take emptied the bucket granted %d", g.Granted)
	}
	// A return never overfills.
	if _, err := s.Return(ctx, "k", "s", lim, 1000); err != nil {
		t.Fatal(err)
	}
	if g, _ = s.Lease(ctx, "k", "s", lim, 1, 1000); g.Granted != 10 {
		t.Fatalf("after returning 1000 into a bucket of 10, a lease got %d, want 10", g.Granted)
	}
	// A lease needing more than is there takes nothing.
	if _, err := s.Return(ctx, "k", "s", lim, 3); err != nil {
		t.Fatal(err)
	}
	if g, _ = s.Lease(ctx, "k", "s", lim, 5, 10); g.Granted != 0 {
		t.Fatalf("need 5 with 3 there: granted %d, want 0", g.Granted)
	}
	if g, _ = s.Lease(ctx, "k", "s", lim, 3, 10); g.Granted != 3 {
		t.Fatalf("need 3 with 3 there: granted %d, want 3", g.Granted)
	}
}

// instance is one limiter with its own Redis connection pool, as a separate
// process would have.
type instance struct {
	lim   *enforcement.Limiter
	lease *lease.Authority
	stop  func() error // ends lease.Run: the held tokens go back
	rdb   *redis.Client
}

// running runs a's sweeper (Run) until the returned stop, which ends it
// and returns what Run returned (every held token given back by then).
func running(t testing.TB, a *lease.Authority) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error { once.Do(func() { cancel(); err = <-errc }); return err }
	t.Cleanup(func() { _ = stop() })
	return stop
}

func newInstances(t *testing.T, r *testenv.Redis, n int, prefix string, lim enforcement.Limit, withLease bool, cfg lease.Config) []*instance {
	t.Helper()
	out := make([]*instance, n)
	for i := range out {
		c := client(t, r)
		store := redisstore.New(c, prefix)
		var auth enforcement.Authority = store
		in := &instance{rdb: c}
		if withLease {
			if cfg.Timeout == 0 {
				// A loaded CI machine can stall a call past the 5ms default;
				// these tests measure counts, not the failure path.
				cfg.Timeout = time.Second
			}
			in.lease = lease.New(store, store, cfg)
			in.stop = running(t, in.lease)
			auth = in.lease
		}
		l, err := enforcement.New(enforcement.Config{Authority: auth, Policy: fixedPolicy{lim}, ExpectedInstances: n})
		if err != nil {
			t.Fatal(err)
		}
		in.lim = l
		out[i] = in
	}
	return out
}

// drive sends perInstance decisions per second on key through every
// instance for d, and returns the admitted count per 100ms slot.
func drive(t *testing.T, ins []*instance, key string, perInstance float64, d time.Duration) (admitted []int64, sent int64) {
	t.Helper()
	slots := int(d/(100*time.Millisecond)) + 2
	counts := make([]atomic.Int64, slots)
	var total atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for _, in := range ins {
		for g := 0; g < 4; g++ { // several goroutines per instance: concurrent decisions
			wg.Add(1)
			go func() {
				defer wg.Done()
				rate := perInstance / 4
				var done int64
				for {
					el := time.Since(start)
					if el >= d {
						return
					}
					due := int64(el.Seconds() * rate)
					for ; done < due; done++ {
						dec, err := in.lim.Check(context.Background(), enforcement.Request{Key: key, Scope: "s", Cost: 1, HasCost: true})
						if err != nil {
							t.Error(err)
							return
						}
						total.Add(1)
						if dec.Allowed {
							counts[int(time.Since(start)/(100*time.Millisecond))].Add(1)
						}
					}
					time.Sleep(time.Millisecond)
				}
			}()
		}
	}
	wg.Wait()
	admitted = make([]int64, slots)
	for i := range counts {
		admitted[i] = counts[i].Load()
	}
	return admitted, total.Load()
}

func sum(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}

// TestOverAdmissionBound runs 4 independent limiters (own connection pools,
// own leases) on one key at 2× its limit, with leasing, against one
// redis-server. Over the whole run the admitted count stays within
// burst + rate × duration (leases are taken from the bucket); over any
// window after the start it stays within burst + rate × window +
// instances × block, the documented bound.
func TestOverAdmissionBound(t *testing.T) {
	r := testenv.StartRedis(t)
	const n = 4
	lim := enforcement.Limit{Rate: 1000, Burst: 200}
	cfg := lease.Config{Block: 50, MaxBlockFraction: 0.5, HotOpsPerSec: 100, MaxHold: 300 * time.Millisecond}
	ins := newInstances(t, r, n, "ob", lim, true, cfg)
	block := ins[0].lease.BlockFor(lim)
	if block != 50 {
		t.Fatalf("block %d, want 50", block)
	}
	d := 2 * time.Second
	admitted, sent := drive(t, ins, "hot", 2*lim.Rate/n, d)
	total := sum(admitted)
	capTotal := float64(lim.Burst) + lim.Rate*(d.Seconds()+0.1) // +0.1s: the last slot may end late
	t.Logf("sent %d, admitted %d, cap burst+rate×d = %.0f (%.3f of cap)", sent, total, capTotal, float64(total)/capTotal)
	if float64(total) > capTotal {
		t.Fatalf("admitted %d over the whole run, more than burst + rate × duration = %.0f", total, capTotal)
	}
	// Windows that start after leases are outstanding.
	bound := func(slotsN int) float64 {
		return float64(lim.Burst) + lim.Rate*float64(slotsN)*0.1 + n*float64(block)
	}
	worst := 0.0
	for w := 1; w <= 10; w++ {
		for i := 1; i+w <= len(admitted); i++ {
			got := float64(sum(admitted[i : i+w]))
			if got > bound(w) {
				t.Fatalf("window of %d00ms from slot %d admitted %.0f > bound %.0f", w, i, got, bound(w))
			}
			worst = max(worst, got/bound(w))
		}
	}
	t.Logf("worst window / bound = %.3f", worst)
	var st lease.Stats
	for _, in := range ins {
		s := in.lease.Stats()
		st.Decisions += s.Decisions
		st.Local += s.Local
		st.Leases += s.Leases
		st.Returns += s.Returns
		st.Direct += s.Direct
	}
	t.Logf("lease stats over 4 instances: %+v", st)
	if st.Leases == 0 || st.Local == 0 {
		t.Fatalf("the hot key was never leased: %+v", st)
	}
	// It also must not starve: at 2× the limit the fleet admits most of
	// what the bucket allows.
	if float64(total) < 0.8*capTotal {
		t.Fatalf("admitted %d, under 80%% of %.0f: leasing starves the key", total, capTotal)
	}
}

// TestRoundTripsPerDecision measures the server's own count of script
// calls for a hot key under its limit, with and without leasing.
func TestRoundTripsPerDecision(t *testing.T) {
	r := testenv.StartRedis(t)
	lim := enforcement.Limit{Rate: 1e6, Burst: 1e6}
	const decisions = 50000
	run := func(withLease bool, prefix string) float64 {
		ins := newInstances(t, r, 1, prefix, lim, withLease, lease.Config{Block: 100})
		before := evalCalls(t, ins[0].rdb)
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < decisions/8; i++ {
					d, err := ins[0].lim.Check(context.Background(), enforcement.Request{Key: "hot", Scope: "s", Cost: 1, HasCost: true})
					if err != nil || !d.Allowed {
						t.Errorf("decision %d: %v %+v", i, err, d)
						return
					}
				}
			}()
		}
		wg.Wait()
		if ins[0].lease != nil {
			if err := ins[0].stop(); err != nil {
				t.Fatal(err)
			}
			t.Logf("lease stats: %+v", ins[0].lease.Stats())
		}
		return float64(evalCalls(t, ins[0].rdb)-before) / decisions
	}
	without := run(false, "rt0")
	with := run(true, "rt1")
	t.Logf("round trips per decision: without leasing %.4f, with leasing %.4f (%.0f× fewer)", without, with, without/with)
	if without < 0.99 {
		t.Fatalf("without leasing %.3f round trips per decision, expected 1", without)
	}
	if with*50 > without {
		t.Fatalf("with leasing %.4f round trips per decision: fewer than 50× below %.3f", with, without)
	}
}

// TestReturnsOnCloseAndCoolDown: the unused remainder goes back.
func TestReturnsOnCloseAndCoolDown(t *testing.T) {
	r := testenv.StartRedis(t)
	c := client(t, r)
	store := redisstore.New(c, "rc")
	lim := enforcement.Limit{Rate: 0.001, Burst: 1000} // no refill to speak of
	ctx := context.Background()
	tokens := func(key string) float64 {
		b, found, err := redisstore.ReadBucket(ctx, c, store.BucketKey(key, "s"))
		if err != nil {
			t.Fatal(err)
		}
		if !found {
			return float64(lim.Burst)
		}
		return b.Tokens
	}

	// The detector runs on a clock the test steps, so the machine's speed
	// cannot decide what is hot.
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	a := lease.New(store, store, lease.Config{Block: 100, HotOpsPerSec: 30, Window: 200 * time.Millisecond,
		MaxHold: time.Hour, Tick: 20 * time.Millisecond, Now: clock})
	stop := running(t, a)
	for i := 0; i < 5; i++ {
		if _, err := a.Take(ctx, "closing", "s", lim, 1); err != nil {
			t.Fatal(err)
		}
	}
	if got := tokens("closing"); got < 995-0.01 || got > 995+0.01 {
		t.Fatalf("cold decisions: tokens %.3f, want 995", got)
	}
	// Hot now (6 in one window ≥ 30/s × 0.2s): the 6th decision leases.
	if _, err := a.Take(ctx, "closing", "s", lim, 1); err != nil {
		t.Fatal(err)
	}
	if got := tokens("closing"); got > 895+0.01 {
		t.Fatalf("after a lease: tokens %.3f, want ≤ 895 (100 leased)", got)
	}
	for i := 0; i < 10; i++ {
		if _, err := a.Take(ctx, "cooling", "s", lim, 1); err != nil {
			t.Fatal(err)
		}
	}
	if got := tokens("cooling"); got > 895+0.01 {
		t.Fatalf("cooling key after its lease: tokens %.3f, want ≤ 895", got)
	}
	// Both keys go quiet: a window later they have cooled, and the sweeper
	// returns what they hold.
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	deadline := time.Now().Add(testenv.Timeout(10 * time.Second))
	for tokens("cooling") < 990-0.01 {
		if time.Now().After(deadline) {
			t.Fatalf("cooled key never returned its lease: tokens %.3f", tokens("cooling"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A key holding a lease when Run ends: Run gives it back.
	for i := 0; i < 6; i++ {
		if _, err := a.Take(ctx, "held", "s", lim, 1); err != nil {
			t.Fatal(err)
		}
	}
	if got := tokens("held"); got > 895+0.01 {
		t.Fatalf("held key: tokens %.3f, want ≤ 895 (a lease outstanding)", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]float64{"held": 994, "closing": 994, "cooling": 990} {
		if got := tokens(key); got < want-0.01 {
			t.Fatalf("after Run: %s has %.3f tokens, want %.0f (what was spent gone, the rest returned)", key, got, want)
		}
	}
	// After Run decisions still work, straight through.
	if v, err := a.Take(ctx, "held", "s", lim, 1); err != nil || !v.Allowed {
		t.Fatalf("after Run: %+v %v", v, err)
	}
	st := a.Stats()
	if st.Returns == 0 {
		t.Fatalf("no returns counted: %+v", st)
	}
}

// TestDeadStoreFallsThrough: when a lease call fails, the key's decisions go
// to the next authority (normally the guard, whose breaker fails fast) for
// FailBackoff instead of each trying to lease from a dead store.
func TestDeadStoreFallsThrough(t *testing.T) {
	r := testenv.StartRedis(t)
	c := client(t, r)
	store := redisstore.New(c, "dead")
	// A lease deadline a loaded machine cannot miss: the failure below is
	// the dead store's, never a slow scheduler's.
	a := lease.New(store, store, lease.Config{HotOpsPerSec: 1, Block: 5, MaxBlockFraction: 1, FailBackoff: time.Hour,
		Timeout: 5 * time.Second})
	running(t, a)
	ctx := context.Background()
	lim := enforcement.Limit{Rate: 1, Burst: 100}
	for i := 0; i < 5; i++ { // hot at once; one lease of 5 covers these
		if v, err := a.Take(ctx, "k", "s", lim, 1); err != nil || !v.Allowed {
			t.Fatalf("take %d: %+v %v", i, v, err)
		}
	}
	if st := a.Stats(); st.Leases != 1 || st.Local != 4 {
		t.Fatalf("before the failure: %+v, want one lease and 4 local decisions", st)
	}
	r.Close()
	if _, err := a.Take(ctx, "k", "s", lim, 1); err == nil {
		t.Fatal("a dead store must surface as an error (the limiter's failure policy acts on it)")
	}
	for i := 0; i < 3; i++ {
		_, _ = a.Take(ctx, "k", "s", lim, 1)
	}
	st := a.Stats()
	if st.Failures != 1 || st.Leases != 2 || st.Direct != 4 {
		t.Fatalf("after the failure: %+v, want 1 failed lease, then every decision passed through", st)
	}
}
