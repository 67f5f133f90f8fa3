package policy_test

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// requests the benchmarks resolve: the common shapes of traffic.
var benchRequests = []struct{ name, key, scope, tier string }{
	{"no rule (default tier)", "user_77", "api:read", ""},
	{"keys map + tier and exact scope", "acct_2", "api:search", ""},
	{"tier from the request + glob", "x", "web:settings", "pro"},
	{"key_prefix", "ip:203.0.113.7", "api:read", ""},
	{"exact key (last rules)", "acct_1019", "api:read", ""},
}

// BenchmarkResolve is the cost of resolving a limit from scratch against a
// 50-rule policy (testdata/bench50.yaml): what the limiter pays once per
// (key, scope) and per policy reload, not per decision.
func BenchmarkResolve(b *testing.B) {
	p := load(b, "testdata/bench50.yaml")
	for _, r := range benchRequests {
		b.Run(r.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.Resolve(r.key, r.scope, r.tier); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParse is the cost of a reload's validation of the 50-rule file
// (2,000 keys in the keys map).
func BenchmarkParse(b *testing.B) {
	src, err := os.ReadFile("testdata/bench50.yaml")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := policy.Parse(src); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckResolution isolates resolution on the decision path: the
// in-process authority (no network), one key and scope, with the resolved
// limit cached ("cached", every decision after the first of an entry) and
// with a policy swap before every decision ("re-resolved", the first
// decision of each entry after a reload). The difference is what
// resolution costs a decision; "cached" is the steady state.
func BenchmarkCheckResolution(b *testing.B) {
	p := load(b, "testdata/bench50.yaml")
	for _, r := range benchRequests[1:3] {
		for _, swap := range []bool{false, true} {
			mode := "cached"
			if swap {
				mode = "re-resolved"
			}
			b.Run(r.name+"/"+mode, func(b *testing.B) {
				lim, err := enforcement.New(enforcement.Config{
					Authority: enforcement.NewMemoryAuthority(nil, 1000), Policy: p,
					// a local tier that never fires: every decision takes the full path
					LocalHeadroom: 1e9,
				})
				if err != nil {
					b.Fatal(err)
				}
				req := enforcement.Request{Key: r.key, Scope: r.scope, Tier: r.tier, Cost: 0, HasCost: true}
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					if swap {
						lim.SetPolicy(p)
					}
					if _, err := lim.Check(ctx, req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkCheckRedis is the same cached path against a real redis-server,
// to set the resolution cost against a decision's round trip.
func BenchmarkCheckRedis(b *testing.B) {
	srv := testenv.StartRedis(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 64, ContextTimeoutEnabled: true})
	defer rdb.Close()
	p := load(b, "testdata/bench50.yaml")
	for _, swap := range []bool{false, true} {
		mode := "cached"
		if swap {
			mode = "re-resolved"
		}
		b.Run(mode, func(b *testing.B) {
			lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, "bench"), Policy: p})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				if swap {
					lim.SetPolicy(p)
				}
				i++
				// 1,000 keys of the enterprise tier: allowed, decided by Redis.
				req := enforcement.Request{Key: "acct_" + strconv.Itoa(3+4*(i%500)), Scope: "api:read"}
				if _, err := lim.Check(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
