package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement/envoyrls"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const slotsPolicy = `
version: 1
default_tier: reports
priorities: { critical: 1, default: 1, sheddable: 0.34 }
tiers:
  reports: { concurrency: 3 }
`

func TestConfigLeaseTTL(t *testing.T) {
	c, err := loadConfig(func(string) string { return "" })
	if err != nil || c.LeaseTTL != 10*time.Second {
		t.Fatalf("default LIMITER_LEASE_TTL: %v, %v", c.LeaseTTL, err)
	}
	for _, name := range []string{"LIMITER_LEASE_TTL", "LIMITER_ENVOY_LEASE_TTL"} {
		for _, bad := range []string{"500ms", "0s", "2h", "soon"} {
			_, err := loadConfig(func(k string) string {
				if k == name {
					return bad
				}
				return ""
			})
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s=%s: %v", name, bad, err)
			}
		}
	}
	// The Envoy door's lease is LIMITER_LEASE_TTL's unless set.
	env := map[string]string{"LIMITER_LEASE_TTL": "30s"}
	if c, err := loadConfig(func(k string) string { return env[k] }); err != nil || c.EnvoyLeaseTTL != 30*time.Second {
		t.Fatalf("LIMITER_ENVOY_LEASE_TTL unset: %v, %v", c.EnvoyLeaseTTL, err)
	}
	env["LIMITER_ENVOY_LEASE_TTL"] = "2m"
	if c, err := loadConfig(func(k string) string { return env[k] }); err != nil || c.EnvoyLeaseTTL != 2*time.Minute || c.LeaseTTL != 30*time.Second {
		t.Fatalf("LIMITER_ENVOY_LEASE_TTL=2m: %v %v, %v", c.EnvoyLeaseTTL, c.LeaseTTL, err)
	}
}

// TestSlotsAcrossLimiterProcesses: two limiter processes share one key's
// three slots in Redis. A slot taken through one is released through the
// other; a second release frees nothing; the fourth request is refused
// "concurrency" and a sheddable one past its share "shed"; a limiter
// SIGKILLed while its callers hold slots loses nothing (the slots are in
// Redis: the other releases them); leases nobody renews come back after
// LIMITER_LEASE_TTL, on Redis's clock.
func TestSlotsAcrossLimiterProcesses(t *testing.T) {
	r := testenv.StartRedis(t)
	env := []string{"REDIS_ADDRS=" + r.Addr(), "LIMITER_LEASE_TTL=5s"}
	a := startLimiter(t, slotsPolicy, env...)
	b := startLimiter(t, slotsPolicy, env...)
	var leases []string
	for i, p := range []*limiterProc{a, b, a} {
		code, d := p.post(t, "/check", `{"key":"acct","scope":"export"}`)
		lease, _ := d["lease"].(string)
		if code != 200 || d["allowed"] != true || lease == "" || d["leaseExpiresAt"] == nil {
			t.Fatalf("check %d: %d %v", i, code, d)
		}
		leases = append(leases, lease)
	}
	if code, d := b.post(t, "/check", `{"key":"acct","scope":"export"}`); code != 200 || d["allowed"] != false || d["reason"] != "concurrency" {
		t.Fatalf("fourth: %d %v", code, d)
	}
	if code, d := b.post(t, "/release", `{"lease":"`+leases[0]+`"}`); code != 200 || d["released"] != true {
		t.Fatalf("release on the other limiter: %d %v", code, d)
	}
	if code, d := a.post(t, "/release", `{"lease":"`+leases[0]+`"}`); code != 200 || d["released"] != false {
		t.Fatalf("second release: %d %v", code, d)
	}
	if code, d := a.post(t, "/check", `{"key":"acct","scope":"export","priority":"sheddable"}`); code != 200 || d["allowed"] != false || d["reason"] != "shed" {
		t.Fatalf("sheddable at 2 of 3 held: %d %v", code, d)
	}
	if code, d := a.post(t, "/renew", `{"lease":"`+leases[1]+`"}`); code != 200 || d["renewed"] != true {
		t.Fatalf("renew: %d %v", code, d)
	}

	// Limiter a dies; the slots its callers hold are in Redis, and b
	// releases one of them.
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.done
	if code, d := b.post(t, "/release", `{"lease":"`+leases[1]+`"}`); code != 200 || d["released"] != true {
		t.Fatalf("release after the issuing limiter died: %d %v", code, d)
	}

	// Nobody renews leases[2]: it ends on Redis's clock, and then every
	// slot is b's to give.
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	c := redisstore.NewConcurrency(rdb, "")
	eventually(t, "the unrenewed lease ends", func() bool {
		n, err := c.Held(context.Background(), rdb, "acct", "export")
		return err == nil && n == 0
	})
	if code, d := b.post(t, "/renew", `{"lease":"`+leases[2]+`"}`); code != 404 {
		t.Fatalf("renew after the lease ended: %d %v", code, d)
	}
	for i := range 3 {
		if code, d := b.post(t, "/check", `{"key":"acct","scope":"export","priority":"critical"}`); code != 200 || d["allowed"] != true {
			t.Fatalf("after the lease ended, %d: %d %v", i, code, d)
		}
	}
	if got := b.metric(t, `limiter_slot_decisions_total{outcome="admitted",priority="critical",source="shared"}`); got != 3 {
		t.Fatalf("admitted critical: %v", got)
	}
}

// TestSlotsThroughTheEnvoyDoor: two limiter binaries on one Redis, as
// Envoy's filter uses them: a slot taken through one's gRPC door is named
// in the answer's dynamic metadata, leased for LIMITER_ENVOY_LEASE_TTL
// (not LIMITER_LEASE_TTL), given back by a stream-done call to the other,
// and taken again; the priority entry sheds.
func TestSlotsThroughTheEnvoyDoor(t *testing.T) {
	r := testenv.StartRedis(t)
	const pol = slotsPolicy + `domains:
  edge:
    descriptors:
      - { match: [api_key], key: "{api_key}", scope: "export" }
