package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
	for _, bad := range []string{"500ms", "0s", "2h", "soon"} {
		_, err := loadConfig(func(k string) string {
			if k == "LIMITER_LEASE_TTL" {
				return bad
			}
			return ""
		})
		if err == nil || !strings.Contains(err.Error(), "LIMITER_LEASE_TTL") {
			t.Errorf("LIMITER_LEASE_TTL=%s: %v", bad, err)
		}
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
