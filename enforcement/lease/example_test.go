package lease_test

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/split"
	"github.com/ratewarden/ratewarden/policy"
)

// The order of the decorators: the limiter asks the leasing authority,
// which spends held tokens for hot keys and passes everything else on to
// key splitting (limits with split: N), then the shared store (a deadline
// and a breaker per shard around the Redis script). Leases themselves go
// to the store, behind the same guards.
func Example() {
	pol, err := policy.Parse([]byte(`
version: 1
default_tier: pro
tiers:
  pro: { rate: 5000, burst: 10000 }
`))
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()
	store := redisstore.NewShared(rdb, redisstore.SharedConfig{Prefix: "rl"})
	var auth enforcement.Authority = split.New(store, nil)
	leased := lease.New(auth, store, lease.Config{Block: 100, HotOpsPerSec: 500})

	// Each component's Run in its own goroutine; internal/lifecycle's
	// Group does this for the binaries.
	storeCtx, stopStore := context.WithCancel(context.Background())
	storeDone := make(chan error, 1)
	go func() { storeDone <- store.Run(storeCtx) }()
	leaseCtx, stopLease := context.WithCancel(context.Background())
	leaseDone := make(chan error, 1)
	go func() { leaseDone <- leased.Run(leaseCtx) }()
	lim, err := enforcement.New(enforcement.Config{Authority: leased, Policy: pol, ExpectedInstances: 4})
	if err != nil {
		panic(err)
	}

	d, err := lim.Check(context.Background(), enforcement.Request{Key: "acct_1", Scope: "api"})
	fmt.Println(d.Allowed, d.Source, err)

	// Shutdown in reverse order: the leases (which give their unused
	// tokens back), then the store (its pipeline), then the client.
	stopLease()
	_ = <-leaseDone
	stopStore()
	_ = <-storeDone
}
