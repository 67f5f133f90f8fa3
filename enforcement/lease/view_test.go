package lease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestHeld: what an instance holds of a key is shown as the store took
// it: nothing before the key is hot, the leased block (less what was
// spent from it) after.
func TestHeld(t *testing.T) {
	r := testenv.StartRedis(t)
	store := redisstore.New(client(t, r), "held")
	lim := enforcement.Limit{Rate: 0.001, Burst: 1000}
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	a := lease.New(store, store, lease.Config{Block: 100, HotOpsPerSec: 30, Window: 200 * time.Millisecond,
		MaxHold: time.Hour, Tick: 20 * time.Millisecond, Now: clock})
	if _, ok := a.Held("k", "s"); ok {
		t.Fatal("a key never seen is held")
	}
	for range 5 {
		if _, err := a.Take(ctx, "k", "s", lim, 1); err != nil {
			t.Fatal(err)
		}
	}
	if h, ok := a.Held("k", "s"); !ok || h.Hot || h.Tokens != 0 {
		t.Fatalf("cold key: %+v %v; want tracked, not hot, nothing held", h, ok)
	}
	if _, err := a.Take(ctx, "k", "s", lim, 1); err != nil { // the 6th: hot, leases 100 and spends 1
		t.Fatal(err)
	}
	if h, ok := a.Held("k", "s"); !ok || !h.Hot || h.Tokens != 99 || h.LeasedAt.IsZero() {
		t.Fatalf("hot key: %+v %v; want 99 held", h, ok)
	}
}
