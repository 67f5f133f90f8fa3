package split_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/split"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func TestSubLimit(t *testing.T) {
	got := split.SubLimit(enforcement.Limit{Rate: 100, Burst: 205, Split: 10})
	if got.Rate != 10 || got.Burst != 20 || got.Split != 0 {
		t.Fatalf("SubLimit = %+v, want rate 10 burst 20 split 0", got)
	}
}

// TestSpreadsOverSubKeys: a split key's state lives in N sub-buckets in
// Redis, with distinct hash tags; an unsplit key stays one bucket.
func TestSpreadsOverSubKeys(t *testing.T) {
	r := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	store := redisstore.New(c, "sp")
	a := split.New(store, nil)
	ctx := context.Background()
	lim := enforcement.Limit{Rate: 1, Burst: 1000, Split: 4}
	for range 200 {
		v, err := a.Take(ctx, "k", "s", lim, 1)
		if err != nil || !v.Allowed {
			t.Fatalf("take: %v %+v", err, v)
		}
		if v.Remaining > lim.Burst || v.Remaining < 700 {
			t.Fatalf("remaining %d not scaled to the whole key", v.Remaining)
		}
	}
	keys, err := c.Keys(ctx, "sp:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 4 {
		t.Fatalf("split 4 made keys %v, want 4 sub-buckets", keys)
	}
	for i := range 4 {
		if n, _ := c.Exists(ctx, store.BucketKey(split.SubKey("k", i), "s")).Result(); n != 1 {
			t.Fatalf("sub-bucket %d missing; keys %v", i, keys)
		}
	}
	if _, err := a.Take(ctx, "one", "s", enforcement.Limit{Rate: 1, Burst: 10}, 1); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Exists(ctx, store.BucketKey("one", "s")).Result(); n != 1 {
		t.Fatal("an unsplit key must use its own bucket")
	}
	// A cost larger than a sub-bucket can never pass.
	v, err := a.Take(ctx, "k", "s", lim, 251)
	if err != nil || v.Allowed || v.RetryAfter <= 0 || a.Oversized() != 1 {
		t.Fatalf("oversized cost: %v %+v oversized=%d", err, v, a.Oversized())
	}
}

// TestLumpiness measures the early rejection of key splitting against real
// Redis: from a full bucket of burst 100 with no refill to speak of, a burst
// of 200 single-token requests; how many pass before the first rejection,
// and how many pass in all. Never more than the burst may pass.
func TestLumpiness(t *testing.T) {
	r := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	ctx := context.Background()
	const burst, trials = 100, 20
	for _, n := range []int{1, 2, 4, 10} {
		store := redisstore.New(c, fmt.Sprintf("lump%d", n))
		rng := rand.New(rand.NewPCG(uint64(n), 7))
		a := split.New(store, func(k int) int { return rng.IntN(k) })
		lim := enforcement.Limit{Rate: 0.001, Burst: burst, Split: n}
		var firstSum, totalSum int
		for trial := range trials {
			key := fmt.Sprintf("k%d", trial)
			first, total := -1, 0
			for i := 0; i < 2*burst; i++ {
				v, err := a.Take(ctx, key, "s", lim, 1)
				if err != nil {
					t.Fatal(err)
				}
				if v.Allowed {
					total++
				} else if first < 0 {
					first = i
				}
			}
			if total > burst {
				t.Fatalf("split %d admitted %d of a burst of %d", n, total, burst)
			}
			firstSum += first
			totalSum += total
		}
		t.Logf("split %2d: first rejection after %5.1f of %d requests (%.0f%%); admitted %5.1f of %d in a burst of %d",
			n, float64(firstSum)/trials, burst, float64(firstSum)/trials, float64(totalSum)/trials, burst, 2*burst)
		if n == 1 && (firstSum != trials*burst || totalSum != trials*burst) {
			t.Fatalf("unsplit: first %d total %d, want exactly the burst each trial", firstSum/trials, totalSum/trials)
		}
	}
}

// TestSteadyLumpiness measures early rejections under steady traffic at 90%
// of the limit, with Poisson arrivals. It steps the clock of the
// in-process authority (the same bucket arithmetic as the Lua script, which
// the enforcement tests check against each other), so ten simulated minutes
// take a fraction of a second.
func TestSteadyLumpiness(t *testing.T) {
	const rate, burst = 100.0, 100
	for _, n := range []int{1, 2, 4, 10, 20} {
		now := time.Unix(1_700_000_000, 0)
		mem := enforcement.NewMemoryAuthority(func() time.Time { return now }, 1000)
		rng := rand.New(rand.NewPCG(uint64(n), 11))
		a := split.New(mem, func(k int) int { return rng.IntN(k) })
		lim := enforcement.Limit{Rate: rate, Burst: burst, Split: n}
		var sent, rejected int
		for sent < 60000 { // ten minutes at 90 req/s
			now = now.Add(time.Duration(rng.ExpFloat64() / (0.9 * rate) * float64(time.Second)))
			v, err := a.Take(context.Background(), "k", "s", lim, 1)
			if err != nil {
				t.Fatal(err)
			}
			sent++
			if !v.Allowed {
				rejected++
			}
		}
		t.Logf("split %2d at 90%% of the limit: %.2f%% rejected early", n, 100*float64(rejected)/float64(sent))
		if n == 1 && rejected > sent/100 {
			t.Fatalf("unsplit bucket rejected %d of %d at 90%% of its limit", rejected, sent)
		}
	}
}

// TestSteadyLumpinessThroughLimiter is TestSteadyLumpiness behind the
// two-tier Limiter: after a sub-bucket rejects, the Limiter remembers "not
// before" for the whole key and rejects locally until then, although other
// sub-buckets may have tokens. The test reports how much that adds; it fails
// only if splitting lets more through than the limit allows.
func TestSteadyLumpinessThroughLimiter(t *testing.T) {
	const rate, burst = 100.0, 100
	for _, n := range []int{1, 4, 10} {
		now := time.Unix(1_700_000_000, 0)
		clock := func() time.Time { return now }
		mem := enforcement.NewMemoryAuthority(clock, 1000)
		rng := rand.New(rand.NewPCG(uint64(n), 11))
		a := split.New(mem, func(k int) int { return rng.IntN(k) })
		lim := enforcement.Limit{Rate: rate, Burst: burst, Split: n}
		l, err := enforcement.New(enforcement.Config{Authority: a, Policy: fixedPolicy{lim}, Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		var sent, rejected, local int
		start := now
		for sent < 60000 {
			now = now.Add(time.Duration(rng.ExpFloat64() / (0.9 * rate) * float64(time.Second)))
			d, err := l.Check(context.Background(), enforcement.Request{Key: "k", Scope: "s"})
			if err != nil {
				t.Fatal(err)
			}
			sent++
			if !d.Allowed {
				rejected++
				if d.Source == enforcement.SourceLocal {
					local++
				}
			}
		}
		if allowed := sent - rejected; float64(allowed) > burst+rate*now.Sub(start).Seconds() {
			t.Fatalf("split %d admitted %d, more than the limit allows", n, allowed)
		}
		t.Logf("split %2d at 90%% of the limit, through the Limiter: %.2f%% rejected (%.2f%% by the local tier)",
			n, 100*float64(rejected)/float64(sent), 100*float64(local)/float64(sent))
	}
}

type fixedPolicy struct{ lim enforcement.Limit }

func (p fixedPolicy) Resolve(_, _, tier string) (enforcement.Resolved, error) {
	return enforcement.Resolved{Limit: p.lim, Policy: "test", Tier: tier, Cost: 1}, nil
}
