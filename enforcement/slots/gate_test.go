package slots_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const gatePolicy = `version: 1
default_tier: free
priorities: { critical: 1, default: 0.75, sheddable: 0.5 }
tiers:
  free: { rate: 1000, burst: 1000 }
  reports: { concurrency: 4 }
  both: { rate: 0.001, burst: 2, concurrency: 4 }
`

// gateOn is a Gate in front of a limiter, both on the Redis at addr, under
// prefix: one limiter instance of a fleet.
func gateOn(t *testing.T, addr, prefix string, ttl time.Duration) (*slots.Gate, *redis.Client) {
	t.Helper()
	return gateVia(t, addr, prefix, ttl, "script")
}

// gateVia is gateOn whose slot calls go by transport via: "script", a
// script call of their own each, or "pipeline", in the auto-pipeline's
// batches (the limiter's).
func gateVia(t *testing.T, addr, prefix string, ttl time.Duration, via string) (*slots.Gate, *redis.Client) {
	t.Helper()
	p, err := policy.Parse([]byte(gatePolicy))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, prefix), Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	var store slots.Store = redisstore.NewConcurrency(rdb, prefix)
	if via == "pipeline" {
		pipe := redisstore.NewPipelined(rdb, prefix, redisstore.PipelineConfig{})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = pipe.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		store = pipe.Concurrency()
	}
	g, err := slots.NewGate(slots.Config{
		Next: lim, Policy: lim.Policy, Store: store,
		TTL: ttl, Timeout: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return g, rdb
}

func reportReq(key, priority string) enforcement.Request {
	return enforcement.Request{Key: key, Scope: "export", Tier: "reports", Priority: priority}
}

// TestGateConcurrencyAlone: a tier with concurrency alone admits N with
// leases, refuses the next with reason concurrency and an honest retry,
// and takes a slot given back by /release's path; a second release and a
// renew after it change nothing.
func TestGateConcurrencyAlone(t *testing.T) {
	r := testenv.StartRedis(t)
	g, _ := gateOn(t, r.Addr(), "alone", time.Minute)
	ctx := context.Background()
	var leases []string
	for i := range 4 {
		d, err := g.Check(ctx, reportReq("acct", "critical"))
		if err != nil || !d.Allowed || d.Lease == "" || !d.LeaseExpiresAt.After(time.Now()) || d.Limit != 4 || d.Remaining != int64(3-i) {
			t.Fatalf("check %d: %+v, %v", i, d, err)
		}
		leases = append(leases, d.Lease)
	}
	d, err := g.Check(ctx, reportReq("acct", "critical"))
	if err != nil || d.Allowed || d.Reason != enforcement.ReasonConcurrency || d.Lease != "" || d.RetryAfter <= 0 || d.RetryAfter > time.Minute {
		t.Fatalf("fifth: %+v, %v", d, err)
	}
	if end, err := g.Renew(ctx, leases[0]); err != nil || !end.After(time.Now()) {
		t.Fatalf("renew: %v, %v", end, err)
	}
	if freed, err := g.Release(ctx, leases[0]); err != nil || !freed {
		t.Fatalf("release: %v, %v", freed, err)
	}
	if d, err := g.Check(ctx, reportReq("acct", "critical")); err != nil || !d.Allowed {
		t.Fatalf("after a release: %+v, %v", d, err)
	}
	if freed, err := g.Release(ctx, leases[0]); err != nil || freed {
		t.Fatalf("second release: %v, %v", freed, err)
	}
	if d, err := g.Check(ctx, reportReq("acct", "critical")); err != nil || d.Allowed {
		t.Fatalf("a second release freed a slot: %+v, %v", d, err)
	}
	if _, err := g.Renew(ctx, leases[0]); !errors.Is(err, slots.ErrLeaseNotFound) {
		t.Fatalf("renew after release: %v", err)
	}
	if _, err := g.Release(ctx, "not-a-lease"); !errors.Is(err, slots.ErrInvalidLease) {
		t.Fatalf("a made-up id: %v", err)
	}
	if _, err := g.Check(ctx, reportReq("acct", "bulk")); !errors.Is(err, slots.ErrUnknownPriority) {
		t.Fatalf("an undefined class: %v", err)
	}
	// A tier without concurrency takes no slot.
	if d, err := g.Check(ctx, enforcement.Request{Key: "acct", Scope: "export"}); err != nil || !d.Allowed || d.Lease != "" {
		t.Fatalf("rate only: %+v, %v", d, err)
	}
}

// TestGatePriorities: sheddable traffic stops at its share with reason
// shed while critical traffic takes the rest; the default class stops at
// its own share.
func TestGatePriorities(t *testing.T) {
	r := testenv.StartRedis(t)
	g, _ := gateOn(t, r.Addr(), "prio", time.Minute)
	ctx := context.Background()
	admit := func(priority string) enforcement.Decision {
		t.Helper()
		d, err := g.Check(ctx, reportReq("shared", priority))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for i := range 2 { // sheddable: ⌊0.5 × 4⌋ = 2
		if d := admit("sheddable"); !d.Allowed {
			t.Fatalf("sheddable %d: %+v", i, d)
		}
	}
	if d := admit("sheddable"); d.Allowed || d.Reason != enforcement.ReasonShed || d.RetryAfter <= 0 {
		t.Fatalf("sheddable past its share: %+v", d)
	}
	if d := admit(""); !d.Allowed { // default: ⌊0.75 × 4⌋ = 3
		t.Fatalf("default: %+v", d)
	}
	if d := admit("default"); d.Allowed || d.Reason != enforcement.ReasonShed {
		t.Fatalf("default past its share: %+v", d)
	}
	if d := admit("critical"); !d.Allowed {
		t.Fatalf("critical: %+v", d)
	}
	if d := admit("critical"); d.Allowed || d.Reason != enforcement.ReasonConcurrency {
		t.Fatalf("critical past the limit: %+v", d)
	}
}

// TestGateRateFirst: beside a rate, the rate decides first (its rejection
// carries no reason), then the slot.
func TestGateRateFirst(t *testing.T) {
	r := testenv.StartRedis(t)
	g, _ := gateOn(t, r.Addr(), "both", time.Minute)
	ctx := context.Background()
	// critical: a class of share 1 has the whole burst (the default class
	// would leave its floor, a quarter of the burst: rateclass_test.go).
	req := enforcement.Request{Key: "k", Scope: "s", Tier: "both", Priority: "critical"}
	for i := range 2 {
		if d, err := g.Check(ctx, req); err != nil || !d.Allowed || d.Lease == "" {
			t.Fatalf("%d: %+v, %v", i, d, err)
		}
	}
	if d, err := g.Check(ctx, req); err != nil || d.Allowed || d.Reason != "" || d.Lease != "" {
		t.Fatalf("past the burst: %+v, %v", d, err)
	}
}

// TestGateStoreFrozen: Redis stops answering (SIGSTOP) while a lease is
// held. Renewals fail as errors, not as a lost lease; new requests are
// decided on the tightened in-process set, whose leases release locally.
// Redis's clock runs on while it is stopped: once it answers again, the
// lease that was not renewed has ended, its renew says so, its release
// frees nothing, and every slot is there for new requests. The same over
// both transports of the slot calls.
func TestGateStoreFrozen(t *testing.T) {
	for _, via := range []string{"script", "pipeline"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			r := testenv.StartRedis(t)
			g, rdb := gateVia(t, r.Addr(), "frozen", 5*time.Second, via)
			gateStoreFrozen(t, r, g, rdb)
		})
	}
}