`
	env := []string{"REDIS_ADDRS=" + r.Addr(), "LIMITER_LEASE_TTL=1m", "LIMITER_ENVOY_LEASE_TTL=1h"}
	_, addrA := startEnvoyLimiter(t, pol, env...)
	_, addrB := startEnvoyLimiter(t, pol, env...)
	a := rlsv3.NewRateLimitServiceClient(dial(t, addrA))
	b := rlsv3.NewRateLimitServiceClient(dial(t, addrB))
	lease := func(resp *rlsv3.RateLimitResponse) string {
		return resp.GetDynamicMetadata().GetFields()[envoyrls.LeaseMetadataKey].GetStringValue()
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	var leases []string
	for i, c := range []rlsv3.RateLimitServiceClient{a, b, a} {
		resp := rls(t, c, "edge", 0, desc("api_key", "acct"))
		if resp.OverallCode != ok || lease(resp) == "" {
			t.Fatalf("take %d: %v", i, resp)
		}
		leases = append(leases, lease(resp))
	}
	if resp := rls(t, b, "edge", 0, desc("api_key", "acct")); resp.OverallCode != over ||
		resp.GetDynamicMetadata().GetFields()[envoyrls.ReasonMetadataKey].GetStringValue() != "concurrency" {
		t.Fatalf("fourth: %v", resp)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	ends, err := rdb.ZRangeWithScores(context.Background(), redisstore.NewConcurrency(rdb, "").SetKey("acct", "export"), 0, -1).Result()
	if err != nil || len(ends) != 3 {
		t.Fatalf("the slots in Redis: %v, %v", ends, err)
	}
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ends {
		if left := time.Duration(int64(e.Score)-now.UnixMilli()) * time.Millisecond; left < 30*time.Minute {
			t.Fatalf("a lease of the Envoy door ends in %v: not LIMITER_ENVOY_LEASE_TTL=1h", left)
		}
	}
	if resp := rls(t, b, "edge", 0, desc(envoyrls.ReleaseEntryKey, leases[0])); resp.OverallCode != ok {
		t.Fatalf("stream done: %v", resp)
	}
	rls(t, a, "edge", 0, desc(envoyrls.ReleaseEntryKey, leases[0])) // a duplicate frees nothing
	if resp := rls(t, a, "edge", 0, desc("api_key", "acct", envoyrls.PriorityEntryKey, "sheddable")); resp.OverallCode != over ||
		resp.GetDynamicMetadata().GetFields()[envoyrls.ReasonMetadataKey].GetStringValue() != "shed" {
		t.Fatalf("sheddable at 2 of 3 held: %v", resp)
	}
	if resp := rls(t, a, "edge", 0, desc("api_key", "acct", envoyrls.PriorityEntryKey, "critical")); resp.OverallCode != ok || lease(resp) == "" {
		t.Fatalf("critical with the released slot free: %v", resp)
	}
	if resp := rls(t, a, "edge", 0, desc("api_key", "acct", envoyrls.PriorityEntryKey, "critical")); resp.OverallCode != over {
		t.Fatalf("the duplicate release freed a slot: %v", resp)
	}
}
