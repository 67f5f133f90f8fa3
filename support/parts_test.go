package support_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/split"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/support"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const partsPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: hour, burst: 5 }
  big:  { rate: 1, period: hour, burst: 5000 }
keys: { acct_lease: big }
rules:
  - { name: spread, key: acct_split, scope: api, rate: 1, period: hour, burst: 40, split: 4 }
`

// TestInspectShowsEachPart: on one redis-server, a split key's
// sub-buckets after spends through enforcement/split, a bucket in debt
// after a settle that took more than its estimate, a reservation left
// open (listed with its estimate; the settled one is not), and the lease a
// limiter holds of a hot key (its GET /admin/keys/local, leasing
// through the Redis store), each as inspect shows it.
func TestInspectShowsEachPart(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(partsPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	resolve := func(key string) enforcement.Limit {
		res, err := pol.Resolve(key, "api", "")
		if err != nil {
			t.Fatal(err)
		}
		return res.Limit
	}
	store := redisstore.New(rdb, "rl")

	// A split key: 8 tokens spent over its 4 sub-buckets.
	splitLim := resolve("acct_split")
	if splitLim.Split != 4 {
		t.Fatalf("acct_split's limit %+v, want split 4", splitLim)
	}
	sp := split.New(store, nil)
	for range 8 {
		if v, err := sp.Take(ctx, "acct_split", "api", splitLim, 1); err != nil || !v.Allowed {
			t.Fatalf("split take: %+v %v", v, err)
		}
	}
	// One reservation left open; then debt: a reservation of 1 settled
	// at 20 on a bucket of 5.
	debtLim := resolve("acct_debt")
	if v, err := store.Reserve(ctx, "acct_debt", "api", debtLim, 1, "res-open", time.Minute); err != nil || !v.Allowed {
		t.Fatalf("reserve: %+v %v", v, err)
	}
	if v, err := store.Reserve(ctx, "acct_debt", "api", debtLim, 1, "res-1", time.Minute); err != nil || !v.Allowed {
		t.Fatalf("reserve: %+v %v", v, err)
	}
	if _, err := store.Settle(ctx, "acct_debt", "api", "res-1", debtLim, 20, false, time.Minute); err != nil {
		t.Fatal(err)
	}
	// A lease: a limiter leasing through the shared store, its key hot
	// from the first decisions.
	shared := redisstore.NewShared(rdb, redisstore.SharedConfig{Prefix: "rl"})
	sctx, stopShared := context.WithCancel(ctx)
	sharedDone := make(chan struct{})
	go func() { defer close(sharedDone); _ = shared.Run(sctx) }()
	leased := lease.New(shared, shared, lease.Config{Block: 50, HotOpsPerSec: 4, Timeout: testenv.Timeout(2 * time.Second)})
	lctx, stopLease := context.WithCancel(ctx)
	leaseDone := make(chan struct{})
	go func() { defer close(leaseDone); _ = leased.Run(lctx) }()
	t.Cleanup(func() { stopLease(); <-leaseDone; stopShared(); <-sharedDone })
	lim, err := enforcement.New(enforcement.Config{Authority: leased, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the limiter leases acct_lease", func() bool {
		if _, err := lim.Check(ctx, enforcement.Request{Key: "acct_lease", Scope: "api", Cost: 1, HasCost: true}); err != nil {
			t.Fatal(err)
		}
		h, ok := leased.Held("acct_lease", "api")
		return ok && h.Hot && h.Tokens > 0
	})
	srv := httptest.NewServer(support.LocalHandler(support.Local{Limiter: lim, Instance: "limiter-0", Lease: leased.Held}))
	t.Cleanup(srv.Close)

	in := &support.Inspector{Limiters: []string{srv.URL}, Store: store, Timeout: testenv.Timeout(5 * time.Second)}

	rep := in.Inspect(ctx, "acct_split", "api")
	if rep.Split == nil || rep.Split.Error != "" || len(rep.Split.Buckets) != 4 {
		t.Fatalf("split: %+v; want its 4 sub-buckets", rep.Split)
	}
	var left float64
	for _, b := range rep.Split.Buckets {
		if b.Capacity != 10 {
			t.Errorf("sub-bucket %s: capacity %d, want 40/4", b.RedisKey, b.Capacity)
		}
		if b.Present {
			left += b.Tokens
		} else {
			left += float64(b.Capacity)
		}
	}
	if left < 31.9 || left > 32.1 {
		t.Errorf("the sub-buckets hold %.2f tokens, want 40 - 8", left)
	}

	rep = in.Inspect(ctx, "acct_debt", "api")
	if rep.Debt.Error != "" || rep.Debt.Tokens < 15.9 || rep.Debt.Tokens > 16 || rep.Bucket.BucketView == nil || rep.Bucket.Tokens != -rep.Debt.Tokens {
		t.Fatalf("debt %+v, bucket %+v: want 16 tokens of debt (5 − 1 − 1 − 19)", rep.Debt, rep.Bucket.BucketView)
	}
	if r := rep.Reservations; r.Error != "" || r.Total != 1 || len(r.Open) != 1 || r.Open[0].ID != "res-open" || r.Open[0].Tokens != 1 || r.Where == "" {
		t.Errorf("reservations: %+v; want res-open (1 token) alone listed, res-1 settled", rep.Reservations)
	}

	rep = in.Inspect(ctx, "acct_lease", "api")
	if len(rep.Limiters) != 1 || rep.Limiters[0].LocalAnswer == nil || rep.Limiters[0].Lease == nil ||
		!rep.Limiters[0].Lease.Hot || rep.Limiters[0].Lease.Tokens <= 0 {
		t.Fatalf("the limiter's lease: %+v", rep.Limiters)
	}
	if rep.Bucket.BucketView == nil || !rep.Bucket.Present || rep.Bucket.Tokens > float64(rep.Bucket.Capacity-rep.Limiters[0].Lease.Tokens)+0.1 {
		t.Errorf("bucket %+v with %d tokens leased: the store counts what is leased as spent", rep.Bucket.BucketView, rep.Limiters[0].Lease.Tokens)
	}
}
