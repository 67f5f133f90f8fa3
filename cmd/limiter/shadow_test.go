package main

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/testkit/testenv"
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
	if err != nil || len(keys) != 1 || keys[0] != "rl:shadow:{acct_1}:b2:api:export" {
		t.Fatalf("shadow keys %v (%v): want the tight-export bucket only", keys, err)
	}
	if got := p.metric(t, `limiter_shadow_decisions_total{enforced="allowed",outcome="would_reject",shadow="tight-export"}`); got != 2 {
		t.Fatalf("tight-export newly rejected %v, want 2", got)
	}
}

// TestShadowPolicyFileReloads: an edited candidate file takes effect without
// a restart (as the enforced file does), and a refused edit keeps the
// candidate in force.
func TestShadowPolicyFileReloads(t *testing.T) {
	r := testenv.StartRedis(t)
	const enforced = `
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: minute, burst: 5 }
`
	file := filepath.Join(t.TempDir(), "candidate.yaml")
	write := func(body string) {
		t.Helper()
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil { // as editors and ConfigMaps do
			t.Fatal(err)
		}
	}
	write(`
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: minute, burst: 5 }
rules:
  - { name: trial-a, scope: "api:export", burst: 3 }
`)
	p := startLimiter(t, enforced, "REDIS_ADDRS="+r.Addr(), "LIMITER_SHADOW_POLICY_FILE="+file, "LIMITER_GRPC_ADDR=")
	if d := checkShadow(t, p, "acct_1", "api:export"); d.Shadow == nil || d.Shadow.Name != "trial-a" {
		t.Fatalf("first export: shadow %+v, want trial-a", d.Shadow)
	}
	write(`
version: 1
default_tier: free
tiers:
  free: { rate: 1, period: minute, burst: 5 }
rules:
  - { name: trial-b, scope: "api:export", burst: 1 }
`)
	// Each probe spends the enforced bucket of its own key (burst 5).
	probe := 0
	eventually(t, "the edited candidate file (trial-b) to decide", func() bool {
		probe++
		d := checkShadow(t, p, "acct_probe_"+strconv.Itoa(probe), "api:export")
		return d.Shadow != nil && d.Shadow.Name == "trial-b"
	})
	eventually(t, "limiter_shadow_policy_reloads_total{result=ok} to count the reload", func() bool {
		return p.metric(t, `limiter_shadow_policy_reloads_total{result="ok"}`) >= 1
	})
	// trial-b's own bucket (burst 1) on a fresh key: the second would be rejected.
	for i := 0; i < 2; i++ {
		d := checkShadow(t, p, "acct_2", "api:export")
		if !d.Allowed || d.Shadow == nil || d.Shadow.Name != "trial-b" || d.Shadow.WouldAllow != (i == 0) {
			t.Fatalf("export %d after reload: %+v shadow %+v, want allowed, trial-b wouldAllow=%v", i, d.decision, d.Shadow, i == 0)
		}
	}
	write("version: 1\ntiers: [not, a, map]\n")
	eventually(t, "the refused candidate edit to be counted", func() bool {
		return p.metric(t, `limiter_shadow_policy_reloads_total{result="refused"}`) >= 1
	})
	if d := checkShadow(t, p, "acct_3", "api:export"); d.Shadow == nil || d.Shadow.Name != "trial-b" {
		t.Fatalf("after a refused edit: shadow %+v, want trial-b still in force", d.Shadow)
	}
	if got := p.metric(t, `limiter_shadow_policy_last_reload_successful`); got != 0 {
		t.Fatalf("limiter_shadow_policy_last_reload_successful = %v after a refused edit, want 0", got)
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
