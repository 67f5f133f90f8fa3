package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// slotTransports are the two ways a Concurrency reaches Redis: a script
// call of its own per operation, and the auto-pipeline's batches beside
// the decisions (the limiter's). Every rule holds over both.
var slotTransports = []string{"script", "pipeline"}

// concurrencyVia is the slot store of prefix over rdb by transport via.
func concurrencyVia(t *testing.T, via string, rdb redisstore.PipelineClient, prefix string) *redisstore.Concurrency {
	if via == "script" {
		return redisstore.NewConcurrency(rdb, prefix)
	}
	return newPipelined(t, rdb, prefix).Concurrency()
}

func slot(key string) slots.Slot {
	return slots.Slot{Key: key, Scope: "reports", Member: slots.NewMember()}
}

// storeTime is Redis's clock, which the leases are on.
func storeTime(t *testing.T, rdb redis.Cmdable) time.Time {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// waitStorePast waits until Redis's clock is past at (a lease's end).
func waitStorePast(t *testing.T, rdb redis.Cmdable, at time.Time) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !storeTime(t, rdb).After(at) {
		if time.Now().After(deadline) {
			t.Fatalf("the store's clock never passed %v", at)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConcurrencySlotRules: the slot operations' answers, one by one, on a
// real Redis: N admitted and the next refused for want of a slot; a class
// refused at its share while slots are left (shed); a release frees once;
// a late release and a late renew free and extend nothing.
func TestConcurrencySlotRules(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	for _, via := range slotTransports {
		t.Run(via, func(t *testing.T) { slotRules(t, rdb, concurrencyVia(t, via, rdb, "conc-"+via)) })
	}
}

func slotRules(t *testing.T, rdb *redis.Client, c *redisstore.Concurrency) {
	ctx := context.Background()
	// A server that lost its scripts (a restart, SCRIPT FLUSH) answers
	// NOSCRIPT: the call is sent again as EVAL.
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 3
	var held []slots.Slot
	for i := range n {
		s := slot("acct")
		g, err := c.Acquire(ctx, s, n, n, time.Minute)
		if err != nil || !g.Admitted || g.Held != int64(i+1) || !g.ExpiresAt.After(g.Now) {
			t.Fatalf("acquire %d: %+v, %v", i, g, err)
		}
		held = append(held, s)
	}
	g, err := c.Acquire(ctx, slot("acct"), n, n, time.Minute)
	if err != nil || g.Admitted || g.Reason != enforcement.ReasonConcurrency || g.Held != n || g.RetryAfter <= 0 || g.RetryAfter > time.Minute {
		t.Fatalf("acquire past the limit: %+v, %v", g, err)
	}
	// A retried acquire of a member that holds a slot takes no second one.
	if g, err := c.Acquire(ctx, held[0], n, n, time.Minute); err != nil || !g.Admitted || g.Held != n {
		t.Fatalf("the same member again: %+v, %v", g, err)
	}
	// Shed: a class of share 1/3 may hold 1 slot of 3.
	if g, err := c.Acquire(ctx, slot("shed"), 1, 3, time.Minute); err != nil || !g.Admitted {
		t.Fatalf("first sheddable: %+v, %v", g, err)
	}
	if g, err := c.Acquire(ctx, slot("shed"), 1, 3, time.Minute); err != nil || g.Admitted || g.Reason != enforcement.ReasonShed {
		t.Fatalf("second sheddable: %+v, %v", g, err)
	}
	if g, err := c.Acquire(ctx, slot("shed"), 3, 3, time.Minute); err != nil || !g.Admitted || g.Held != 2 {
		t.Fatalf("critical beside it: %+v, %v", g, err)
	}

	// Release twice: the first frees, the second frees nothing, and in
	// between another request took the slot, which stays its own.
	if freed, err := c.Release(ctx, held[0]); err != nil || !freed {
		t.Fatalf("release: %v, %v", freed, err)
	}
	other := slot("acct")
	if g, err := c.Acquire(ctx, other, n, n, time.Minute); err != nil || !g.Admitted || g.Held != n {
		t.Fatalf("acquire after a release: %+v, %v", g, err)
	}
	if freed, err := c.Release(ctx, held[0]); err != nil || freed {
		t.Fatalf("second release: %v, %v", freed, err)
	}
	if got, err := c.Held(ctx, rdb, "acct", "reports"); err != nil || got != n {
		t.Fatalf("held after a second release: %d, %v; want %d", got, err, n)
	}
	if _, err := c.Renew(ctx, held[0], time.Minute); !errors.Is(err, slots.ErrLeaseNotFound) {
		t.Fatalf("renew of a released lease: %v", err)
	}
	if _, err := c.Release(ctx, slots.Slot{Key: "acct", Scope: "reports", Member: slots.NewMember()}); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Held(ctx, rdb, "acct", "reports"); got != n {
		t.Fatalf("a release of an id never issued freed a slot: %d held", got)
	}

	// Expiry: a short lease ends on the store's clock; its late renew and
	// release change nothing another request holds.
	short := slot("exp")
	g, err = c.Acquire(ctx, short, 1, 1, time.Second)
	if err != nil || !g.Admitted {
		t.Fatalf("short lease: %+v, %v", g, err)
	}
	renewed, err := c.Renew(ctx, short, time.Second)
	if err != nil || renewed.Before(g.ExpiresAt) {
		t.Fatalf("renew: %v, %v (was %v)", renewed, err, g.ExpiresAt)
	}
	waitStorePast(t, rdb, renewed)
	next := slot("exp")
	if g, err := c.Acquire(ctx, next, 1, 1, time.Minute); err != nil || !g.Admitted || g.Held != 1 {
		t.Fatalf("acquire after the lease ended: %+v, %v", g, err)
	}
	if _, err := c.Renew(ctx, short, time.Minute); !errors.Is(err, slots.ErrLeaseNotFound) {
		t.Fatalf("renew after expiry: %v", err)
	}
	if freed, err := c.Release(ctx, short); err != nil || freed {
		t.Fatalf("release after expiry: %v, %v", freed, err)
	}
	if got, _ := c.Held(ctx, rdb, "exp", "reports"); got != 1 {
		t.Fatalf("late release freed another request's slot: %d held", got)
	}
	// The set lives as long as its longest lease.
	if ttl, err := rdb.PTTL(ctx, c.SetKey("exp", "reports")).Result(); err != nil || ttl <= 0 || ttl > time.Minute {
		t.Fatalf("the set's TTL: %v, %v", ttl, err)
	}
}

// TestConcurrencyNeverOverN: many goroutines on several clients (as many
// limiters would be) take and give back slots of one key as fast as they
// can; every admission, in the store's own count at that instant, is ≤ N,
// and a watcher reading the store's view between calls never sees more.
func TestConcurrencyNeverOverN(t *testing.T) {
	r := testenv.StartRedis(t)
	for _, via := range slotTransports {
		t.Run(via, func(t *testing.T) { neverOverN(t, r.Addr(), via) })
	}
}

func neverOverN(t *testing.T, addr, via string) {
	const n, clients, perClient = 5, 4, 6
	prefix := "never-" + via
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var admitted, refused, worst atomic.Int64
	errs := make(chan error, clients*perClient+1)
	for range clients {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		c := concurrencyVia(t, via, rdb, prefix)
		for range perClient {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for admitted.Load() < 600 {
					s := slot("hot")
					g, err := c.Acquire(ctx, s, n, n, time.Minute)
					if err != nil {
						errs <- err
						return
					}
					if !g.Admitted {
						refused.Add(1)
						continue
					}
					admitted.Add(1)
					for w := worst.Load(); g.Held > w && !worst.CompareAndSwap(w, g.Held); w = worst.Load() {
					}
					if _, err := c.Release(ctx, s); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	watch := redis.NewClient(&redis.Options{Addr: addr})
	defer watch.Close()
	view := redisstore.NewConcurrency(watch, prefix)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for admitted.Load() < 600 {
			h, err := view.Held(ctx, watch, "hot", "reports")
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
	<-done
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if w := worst.Load(); w > n || w < 1 {
		t.Fatalf("largest count at an admission: %d, limit %d", w, n)
	}
	if refused.Load() == 0 {
		t.Logf("no acquire was refused: %d goroutines never contended past %d", clients*perClient, n)
	}
	t.Logf("admitted %d, refused %d, largest count at an admission %d of %d", admitted.Load(), refused.Load(), worst.Load(), n)
}

// TestConcurrencyOnCluster: a key's slots are one Cluster slot (the key's
// hash tag, the buckets' own), so every operation is one script on one
// master, whichever master that is.
func TestConcurrencyOnCluster(t *testing.T) {
	cl := testenv.StartCluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer rdb.Close()
	for _, via := range slotTransports {
		prefix := "ccl-" + via
		t.Run(via, func(t *testing.T) { slotsOnCluster(t, rdb, prefix, concurrencyVia(t, via, rdb, prefix)) })
	}
}

func slotsOnCluster(t *testing.T, rdb *redis.ClusterClient, prefix string, c *redisstore.Concurrency) {
	ctx := context.Background()
	masters := map[string]bool{}
	for i := range 12 {
		key := fmt.Sprintf("acct-%d", i)
		if keyslot.Slot(c.SetKey(key, "reports")) != keyslot.Slot(keyslot.BucketKey(prefix, key, "reports")) {
			t.Fatalf("%s: the slots and the bucket are in different hash slots", key)
		}
		node, err := rdb.MasterForKey(ctx, c.SetKey(key, "reports"))
		if err != nil {
			t.Fatal(err)
		}
		masters[node.Options().Addr] = true
		a, b := slot(key), slot(key)
		if g, err := c.Acquire(ctx, a, 1, 1, time.Minute); err != nil || !g.Admitted {
			t.Fatalf("%s: %+v, %v", key, g, err)
		}
		if g, err := c.Acquire(ctx, b, 1, 1, time.Minute); err != nil || g.Admitted {
			t.Fatalf("%s second: %+v, %v", key, g, err)
		}
		if _, err := c.Renew(ctx, a, time.Minute); err != nil {
			t.Fatalf("%s renew: %v", key, err)
		}
		if freed, err := c.Release(ctx, a); err != nil || !freed {
			t.Fatalf("%s release: %v, %v", key, freed, err)
		}
	}
	if len(masters) < 2 {
		t.Fatalf("12 keys on %d master(s): the test did not cross masters", len(masters))
	}
}
