package main

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestStartWithTheStoreDown: a limiter started while its Redis (standalone
// or Cluster) is unreachable must not crash (a crash loop of every limiter
// during a Redis outage would make the protection the outage). It answers
// degraded, says so in /readyz, and turns shared by itself once the store
// appears.
func TestStartWithTheStoreDown(t *testing.T) {
	t.Parallel()
	t.Run("standalone", func(t *testing.T) {
		port := testenv.FreePort(t)
		p := startLimiter(t, faultPolicy, "REDIS_ADDRS="+fmt.Sprintf("127.0.0.1:%d", port), "LIMITER_BREAKER_OPEN_FOR=200ms")
		expectDegradedThenShared(t, p, func() {
			r, err := testenv.NewRedisAt(t.TempDir(), port)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Close)
		})
	})
	t.Run("cluster", func(t *testing.T) {
		ports, err := testenv.ClusterPorts(3)
		if err != nil {
			t.Fatal(err)
		}
		addrs := make([]string, len(ports))
		for i, port := range ports {
			addrs[i] = fmt.Sprintf("127.0.0.1:%d", port)
		}
		p := startLimiter(t, faultPolicy, "REDIS_ADDRS="+strings.Join(addrs, ","), "LIMITER_BREAKER_OPEN_FOR=200ms")
		expectDegradedThenShared(t, p, func() {
			c, err := testenv.NewClusterAt(t.TempDir(), ports)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
		})
	})
}

func expectDegradedThenShared(t *testing.T, p *limiterProc, startStore func()) {
	t.Helper()
	for i := range 20 {
		d, status := p.check(t, "k", "api", 1)
		if status != 200 || d.Source != "degraded" {
			t.Fatalf("request %d with the store down: %d %+v, want 200 degraded", i, status, d)
		}
	}
	if ready := p.readyz(t); ready["httpStatus"] != 200 || ready["status"] != "degraded" {
		t.Fatalf("readyz with the store down: %v", ready)
	}
	startStore()
	took := waitFor(t, "decisions turn shared once the store is up", 60*time.Second, func() bool {
		d, _ := p.check(t, "k2", "api", 1)
		return d.Source == "shared"
	})
	waitFor(t, "readyz turns ok once the store is up", 30*time.Second, func() bool {
		return p.readyz(t)["status"] == "ok"
	})
	t.Logf("shared %v after the store came up", took.Round(time.Millisecond))
	select {
	case <-p.done:
		t.Fatalf("the limiter exited: %s", p.logs.String())
	default:
	}
}

// quotaPolicy: a bucket that never binds and a monthly quota of 3, as in
// the report "a monthly quota of 3 with the store unreachable admitted 20
// of 20"; the deny tier gives keys never seen nothing while degraded.
const quotaPolicy = `
version: 1
default_tier: std
tiers:
  std:  { rate: 1000, burst: 1000, quota: { limit: 3, period: month } }
  deny: { rate: 1000, burst: 1000, quota: { limit: 3, period: month, unknown_while_degraded: deny } }
keys:
  acct_deny: deny
`

// TestQuotaHoldsWhileTheStoreIsDown: with Redis unreachable, a quota is
// spent only up to what the store last said was left (÷ instances); a key
// never seen gets its share of the quota, or nothing when its policy says so.
func TestQuotaHoldsWhileTheStoreIsDown(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	p := startLimiter(t, quotaPolicy, "REDIS_ADDRS="+r.Addr(), "LIMITER_BREAKER_OPEN_FOR=200ms")
	// remaining reports the binding constraint: 2 left of the quota's 3,
	// not the bucket's 999.
	if d, _ := p.check(t, "acct_seen", "api", 1); !d.Allowed || d.Source != "shared" || d.Remaining != 2 || d.Limit != 3 {
		t.Fatalf("first request: %+v, want allowed by the store with 2 of the quota's 3 remaining", d)
	}
	r.Process().Kill()
	count := func(key string, n int) (allowed int) {
		for range n {
			d, status := p.check(t, key, "api", 1)
			if status != 200 || (d.Source != "degraded" && d.Source != "local") {
				t.Fatalf("%s with the store down: %d %+v", key, status, d)
			}
			if d.Allowed {
				allowed++
			}
		}
		return allowed
	}
	if got := count("acct_seen", 20); got != 2 {
		t.Fatalf("a key that had spent 1 of 3: %d of 20 admitted while degraded, want 2", got)
	}
	if got := count("acct_never", 20); got != 3 {
		t.Fatalf("a key never seen: %d of 20 admitted while degraded, want its share 3", got)
	}
	if got := count("acct_deny", 20); got != 0 {
		t.Fatalf("a key never seen under unknown_while_degraded: deny: %d of 20 admitted, want 0", got)
	}
	// Whatever the breaker's state, readiness tells the truth.
	if ready := p.readyz(t); ready["status"] != "degraded" {
		t.Fatalf("readyz after degraded decisions: %v", ready)
	}
}

