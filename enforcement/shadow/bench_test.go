package shadow_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/shadow"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// BenchmarkShadowCost: one decision through Limiter.Check, sequentially,
// without a shadow evaluator, with one but on a scope no shadow rule covers,
// and on a covered scope — against the in-process authority (the CPU cost)
// and a real redis-server (the round trip a covered decision adds).
func BenchmarkShadowCost(b *testing.B) {
	r := testenv.StartRedis(b)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
	b.Cleanup(func() { rdb.Close() })
	const y = `
version: 1
default_tier: free
tiers:
  free: { rate: 1000000, burst: 1000000 }
rules:
  - { name: search, scope: "api:search", rate: 1000000, burst: 1000000 }
  - { name: search-trial, scope: "api:search", rate: 500000, burst: 500000, shadow: true }
`
	pol, err := policy.Parse([]byte(y))
	if err != nil {
		b.Fatal(err)
	}
	stores := map[string]func(prefix string) enforcement.Authority{
		"memory": func(string) enforcement.Authority { return enforcement.NewMemoryAuthority(nil, 1<<20) },
		"redis":  func(prefix string) enforcement.Authority { return redisstore.New(rdb, prefix) },
	}
	for _, store := range []string{"memory", "redis"} {
		for _, c := range []struct {
			name   string
			shadow bool
			scope  string
		}{{"no-evaluator", false, "api:search"}, {"uncovered", true, "web"}, {"covered", true, "api:search"}} {
			b.Run(store+"/"+c.name, func(b *testing.B) {
				prefix := fmt.Sprintf("bench-%s-%s", store, c.name)
				cfg := enforcement.Config{Authority: stores[store](prefix), Policy: pol}
				if c.shadow {
					ev, err := shadow.New(shadow.Config{Authority: stores[store](prefix + ":shadow")})
					if err != nil {
						b.Fatal(err)
					}
					cfg.Shadow = ev
				}
				lim, err := enforcement.New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				req := enforcement.Request{Key: "k", Scope: c.scope}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					req.Key = fmt.Sprint("k", i%1000)
					if _, err := lim.Check(context.Background(), req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
