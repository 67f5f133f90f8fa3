package redisstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/authoritytest"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

type storeCalls struct{ calls, failed atomic.Int64 }

func (o *storeCalls) StoreCall(_ time.Duration, err error) {
	o.calls.Add(1)
	if err != nil {
		o.failed.Add(1)
	}
}
func (o *storeCalls) BreakerState(redisstore.State) {}

// TestSharedContract: the shared store, guards and pipeline included,
// decides as every authority must.
func TestSharedContract(t *testing.T) {
	r := testenv.StartRedis(t)
	s := redisstore.NewShared(client(t, r.Addr()), redisstore.SharedConfig{Prefix: "sharedsuite",
		Guard: redisstore.GuardSettings{Timeout: 5 * time.Second}})
	runShared(t, s)
	authoritytest.Run(t, s)
}

// TestStoreCallsOtherThanDecisionsPassTheGuard: leases, returns and fleet
// heartbeats are fenced by the same deadline and breaker as decisions —
// counted, and not sent at all while the breaker is open — so a dead Redis
// is not asked by leased keys behind the breaker's back.
func TestStoreCallsOtherThanDecisionsPassTheGuard(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	obs := &storeCalls{}
	s := redisstore.NewShared(rdb, redisstore.SharedConfig{Prefix: "guarded", Observer: obs,
		Guard: redisstore.GuardSettings{ConsecutiveFailures: 2, OpenFor: time.Hour}})
	runShared(t, s)
	lim := enforcement.Limit{Rate: 100, Burst: 100}
	ctx := context.Background()

	if grant, err := s.Lease(ctx, "k", "s", lim, 1, 10); err != nil || grant.Granted != 10 {
		t.Fatalf("lease: %+v %v", grant, err)
	}
	if _, err := s.Return(ctx, "k", "s", lim, 10); err != nil {
		t.Fatalf("return: %v", err)
	}
	if n, err := s.Beat(ctx, "me", time.Minute); err != nil || n != 1 {
		t.Fatalf("beat: %d %v", n, err)
	}
	if got := obs.calls.Load(); got != 3 {
		t.Fatalf("the guard saw %d store calls, want 3 (lease, return, beat)", got)
	}
	if s.Failing() {
		t.Fatal("Failing with every call answered")
	}

	r.Process().Kill()
	for range 2 {
		if _, err := s.Lease(ctx, "k", "s", lim, 1, 10); !errors.Is(err, redisstore.ErrStoreUnavailable) {
			t.Fatalf("lease with Redis dead: %v, want a store failure", err)
		}
	}
	if st := s.States()["store"]; st != redisstore.Open || obs.failed.Load() != 2 || !s.Failing() {
		t.Fatalf("after 2 failed leases: breaker %v, failures counted %d, Failing %v; want open, 2, true", st, obs.failed.Load(), s.Failing())
	}
	// Open: nothing more reaches the store, whatever the call.
	before := obs.calls.Load()
	if _, err := s.Beat(ctx, "me", time.Minute); !errors.Is(err, redisstore.ErrStoreUnavailable) {
		t.Fatalf("beat with the breaker open: %v", err)
	}
	if _, err := s.Return(ctx, "k", "s", lim, 1); !errors.Is(err, redisstore.ErrStoreUnavailable) {
		t.Fatalf("return with the breaker open: %v", err)
	}
	if _, err := s.Take(ctx, "k", "s", lim, 1); !errors.Is(err, redisstore.ErrStoreUnavailable) {
		t.Fatalf("decision with the breaker open: %v", err)
	}
	if obs.calls.Load() != before {
		t.Fatal("calls reached the store while the breaker was open")
	}
}