func gateStoreFrozen(t *testing.T, r *testenv.Redis, g *slots.Gate, rdb *redis.Client) {
	ctx := context.Background()
	d, err := g.Check(ctx, reportReq("acct", "critical"))
	if err != nil || !d.Allowed || d.Lease == "" {
		t.Fatalf("before: %+v, %v", d, err)
	}
	if err := r.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = r.Process().Signal(syscall.SIGCONT)
		}
	}()
	if _, err := g.Renew(ctx, d.Lease); err == nil || errors.Is(err, slots.ErrLeaseNotFound) {
		t.Fatalf("renew with the store frozen: %v", err)
	}
	var local []string
	for i := range 4 { // one instance: the tightened ceiling is all 4
		dd, err := g.Check(ctx, reportReq("acct", "critical"))
		if err != nil || !dd.Allowed || dd.Source != enforcement.SourceDegraded || dd.Lease == "" {
			t.Fatalf("degraded %d: %+v, %v", i, dd, err)
		}
		local = append(local, dd.Lease)
	}
	if dd, err := g.Check(ctx, reportReq("acct", "critical")); err != nil || dd.Allowed || dd.Reason != enforcement.ReasonConcurrency {
		t.Fatalf("degraded past the ceiling: %+v, %v", dd, err)
	}
	if freed, err := g.Release(ctx, local[0]); err != nil || !freed {
		t.Fatalf("degraded release: %v, %v", freed, err)
	}
	// Wait, on the wall clock Redis reads at its next command, until the
	// lease has ended.
	deadline := time.Now().Add(time.Minute)
	for !time.Now().After(d.LeaseExpiresAt.Add(50 * time.Millisecond)) {
		if time.Now().After(deadline) {
			t.Fatal("never past the lease's end")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := r.Process().Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Renew(ctx, d.Lease); !errors.Is(err, slots.ErrLeaseNotFound) {
		t.Fatalf("renew after the freeze outlasted the lease: %v", err)
	}
	if freed, err := g.Release(ctx, d.Lease); err != nil || freed {
		t.Fatalf("release after the freeze: %v, %v", freed, err)
	}
	for i := range 4 {
		dd, err := g.Check(ctx, reportReq("acct", "critical"))
		if err != nil || !dd.Allowed || dd.Source == enforcement.SourceDegraded {
			t.Fatalf("after the freeze %d: %+v, %v", i, dd, err)
		}
	}
}

// TestGatesNeverOverN: four gates, each on its own client (four limiter
// instances), with several goroutines each, take and give back slots of
// one key; the store's own count, read by a watcher between their calls,
// never exceeds N, and no admission ever reports a negative remainder.
func TestGatesNeverOverN(t *testing.T) {
	r := testenv.StartRedis(t)
	const n = 4
	watch := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer watch.Close()
	view := redisstore.NewConcurrency(watch, "fleet")
	ctx := context.Background()
	var admitted atomic.Int64
	errs := make(chan error, 64)
	var wg sync.WaitGroup
	for range 4 {
		g, _ := gateOn(t, r.Addr(), "fleet", time.Minute)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for admitted.Load() < 400 {
					d, err := g.Check(ctx, reportReq("hot", "critical"))
					if err != nil {
						errs <- err
						return
					}
					if !d.Allowed {
						continue
					}
					admitted.Add(1)
					if d.Remaining < 0 || d.Source != enforcement.SourceShared {
						errs <- fmt.Errorf("admitted with %+v", d)
						return
					}
					if _, err := g.Release(ctx, d.Lease); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	stop := make(chan struct{})
	var watched sync.WaitGroup
	watched.Add(1)
	go func() {
		defer watched.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			h, err := view.Held(ctx, watch, "hot", "export")
			if err != nil {
				errs <- err
				return
			}
			if h > n {
				errs <- fmt.Errorf("the store holds %d slots of %d", h, n)
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	watched.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestGatePeekTakesNoSlot: a peek passes the gate without a slot and
// spends nothing; the checks after it still find the whole burst and
// every slot free.
func TestGatePeekTakesNoSlot(t *testing.T) {
	r := testenv.StartRedis(t)
	g, rdb := gateOn(t, r.Addr(), "peek", time.Minute)
	ctx := context.Background()
	req := enforcement.Request{Key: "k", Scope: "s", Tier: "both", Priority: "critical"} // the whole burst, as in TestGateRateFirst
	peek := req
	peek.Peek = true
	for i := range 6 {
		d, err := g.Check(ctx, peek)
		if err != nil || !d.Allowed || d.Lease != "" {
			t.Fatalf("peek %d: %+v, %v", i, d, err)
		}
	}
	slotKey := keyslot.SlotSetKey("peek", "k", "s")
	if n, err := rdb.ZCard(ctx, slotKey).Result(); err != nil || n != 0 {
		t.Fatalf("slots held after the peeks: %d, %v", n, err)
	}
	for i := range 2 {
		if d, err := g.Check(ctx, req); err != nil || !d.Allowed || d.Lease == "" {
			t.Fatalf("check %d after the peeks: %+v, %v", i, d, err)
		}
	}
	if n, err := rdb.ZCard(ctx, slotKey).Result(); err != nil || n != 2 {
		t.Fatalf("slots held after two checks: %d, %v", n, err)
	}
}
