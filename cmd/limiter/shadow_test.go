package main

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/internal/testenv"
)

// TestShadowPolicyFile: LIMITER_SHADOW_POLICY_FILE evaluates a whole
// candidate beside the enforced file. Where the candidate's limit is the
// enforced one the verdict is the enforced verdict (no second bucket); where
// it is tighter, its own bucket in the rl:shadow namespace decides.
func TestShadowPolicyFile(t *testing.T) {
	r := testenv.StartRedis(t)
	const enforced = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: minute, burst: 5 }
`
	const candidate = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: minute, burst: 5 }
rules:
  - { name: tight-export, scope: "api:export", burst: 2 }
`
	file := filepath.Join(t.TempDir(), "candidate.yaml")
	if err := os.WriteFile(file, []byte(candidate), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startLimiter(t, enforced, "REDIS_ADDRS="+r.Addr(), "LIMITER_SHADOW_POLICY_FILE="+file, "LIMITER_GRPC_ADDR=")
	for i := 0; i < 6; i++ {
		d := checkShadow(t, p, "acct_1", "api:read")
		if d.Allowed != (i < 5) || d.Shadow == nil || d.Shadow.Name != "free" || d.Shadow.WouldAllow != d.Allowed {
			t.Fatalf("read %d: %+v shadow %+v, want the enforced verdict mirrored under the name free", i, d.decision, d.Shadow)
		}
	}
	for i := 0; i < 4; i++ {
		d := checkShadow(t, p, "acct_1", "api:export")
		if !d.Allowed || d.Shadow == nil || d.Shadow.Name != "tight-export" || d.Shadow.WouldAllow != (i < 2) {
			t.Fatalf("export %d: %+v shadow %+v, want allowed, tight-export wouldAllow=%v", i, d.decision, d.Shadow, i < 2)
		}
	}
	keys, err := redisKeys(t, r.Addr(), "rl:shadow:*")
	if err != nil || len(keys) != 1 || keys[0] != "rl:shadow:{acct_1}:b:api:export" {
		t.Fatalf("shadow keys %v (%v): want the tight-export bucket only", keys, err)
	}
	if got := p.metric(t, `limiter_shadow_decisions_total{enforced="allowed",outcome="would_reject",shadow="tight-export"}`); got != 2 {
		t.Fatalf("tight-export newly rejected %v, want 2", got)
	}
}

func redisKeys(t *testing.T, addr, pattern string) ([]string, error) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys, err := rdb.Keys(ctx, pattern).Result()
	sort.Strings(keys)
	return keys, err
}
