package main

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/guard"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/internal/testenv"
)

type storeCalls struct{ calls, failed atomic.Int64 }

func (o *storeCalls) StoreCall(_ time.Duration, err error) {
	o.calls.Add(1)
	if err != nil {
		o.failed.Add(1)
	}
}
func (o *storeCalls) BreakerState(guard.State) {}

// TestStoreCallsOtherThanDecisionsPassTheGuard: leases, returns and fleet
// heartbeats are fenced by the same deadline and breaker as decisions —
// counted, and not sent at all while the breaker is open — so a dead Redis
// is not asked by leased keys behind the breaker's back.
func TestStoreCallsOtherThanDecisionsPassTheGuard(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	store := redisstore.New(rdb, "guarded")
	obs := &storeCalls{}
	g := guard.New(store, guard.Settings{ConsecutiveFailures: 2, OpenFor: time.Hour}, obs, nil)
	gs := guardedStore{store: store, guardOf: func(uint16) *guard.Authority { return g }}
	lim := enforcement.Limit{Rate: 100, Burst: 100}
	ctx := context.Background()

	if grant, err := gs.Lease(ctx, "k", "s", lim, 1, 10); err != nil || grant.Granted != 10 {
		t.Fatalf("lease: %+v %v", grant, err)
	}
	if _, err := gs.Return(ctx, "k", "s", lim, 10); err != nil {
		t.Fatalf("return: %v", err)
	}
	if n, err := gs.Beat(ctx, "me", time.Minute); err != nil || n != 1 {
		t.Fatalf("beat: %d %v", n, err)
	}
	if got := obs.calls.Load(); got != 3 {
		t.Fatalf("the guard saw %d store calls, want 3 (lease, return, beat)", got)
	}

	r.Process().Kill()
	for range 2 {
		if _, err := gs.Lease(ctx, "k", "s", lim, 1, 10); !errors.Is(err, guard.ErrStoreUnavailable) {
			t.Fatalf("lease with Redis dead: %v, want a store failure", err)
		}
	}
	if g.State() != guard.Open || obs.failed.Load() != 2 {
		t.Fatalf("after 2 failed leases: breaker %v, failures counted %d; want open and 2", g.State(), obs.failed.Load())
	}
	// Open: nothing more reaches the store, whatever the call.
	before := obs.calls.Load()
	if _, err := gs.Beat(ctx, "me", time.Minute); !errors.Is(err, guard.ErrStoreUnavailable) {
		t.Fatalf("beat with the breaker open: %v", err)
	}
	if _, err := gs.Return(ctx, "k", "s", lim, 1); !errors.Is(err, guard.ErrStoreUnavailable) {
		t.Fatalf("return with the breaker open: %v", err)
	}
	if obs.calls.Load() != before {
		t.Fatal("calls reached the store while the breaker was open")
	}
}
