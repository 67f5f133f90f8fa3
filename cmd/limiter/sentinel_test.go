package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestSentinelFailoverUnderLoad: the limiter finds its master through
// three redis-sentinel processes (REDIS_SENTINEL_MASTER, an ACL user on
// the data nodes). The master is SIGKILLed while /check requests run:
// every request is answered (200, never an error or a hang), decisions go
// degraded while there is no master and back to shared by themselves once
// Sentinel has promoted the replica — no restart.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	t.Parallel()
	testSentinelFailover(t, testenv.StartSentinels(t, "ratewarden", redisPW, time.Second))
}

// TestSentinelFailoverOverTLS is the same failover with every node and
// sentinel serving TLS only (replication and the sentinels' own links over
// TLS too) and the limiter presenting a client certificate: the way a
// managed Redis with Sentinel runs.
func TestSentinelFailoverOverTLS(t *testing.T) {
	t.Parallel()
	certs := testenv.NewCerts(t)
	s := testenv.StartSecureSentinels(t, testenv.Secure{Certs: certs, User: "ratewarden", Password: redisPW}, time.Second)
	testSentinelFailover(t, s,
		"REDIS_TLS=true",
		"REDIS_TLS_CA_FILE="+certs.CAFile,
		"REDIS_TLS_CERT_FILE="+certs.ClientCert,
		"REDIS_TLS_KEY_FILE="+certs.ClientKey,
	)
}

func testSentinelFailover(t *testing.T, s *testenv.Sentinels, env ...string) {
	pwFile := filepath.Join(t.TempDir(), "redis-password")
	writeSecret(t, pwFile, redisPW)
	p := startLimiter(t, faultPolicy, append([]string{
		"REDIS_ADDRS=" + strings.Join(s.Addrs(), ","),
		"REDIS_SENTINEL_MASTER=" + s.Master,
		"REDIS_USERNAME=ratewarden",
		"REDIS_PASSWORD_FILE=" + pwFile,
		"LIMITER_EXPECTED_INSTANCES=2",
		"LIMITER_BREAKER_OPEN_FOR=200ms",
		"LIMITER_FLEET_HEARTBEAT=100ms",
	}, env...)...)
	waitFor(t, "a shared decision through Sentinel", 30*time.Second, func() bool {
		d, _ := p.check(t, "probe", "api", 1)
		return d.Source == "shared"
	})
	// Ready through Sentinel. Polled, not read once: a fleet heartbeat
	// that a starved process could not send in time makes /readyz say
	// degraded until the next one lands.
	var r map[string]any
	if err := testenv.Poll(30*time.Second, func() bool {
		r = p.readyz(t)
		return r["status"] == "ok" && r["store"] == "redis-sentinel"
	}); err != nil {
		t.Fatalf("readyz: %v (%v)", r, err)
	}
	master, replica := s.Nodes[0], s.Nodes[1]

	keys := []string{"k0", "k1", "k2", "k3"}
	stop := make(chan struct{})
	collect := drive(t, p, keys, 8, 0, stop)
	time.Sleep(500 * time.Millisecond)
	killedAt := time.Now()
	master.Process().Kill()

	waitFor(t, "decisions turn degraded once the master is gone", 30*time.Second, func() bool {
		d, _ := p.check(t, "probe", "api", 1)
		return d.Source == "degraded"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	waitFor(t, "Sentinel promotes the replica", 60*time.Second, func() bool {
		port, err := s.MasterPort(ctx)
		return err == nil && port == replica.Port
	})
	promotedAt := time.Now()
	waitFor(t, "decisions turn shared again on the promoted replica, without a restart", 60*time.Second, func() bool {
		d, _ := p.check(t, "probe2", "api", 1)
		return d.Source == "shared"
	})
	time.Sleep(500 * time.Millisecond) // a stretch of shared decisions on the new master
	close(stop)
	all := collect()

	var degraded, shared, errors int
	var firstDegraded, lastDegraded, firstSharedAfter time.Time
	var slowest time.Duration
	for _, o := range all {
		if o.status != 200 {
			errors++
			continue
		}
		slowest = max(slowest, o.latency)
		switch {
		case o.d.Source == "degraded":
			degraded++
			if firstDegraded.IsZero() {
				firstDegraded = o.at
			}
			lastDegraded = o.at
		case o.d.Source == "shared" && o.at.After(killedAt):
			shared++
			if !lastDegraded.IsZero() && firstSharedAfter.IsZero() && o.at.After(lastDegraded) {
				firstSharedAfter = o.at
			}
		}
	}
	if errors > 0 {
		t.Fatalf("%d of %d /check requests were not answered 200", errors, len(all))
	}
	if degraded == 0 || firstSharedAfter.IsZero() {
		t.Fatalf("want degraded decisions then shared ones: degraded %d, shared after the kill %d", degraded, shared)
	}
	if err := testenv.Poll(30*time.Second, func() bool { r = p.readyz(t); return r["status"] == "ok" }); err != nil {
		t.Errorf("readyz after the failover: %v (%v)", r, err)
	}
	select {
	case <-p.done:
		t.Fatal("the limiter exited")
	default:
	}
	assertNoSecret(t, p, redisPW)
	// The figures BENCHMARKS.md records ("Sentinel failover").
	t.Logf("sentinel failover: %d decisions, %d degraded; degraded from %v after the kill for %v; Sentinel promoted the replica %v after the kill; shared again %v after the kill; slowest /check %v",
		len(all), degraded, firstDegraded.Sub(killedAt).Round(time.Millisecond), lastDegraded.Sub(firstDegraded).Round(time.Millisecond),
		promotedAt.Sub(killedAt).Round(time.Millisecond), firstSharedAfter.Sub(killedAt).Round(time.Millisecond), slowest.Round(time.Millisecond))
}
