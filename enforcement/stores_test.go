package enforcement_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/authoritytest"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestStoresRoutesEveryCallToTheKeysStore: decisions, leases and returns
// of a limit naming a store reach that store's server and no other; the
// router passes the authority contract; an unknown name is an error.
func TestStoresRoutesEveryCallToTheKeysStore(t *testing.T) {
	servers := map[string]*testenv.Redis{"": testenv.StartRedis(t), "acme": testenv.StartRedis(t)}
	shared := map[string]*redisstore.Shared{}
	clients := map[string]*redis.Client{}
	for name, r := range servers {
		c := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		s := redisstore.NewShared(c, redisstore.SharedConfig{Prefix: "routed", Guard: redisstore.GuardSettings{Timeout: 5 * time.Second}})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = s.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		shared[name], clients[name] = s, c
	}
	st := enforcement.NewStores(shared[""], map[string]enforcement.Store{"acme": shared["acme"]})
	authoritytest.Run(t, st)

	ctx := context.Background()
	for _, name := range []string{"", "acme"} {
		lim := enforcement.Limit{Rate: 1, Burst: 100, Store: name}
		key := "k_" + name
		if _, err := st.Take(ctx, key, "take", lim, 1); err != nil {
			t.Fatal(err)
		}
		if g, err := st.Lease(ctx, key, "lease", lim, 1, 10); err != nil || g.Granted != 10 {
			t.Fatalf("lease on %q: %+v %v", name, g, err)
		}
		for other, c := range clients {
			for _, scope := range []string{"take", "lease"} {
				n, err := c.Exists(ctx, keyslot.BucketKey("routed", key, scope)).Result()
				if err != nil {
					t.Fatal(err)
				}
				if want := int64(0); other == name {
					want = 1
					if n != want {
						t.Errorf("store %q: bucket %s/%s missing", other, key, scope)
					}
				} else if n != want {
					t.Errorf("store %q holds the bucket %s/%s of store %q", other, key, scope, name)
				}
			}
		}
		// The return reaches the same store: the bucket is full again,
		// and a full bucket is not kept.
		if _, err := st.Return(ctx, key, "lease", lim, 10); err != nil {
			t.Fatal(err)
		}
		if n, _ := clients[name].Exists(ctx, keyslot.BucketKey("routed", key, "lease")).Result(); n != 0 {
			t.Errorf("store %q: the bucket %s/lease is still held after the return", name, key)
		}
	}
	if _, err := st.Take(ctx, "k", "s", enforcement.Limit{Rate: 1, Burst: 1, Store: "nope"}, 1); !errors.Is(err, enforcement.ErrUnknownStore) {
		t.Fatalf("unknown store: %v", err)
	}
}
