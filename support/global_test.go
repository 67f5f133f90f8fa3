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
	"github.com/ratewarden/ratewarden/enforcement/global"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/support"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const globalPolicy = `
version: 1
default_tier: shared
tiers:
  shared: { rate: 1, period: hour, burst: 100, scope: global }
`

// TestInspectShowsAGlobalKey: two regions, each its own redis-server (the
// first also the home, where the global bucket lives), each with a
// limiter behind GET /admin/keys/local. After each region spent from its
// pool, inspect shows the global bucket at the home, lowered by what the
// pools leased, one pool per region with what it spent, and a third
// region of LIMITER_REGIONS whose limiters were not asked, marked.
func TestInspectShowsAGlobalKey(t *testing.T) {
	home := testenv.StartRedis(t)
	other := testenv.StartRedis(t)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(globalPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := pol.Resolve("acct_world", "api", "")
	if err != nil || !res.Global {
		t.Fatalf("the key's limit: %+v %v; want a global one", res, err)
	}
	client := func(addr string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return c
	}
	var urls []string
	for _, reg := range []struct {
		name  string
		redis *testenv.Redis
	}{{"eu", home}, {"us", other}} {
		g, err := global.New(global.Config{Region: reg.name, Regions: 2, Local: client(reg.redis.Addr()), Home: client(home.Addr()),
			Prefix: "rl", HomePrefix: "rl", Member: reg.name + "-1", Timeout: time.Second, HomeTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = g.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		spent := 0
		testenv.WaitFor(t, 30*time.Second, reg.name+"'s pool allows 3 tokens", func() bool {
			v, err := g.Take(context.Background(), "acct_world", "api", res.Limit, 1)
			if err == nil && v.Allowed {
				spent++
			}
			return spent >= 3
		})
		lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(client(reg.redis.Addr()), "rl"), Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(support.LocalHandler(support.Local{Limiter: lim, Instance: reg.name + "-1",
			Global: func(ctx context.Context, key, scope string, l enforcement.Limit) (global.View, bool) {
				v := g.Inspect(ctx, key, scope, l)
				v.Regions = []string{"eu", "us", "ap"} // ap's limiters are not asked
				return v, true
			}}))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}

	in := &support.Inspector{Limiters: urls, Store: redisstore.New(client(home.Addr()), "rl"), Timeout: testenv.Timeout(5 * time.Second)}
	rep := in.Inspect(context.Background(), "acct_world", "api")
	g := rep.Global
	if g == nil || g.Error != "" {
		t.Fatalf("global part: %+v", g)
	}
	if g.Bucket == nil || !g.Bucket.Present || g.Bucket.Capacity != 100 || g.Bucket.Tokens > 94 {
		t.Fatalf("the global bucket: %+v %q; want 100 less at least what the pools spent", g.Bucket, g.BucketError)
	}
	if len(g.Pools) != 3 {
		t.Fatalf("pools: %+v; want one per region", g.Pools)
	}
	if p := g.Pools[2]; p.Region != "ap" || p.Error == "" || p.Present {
		t.Errorf("pool of ap, whose limiters were not asked: %+v; want it marked", p)
	}
	for i, want := range []string{"eu", "us"} {
		p := g.Pools[i]
		if p.Region != want || p.Error != "" || !p.Present || p.Spent < 3 || p.From != urls[i] {
			t.Errorf("pool %d: %+v; want region %s's, 3 spent, read by %s", i, p, want, urls[i])
		}
	}
	t.Logf("global bucket %.1f of %d; pools %+v", g.Bucket.Tokens, g.Bucket.Capacity, g.Pools)
}
