package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// storesPolicy routes acct_acme (its key entry) and the whole "dedicated"
// tier to the store "acme"; everything else stays on the default store.
const storesPolicy = `
version: 1
default_tier: std
tiers:
  std: { rate: 0.001, burst: 5 }
  dedicated: { rate: 0.001, burst: 5, store: acme, quota: { limit: 1000, period: day } }
  enterprise: { rate: 0.001, burst: 5 }
keys:
  acct_acme: { tier: enterprise, store: acme }
  acct_big: dedicated
  acct_small: std
`

func storesEnv(def, acme *testenv.Redis) []string {
	return []string{
		"REDIS_ADDRS=" + def.Addr(),
		"REDIS_STORES=acme=" + acme.Addr(),
		// Generous for a loaded machine with the race detector; a killed
		// server refuses connections, which fails at once whatever it is.
		"LIMITER_STORE_TIMEOUT=500ms",
		"LIMITER_BREAKER_FAILURES=3",
		"LIMITER_BREAKER_OPEN_FOR=10m", // once open, open for the whole test
		"LIMITER_FLEET_HEARTBEAT=100ms",
	}
}

// TestDedicatedStoreHoldsItsKeysOnly: a key routed to a named store has
// its bucket there and only there (both servers inspected), its quota and
// its decisions too; the others stay on the default store.
func TestDedicatedStoreHoldsItsKeysOnly(t *testing.T) {
	def, acme := testenv.StartRedis(t), testenv.StartRedis(t)
	p := startLimiter(t, storesPolicy, storesEnv(def, acme)...)
	for _, k := range []string{"acct_acme", "acct_big", "acct_small", "acct_other"} {
		for i := range 6 {
			d, status := p.check(t, k, "api", 1)
			if status != 200 || d.Allowed != (i < 5) || (i < 5 && d.Source != "shared") {
				t.Fatalf("%s #%d: %d %+v, want the first 5 of burst 5 allowed by the shared store, the 6th rejected", k, i, status, d)
			}
		}
	}
	ctx := context.Background()
	// Every Redis key of a rate-limit key carries it as its hash tag.
	keysOf := func(r *testenv.Redis, key string) []string {
		c := redis.NewClient(&redis.Options{Addr: r.Addr()})
		defer c.Close()
		ks, err := c.Keys(ctx, "*{"+key+"}*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return ks
	}
	for _, c := range []struct {
		key    string
		onAcme bool
	}{{"acct_acme", true}, {"acct_big", true}, {"acct_small", false}, {"acct_other", false}} {
		if bucketHeld(t, acme, c.key) != c.onAcme || bucketHeld(t, def, c.key) == c.onAcme {
			t.Errorf("%s: bucket on acme %v, on default %v; want only on %s", c.key, bucketHeld(t, acme, c.key), bucketHeld(t, def, c.key),
				map[bool]string{true: "acme", false: "default"}[c.onAcme])
		}
		there, elsewhere := keysOf(acme, c.key), keysOf(def, c.key)
		if !c.onAcme {
			there, elsewhere = elsewhere, there
		}
		if len(elsewhere) != 0 {
			t.Errorf("%s: keys on the other store: %v", c.key, elsewhere)
		}
		if c.key == "acct_big" && len(there) != 2 { // the bucket and the day's quota counter
			t.Errorf("%s: keys %v, want its bucket and its quota counter", c.key, there)
		}
	}
	// Polled: a fleet heartbeat that a starved process could not send in
	// time shows in /readyz until the next one lands.
	var ready map[string]any
	if err := testenv.Poll(30*time.Second, func() bool {
		ready = p.readyz(t)
		stores, _ := ready["stores"].(map[string]any)
		for _, name := range []string{"default", "acme"} {
			s, _ := stores[name].(map[string]any)
			if s["status"] != "ok" || s["breaker"] != "closed" || s["store"] != "redis" {
				return false
			}
		}
		return ready["status"] == "ok" && ready["store"] == "redis"
	}); err != nil {
		t.Errorf("readyz: %v, want both stores ok, closed, redis and the top level ok (%v)", ready, err)
	}
	// Each store counts the fleet that shares it.
	waitFor(t, "each store reports its fleet count", 30*time.Second, func() bool {
		st, _ := p.readyz(t)["stores"].(map[string]any)
		a, _ := st["acme"].(map[string]any)
		d, _ := st["default"].(map[string]any)
		return a["instances"] == 1.0 && d["instances"] == 1.0
	})
}

// TestKillingEitherStoreDegradesOnlyItsKeys: with the named store dead,
// its keys decide degraded and the default store's stay shared; and the
// other way round.
func TestKillingEitherStoreDegradesOnlyItsKeys(t *testing.T) {
	t.Parallel()
	onAcme := []string{"acct_acme", "acct_big"}
	onDefault := []string{"acct_small", "acct_other"}
	for _, kill := range []string{"acme", "default"} {
		t.Run("kill "+kill, func(t *testing.T) {
			def, acme := testenv.StartRedis(t), testenv.StartRedis(t)
			p := startLimiter(t, storesPolicy, storesEnv(def, acme)...)
			dead, live := onAcme, onDefault
			victim := acme
			if kill == "default" {
				dead, live, victim = onDefault, onAcme, def
			}
			for _, k := range append(append([]string{}, dead...), live...) {
				if d, _ := p.check(t, k, "api", 0); d.Source != "shared" {
					t.Fatalf("before the kill %s decided %s", k, d.Source)
				}
			}
			victim.Process().Kill()
			for round := range 5 {
				for _, k := range dead {
					if d, _ := p.check(t, k, "api", 0); d.Source != "degraded" {
						t.Fatalf("round %d: %s (on the dead store %s) decided %s, want degraded", round, k, kill, d.Source)
					}
				}
				for _, k := range live {
					if d, _ := p.check(t, k, "api", 0); d.Source != "shared" {
						t.Fatalf("round %d: %s (on the live store) decided %s, want shared", round, k, d.Source)
					}
				}
			}
			other := map[string]string{"acme": "default", "default": "acme"}[kill]
			waitFor(t, "readyz says which store is down", 30*time.Second, func() bool {
				r := p.readyz(t)
				st, _ := r["stores"].(map[string]any)
				k, _ := st[kill].(map[string]any)
				o, _ := st[other].(map[string]any)
				return r["status"] == "degraded" && k["status"] == "degraded" && k["breaker"] == "open" &&
					o["status"] == "ok" && o["breaker"] == "closed"
			})
		})
	}
}

// TestPolicyNamingAnUnknownStoreIsRefused: at start, and by `policy check`.
func TestPolicyNamingAnUnknownStoreIsRefused(t *testing.T) {
	testenv.SkipShort(t) // runs the binary
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(storesPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(env []string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, limiterBin, args...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run([]string{"REDIS_STORES="}, "policy", "check", path)
	if err == nil || !strings.Contains(out, `names store "acme", which is not configured`) {
		t.Fatalf("policy check without REDIS_STORES: %v\n%s", err, out)
	}
	if out, err := run([]string{"REDIS_STORES=acme=127.0.0.1:1"}, "policy", "check", path); err != nil {
		t.Fatalf("policy check with acme configured: %v\n%s", err, out)
	}
	r := testenv.StartRedis(t)
	out, err = run([]string{"REDIS_ADDRS=" + r.Addr(), "REDIS_STORES=other=" + r.Addr(), "POLICY_FILE=" + path,
		"LIMITER_ADDR=" + fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), "LIMITER_GRPC_ADDR=", "LIMITER_SHUTDOWN_GRACE=100ms"})
	if err == nil || !strings.Contains(out, `acme`) || !strings.Contains(out, `which is not configured`) {
		t.Fatalf("start with a policy naming an unknown store: %v\n%s", err, out)
	}
	if _, err := run([]string{"REDIS_STORES=default=" + r.Addr(), "REDIS_ADDRS=" + r.Addr()}, "policy", "check", path); err == nil {
		t.Fatal(`policy check accepted REDIS_STORES naming "default"`)
	}
}

// bucketHeld reports whether r holds key's bucket (scope "api", the
// default key prefix): which store a key's decisions went to.
func bucketHeld(t *testing.T, r *testenv.Redis, key string) bool {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	n, err := c.Exists(context.Background(), keyslot.BucketKey("rl", key, "api")).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}
