package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

type fixedPolicy struct{ lim enforcement.Limit }

func (p fixedPolicy) Resolve(_, _, tier string) (enforcement.Resolved, error) {
	return enforcement.Resolved{Limit: p.lim, Policy: "test", Tier: tier, Cost: 1}, nil
}

func clusterClient(t *testing.T, c *testenv.Cluster) *redis.ClusterClient {
	t.Helper()
	// Read and write timeouts a loaded machine cannot hit: the cluster
	// client retries a command whose read timed out (MaxRedirects), and a
	// bucket script that ran but answered late would then spend twice,
	// which "decisions exact across slots" would report as a wrong count.
	// (The limiter's calls carry a context deadline, which ends them for
	// good instead.)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: c.Addrs(), DialTimeout: 200 * time.Millisecond, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
		ContextTimeoutEnabled: true, MaxRetries: -1,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// TestSharedCluster runs against one real 3-master cluster: decisions are exact
// on every slot, and losing one master degrades only its keys.
func TestSharedCluster(t *testing.T) {
	cl := testenv.StartCluster(t, 3)
	rdb := clusterClient(t, cl)
	ctx := context.Background()
	store := redisstore.New(rdb, "cl")
	if err := store.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	slots, err := redisstore.NewSlotMap(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("slots computed locally match Redis", func(t *testing.T) {
		for i := range 50 {
			key := fmt.Sprintf("acct_%d", i)
			want, err := rdb.ClusterKeySlot(ctx, store.BucketKey(key, "api")).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got := keyslot.KeySlot(key, "api"); int64(got) != want {
				t.Fatalf("KeySlot(%q) = %d, CLUSTER KEYSLOT says %d", key, got, want)
			}
		}
	})

	t.Run("decisions exact across slots", func(t *testing.T) {
		lim := enforcement.Limit{Rate: 0.001, Burst: 5}
		shards := map[string]int{}
		for i := range 120 {
			key := fmt.Sprintf("exact_%d", i)
			shards[slots.Owner(keyslot.KeySlot(key, "s"))]++
			allowed := 0
			for range 7 {
				v, err := store.Take(ctx, key, "s", lim, 1)
				if err != nil {
					t.Fatal(err)
				}
				if v.Allowed {
					allowed++
				}
			}
			if allowed != 5 {
				t.Fatalf("%s: allowed %d of 7 with burst 5", key, allowed)
			}
			// The lease script shares the bucket on every slot too.
			if g, err := store.Lease(ctx, key, "s", lim, 1, 10); err != nil || g.Granted != 0 {
				t.Fatalf("%s: lease of an empty bucket: %+v %v", key, g, err)
			}
		}
		if len(shards) != 3 {
			t.Fatalf("keys landed on %d shards (%v), want 3", len(shards), shards)
		}
		t.Logf("keys per shard: %v", shards)
	})

	t.Run("losing one master degrades only its keys", func(t *testing.T) {
		lim := enforcement.Limit{Rate: 1e5, Burst: 1e5}
		// A deadline no live master misses even on a loaded machine (the dead
		// one refuses connections, which fails at once whatever the deadline),
		// and breakers that stay open for the whole test once open: what is
		// asserted below is then the same however slow the machine is.
		settings := redisstore.GuardSettings{Timeout: 2 * time.Second, OpenFor: time.Hour}
		sg := redisstore.NewShared(rdb, redisstore.SharedConfig{Prefix: "cl", Guard: settings})
		if err := sg.Preload(ctx); err != nil {
			t.Fatal(err)
		}
		runShared(t, sg)
		l, err := enforcement.New(enforcement.Config{Authority: sg, Policy: fixedPolicy{lim}})
		if err != nil {
			t.Fatal(err)
		}
		// A single guard for the whole store, the control.
		single := runningGuard(t, store, settings, nil, nil)
		lc, err := enforcement.New(enforcement.Config{Authority: single, Policy: fixedPolicy{lim}})
		if err != nil {
			t.Fatal(err)
		}

		dead := cl.Masters[0].Addr()
		var keys []string
		onDead := map[string]bool{}
		for i := range 90 {
			k := fmt.Sprintf("fail_%d", i)
			keys = append(keys, k)
			onDead[k] = slots.Owner(keyslot.KeySlot(k, "s")) == dead
		}
		check := func(l *enforcement.Limiter, k string) enforcement.Source {
			d, err := l.Check(ctx, enforcement.Request{Key: k, Scope: "s", Cost: 1, HasCost: true})
			if err != nil {
				t.Fatal(err)
			}
			return d.Source
		}
		for _, k := range keys {
			if s := check(l, k); s != enforcement.SourceShared {
				t.Fatalf("before the failure %s decided %s", k, s)
			}
		}
		cl.KillMaster(t, 0)

		controlDegradedLive := 0
		for round := range 5 {
			for _, k := range keys {
				s := check(l, k)
				switch {
				case onDead[k] && s != enforcement.SourceDegraded:
					t.Fatalf("round %d: %s (on the dead master) decided %s, want degraded", round, k, s)
				case !onDead[k] && s != enforcement.SourceShared:
					t.Fatalf("round %d: %s (on a live master) decided %s, want shared: %v", round, k, s, sg.States())
				}
			}
			// The control sees the same keys, those of the dead shard first
			// (a busy key there is enough to trip a store-wide breaker).
			for _, dead := range []bool{true, false} {
				for _, k := range keys {
					if onDead[k] == dead && check(lc, k) == enforcement.SourceDegraded && !dead {
						controlDegradedLive++
					}
				}
			}
		}
		states := sg.States()
		if states[dead] != redisstore.Open {
			t.Fatalf("breaker of the dead shard %s is %v, want open (%v)", dead, states[dead], states)
		}
		t.Logf("per-shard breakers %v; with one breaker for the whole store, %d decisions on live masters went degraded", states, controlDegradedLive)
		if controlDegradedLive == 0 {
			t.Fatal("control: one breaker for the whole store never degraded a live key; the test would not show the difference")
		}
	})
}

// runShared runs s until the test ends.
func runShared(t testing.TB, s *redisstore.Shared) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}