// TestReadinessWithLightTrafficAndTheStoreDown: one decision with the store
// gone is degraded, and /readyz says so although one failure cannot open
// the breaker; with no traffic at all, the fleet heartbeat finds out.
func TestReadinessWithLightTrafficAndTheStoreDown(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	p := startLimiter(t, faultPolicy, "REDIS_ADDRS="+r.Addr(), "LIMITER_BREAKER_FAILURES=1000", "LIMITER_FLEET_HEARTBEAT=100ms")
	if d, _ := p.check(t, "k", "api", 1); d.Source != "shared" {
		t.Fatalf("first: %+v", d)
	}
	r.Process().Kill()
	waitFor(t, "readyz says degraded with no traffic (the heartbeat fails)", 30*time.Second, func() bool {
		return p.readyz(t)["status"] == "degraded"
	})
	if d, _ := p.check(t, "k", "api", 1); d.Source != "degraded" {
		t.Fatalf("with the store down: %+v", d)
	}
	if ready := p.readyz(t); ready["status"] != "degraded" || ready["breaker"] != "closed" {
		t.Fatalf("readyz after one degraded decision (breaker still closed): %v", ready)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "readyz turns ok once the store answers again", 30*time.Second, func() bool {
		p.check(t, "k", "api", 1)
		return p.readyz(t)["status"] == "ok"
	})
}

// fleetPolicy: a bucket that refills too slowly to matter in the test, so
// the tightened burst alone says what the instance divided by.
const fleetPolicy = `
version: 1
default_tier: std
tiers:
  std: { rate: 1, period: hour, burst: 120 }
`

// TestFleetSizeDividesTheDegradedLimit: instances count each other through
// the heartbeat as they join and leave; when the store then goes away,
// each enforces the limit ÷ the fleet it last counted, not ÷ the
// configured LIMITER_EXPECTED_INSTANCES.
func TestFleetSizeDividesTheDegradedLimit(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	env := []string{"REDIS_ADDRS=" + r.Addr(), "LIMITER_EXPECTED_INSTANCES=1", "LIMITER_FLEET_HEARTBEAT=100ms",
		"LIMITER_BREAKER_OPEN_FOR=200ms"}
	procs := make([]*limiterProc, 4)
	for i := range procs {
		procs[i] = startLimiter(t, fleetPolicy, append(env, fmt.Sprintf("LIMITER_INSTANCE_ID=i%d", i))...)
	}
	waitCount := func(want int, ps []*limiterProc) {
		t.Helper()
		waitFor(t, fmt.Sprintf("every instance counts %d", want), 30*time.Second, func() bool {
			for _, p := range ps {
				if p.metric(t, "limiter_fleet_instances") != float64(want) {
					return false
				}
			}
			return true
		})
	}
	waitCount(4, procs)
	// One leaves gracefully (SIGTERM: it leaves the fleet on the way out).
	procs[3].cmd.Process.Signal(syscall.SIGTERM)
	<-procs[3].done
	waitCount(3, procs[:3])

	r.Process().Kill()
	for _, p := range procs[:3] {
		waitFor(t, "the instance notices the store is gone", 30*time.Second, func() bool {
			return p.readyz(t)["status"] == "degraded"
		})
	}
	// A never-seen key on each instance: the tightened burst is 120 ÷ 3.
	for i, p := range procs[:3] {
		allowed := 0
		for range 100 {
			d, _ := p.check(t, "fresh", "api", 1)
			if d.Allowed {
				allowed++
			}
		}
		if allowed != 40 {
			t.Fatalf("instance %d admitted %d with the store down, want 120 ÷ 3 instances = 40", i, allowed)
		}
	}
}
