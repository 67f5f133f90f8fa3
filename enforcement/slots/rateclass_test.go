package slots_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// rateClassPolicy: a rate alone, burst 100, refilling one token in 1,000
// s, so that no test run sees a refill: what a class got is what it spent.
const rateClassPolicy = `version: 1
default_tier: api
priorities: { critical: 1, default: 0.8, sheddable: 0.5 }
tiers:
  api: { rate: 0.001, burst: 100 }
`

// countSlots is a slots.Observer that counts shed and admitted decisions
// per class (the counts limitmetrics.Slots makes metrics of).
type countSlots struct {
	mu sync.Mutex
	n  map[[2]string]int
}

func (c *countSlots) Slot(outcome, priority string, _ enforcement.Source) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[[2]string{outcome, priority}]++
}

func (c *countSlots) Return(string) {}

func (c *countSlots) get(outcome, priority string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[[2]string{outcome, priority}]
}

// rateGate is a Gate over a limiter on the Redis at addr, under prefix,
// with policy src, counting its decisions in obs.
func rateGate(t *testing.T, addr, prefix, src string, obs slots.Observer) *slots.Gate {
	t.Helper()
	p, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, prefix), Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	g, err := slots.NewGate(slots.Config{Next: lim, Policy: lim.Policy, Store: redisstore.NewConcurrency(rdb, prefix),
		TTL: time.Minute, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestCriticalKeepsItsRateShareUnderOverload: 500 sheddable requests (5 ×
// the burst of 100, share 0.5) flood one key's bucket from 50 goroutines
// while 50 critical requests (its guaranteed (1 − 0.5) × 100) arrive among
// them. Every critical request must be admitted, by construction and not
// by timing: a sheddable request is admitted only if it leaves 50 tokens,
// so the last 50 are always critical's (and nothing refills during the
// test). The figure is critical admitted ÷ guaranteed (goal ≥ 0.98); the
// flood must have been shed (reason shed, with a retry time) and counted
// as shed, and never have taken more than its share. (Most of the flood
// is refused in process by the local tier's flood bucket, for the rate:
// classes of share 1 skip that bucket.)
func TestCriticalKeepsItsRateShareUnderOverload(t *testing.T) {
	r := testenv.StartRedis(t)
	obs := &countSlots{n: map[[2]string]int{}}
	g := rateGate(t, r.Addr(), "rateclass", rateClassPolicy, obs)
	ctx := context.Background()
	const burst, share, flood = 100, 0.5, 500
	guaranteed := int(burst - share*burst)

	var floodAllowed, floodShed, floodRate, critAllowed atomic.Int64
	errs := make(chan error, flood+guaranteed)
	reqs := make(chan string, flood+guaranteed)
	// Critical requests are spread through the flood: one after every
	// ten sheddable ones.
	for i := range flood {
		reqs <- "sheddable"
		if i%10 == 9 {
			reqs <- "critical"
		}
	}
	close(reqs)
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for class := range reqs {
				d, err := g.Check(ctx, enforcement.Request{Key: "acct", Scope: "api", Priority: class})
				if err != nil {
					errs <- err
					return
				}
				switch {
				case class == "critical" && d.Allowed:
					critAllowed.Add(1)
				case class == "critical":
					errs <- errors.New("a critical request was refused: " + d.Reason)
				case d.Allowed:
					floodAllowed.Add(1)
				case d.Reason == enforcement.ReasonShed:
					if d.RetryAfter <= 0 {
						errs <- errors.New("a shed answer without a retry time")
					}
					floodShed.Add(1)
				default:
					floodRate.Add(1) // refused in process by the local tier's flood bucket
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("critical admitted %d of its guaranteed %d (%.2f, goal ≥ 0.98); sheddable: %d admitted, %d shed, %d refused for the rate",
		critAllowed.Load(), guaranteed, float64(critAllowed.Load())/float64(guaranteed), floodAllowed.Load(), floodShed.Load(), floodRate.Load())
	if float64(critAllowed.Load())/float64(guaranteed) < 0.98 {
		t.Fatalf("critical admitted %d of %d", critAllowed.Load(), guaranteed)
	}
	// The floor counts every class's spending: critical requests that
	// came early leave the flood less than its share, never more.
	if floodAllowed.Load() > int64(burst-guaranteed) || floodAllowed.Load()+critAllowed.Load() > burst {
		t.Fatalf("sheddable admitted %d (critical %d), over its share of %d", floodAllowed.Load(), critAllowed.Load(), burst-guaranteed)
	}
	if floodShed.Load() == 0 {
		t.Fatal("no sheddable request was shed: the flood pressed on nothing")
	}
	if got := obs.get(enforcement.ReasonShed, "sheddable"); got != int(floodShed.Load()) {
		t.Fatalf("shed counted %d times, answered %d times", got, floodShed.Load())
	}
	if got := obs.get("admitted", "sheddable"); got != int(floodAllowed.Load()) {
		t.Fatalf("sheddable admissions counted %d times, answered %d", got, floodAllowed.Load())
	}
	if got := obs.get(enforcement.ReasonShed, "critical") + obs.get("admitted", "critical"); got != 0 {
		t.Fatalf("a class of share 1 counted %d times: it splits nothing", got)
	}

	// Critical, share 1, spends what is left down to 0; then a request of
	// any class is refused for the rate, not shed.
	left := int64(burst) - floodAllowed.Load() - critAllowed.Load()
	for i := range left {
		d, err := g.Check(ctx, enforcement.Request{Key: "acct", Scope: "api", Priority: "critical"})
		if err != nil || !d.Allowed || d.Remaining != left-1-i {
			t.Fatalf("critical spending the last %d tokens, %d: %+v, %v", left, i+1, d, err)
		}
	}
	for _, class := range []string{"critical", "sheddable"} {
		d, err := g.Check(ctx, enforcement.Request{Key: "acct", Scope: "api", Priority: class})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed || d.Reason != "" {
			t.Fatalf("%s on the empty bucket: allowed %v, reason %q; want refused for the rate", class, d.Allowed, d.Reason)
		}
	}
}

// TestRateClassesWithoutPriorities: without a priorities section nothing
// is split: a request naming the sheddable class spends the whole bucket,
// and a peek answers as before.
func TestRateClassesWithoutPriorities(t *testing.T) {
	r := testenv.StartRedis(t)
	const src = "version: 1\ndefault_tier: api\ntiers:\n  api: { rate: 0.001, burst: 10 }\n"
	obs := &countSlots{n: map[[2]string]int{}}
	g := rateGate(t, r.Addr(), "noclass", src, obs)
	ctx := context.Background()
	for i := range 10 {
		d, err := g.Check(ctx, enforcement.Request{Key: "acct", Scope: "api", Priority: "sheddable"})
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Remaining != int64(9-i) {
			t.Fatalf("request %d: allowed %v, %d left; want allowed with %d left", i+1, d.Allowed, d.Remaining, 9-i)
		}
	}
	d, err := g.Check(ctx, enforcement.Request{Key: "acct", Scope: "api", Priority: "sheddable"})
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Reason != "" {
		t.Fatalf("request 11: allowed %v, reason %q; want refused for the rate", d.Allowed, d.Reason)
	}
	if len(obs.n) != 0 {
		t.Fatalf("decisions counted as slots without priorities: %v", obs.n)
	}
}

// TestRateClassPeek: a peek answers for the request's class: at the
// sheddable class's floor it says shed for that class and allowed for
// critical, spending nothing.
func TestRateClassPeek(t *testing.T) {
	r := testenv.StartRedis(t)
	g := rateGate(t, r.Addr(), "peekclass", rateClassPolicy, nil)
	ctx := context.Background()
	for range 50 {
		if d, err := g.Check(ctx, enforcement.Request{Key: "acct", Scope: "api", Priority: "sheddable"}); err != nil || !d.Allowed {
			t.Fatalf("sheddable within its share: %+v, %v", d, err)
		}
	}
	for range 2 { // twice: the first peek spent nothing
		d, err := g.Check(ctx, enforcement.Request{Key: "acct", Scope: "api", Priority: "sheddable", Peek: true})
		if err != nil {
			t.Fatal(err)
		}
		if d.WouldAllow || d.Reason != enforcement.ReasonShed || d.Remaining != 50 {
			t.Fatalf("sheddable peek at the floor: would allow %v, reason %q, %d left; want shed with 50 left", d.WouldAllow, d.Reason, d.Remaining)
		}
		d, err = g.Check(ctx, enforcement.Request{Key: "acct", Scope: "api", Priority: "critical", Peek: true})
		if err != nil {
			t.Fatal(err)
		}
		if !d.WouldAllow || d.Remaining != 49 {
			t.Fatalf("critical peek at the floor: would allow %v, %d left; want allowed with 49 left", d.WouldAllow, d.Remaining)
		}
	}
}
