package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// clusterPolicy refills slowly (100 tokens a minute, 1.7 a second), so that
// the remaining counts in TestClusterModeDegradesOnlyTheDeadMastersKeys are
// exact unless the machine is very slow, and the tolerance below covers that.
const clusterPolicy = `
version: 1
default_tier: std
tiers:
  std: { rate: 100, period: minute, burst: 100 }
`

// clusterRate is clusterPolicy's refill in tokens per second.
const clusterRate = 100.0 / 60

// TestClusterModeDegradesOnlyTheDeadMastersKeys runs the binary against a
// real 3-master Redis Cluster: decisions are exact on every slot, and
// after one master is killed only the keys it owned decide degraded.
//
// Nothing here depends on the machine's speed: the remaining count may
// exceed the exact one by at most what refilled while the test waited (the
// bucket refills on Redis's clock, which runs no faster than ours), and the
// store deadline is far above any live master's answer time even on a
// loaded machine, so a slow but live master is never taken for a dead one.
// A dead master refuses connections at once, whatever the deadline.
func TestClusterModeDegradesOnlyTheDeadMastersKeys(t *testing.T) {
	t.Parallel()
	c := testenv.StartCluster(t, 3)
	p := startLimiter(t, clusterPolicy, "REDIS_ADDRS="+strings.Join(c.Addrs(), ","), "LIMITER_STORE_TIMEOUT=1s",
		"LIMITER_BREAKER_OPEN_FOR=300ms")
	if ready := p.readyz(t); ready["store"] != "redis-cluster" {
		t.Fatalf("readyz: %v", ready)
	}
	keys := make([]string, 30)
	for i := range keys {
		keys[i] = fmt.Sprintf("acct_%d", i)
		first := time.Now() // before the key's first request: the bucket is full then
		for j := 0; j < 3; j++ {
			d, status := p.check(t, keys[i], "api", 10)
			exact := int64(90 - 10*j)
			refilled := int64(clusterRate * time.Since(first).Seconds()) // whole tokens at most
			if status != 200 || !d.Allowed || d.Source != "shared" || d.Remaining < exact || d.Remaining > min(exact+refilled, 90) {
				t.Fatalf("key %s request %d: %d %+v; want remaining %d (+ at most %d refilled)", keys[i], j, status, d, exact, refilled)
			}
		}
	}
	// Which master owns each key's slot, from the cluster itself.
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer cc.Close()
	ctx := context.Background()
	owner := map[string]string{}
	for _, k := range keys {
		n, err := cc.MasterForKey(ctx, keyslot.BucketKey("rl", k, "api"))
		if err != nil {
			t.Fatal(err)
		}
		owner[k] = n.Options().Addr
	}
	dead := c.Masters[0].Addr()
	c.Masters[0].Process().Kill()

	// Generous: it returns as soon as the breakers have opened, and only a
	// failure waits it out.
	waitFor(t, "the dead master's keys decide degraded", 60*time.Second, func() bool {
		for _, k := range keys {
			if owner[k] == dead {
				if d, _ := p.check(t, k, "api", 1); d.Source != "degraded" {
					return false
				}
			}
		}
		return true
	})
	deadKeys, liveKeys := 0, 0
	for _, k := range keys {
		d, status := p.check(t, k, "api", 1)
		if status != 200 {
			t.Fatalf("%s: %d", k, status)
		}
		if owner[k] == dead {
			deadKeys++
			continue
		}
		liveKeys++
		if d.Source != "shared" {
			t.Fatalf("key %s on a live master decided %s", k, d.Source)
		}
	}
	if deadKeys == 0 || liveKeys == 0 {
		t.Fatalf("keys on the dead master %d, on live ones %d: the test needs both", deadKeys, liveKeys)
	}
	if ready := p.readyz(t); ready["status"] != "degraded" || !strings.Contains(fmt.Sprint(ready["reason"]), dead) {
		t.Fatalf("readyz names the dead shard: %v", ready)
	}
}

// TestLeasingCutsRoundTripsForAHotKey: with leasing on, a hot key is served
// from leased blocks, and Redis sees a small fraction of the decisions.
func TestLeasingCutsRoundTripsForAHotKey(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	p := startLimiter(t, `
version: 1
default_tier: big
tiers:
  big: { rate: 100000, burst: 100000 }
`, "REDIS_ADDRS="+r.Addr(), "LIMITER_LEASE_BLOCK=100", "LIMITER_LEASE_HOT_OPS=50", "LIMITER_STORE_TIMEOUT=100ms")
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	stop := make(chan struct{})
	collect := drive(t, p, []string{"hot"}, 8, 0, stop)
	// A number of decisions, not a stretch of time: the round trips the
	// key makes before it is hot (LIMITER_LEASE_HOT_OPS) must be few
	// beside them however slow the machine.
	testenv.WaitFor(t, 60*time.Second, "3,000 decisions on the hot key", func() bool {
		return p.metric(t, "limiter_decisions_total{") >= 3000
	})
	close(stop)
	all := collect()
	calls := scriptCallsOf(t, rdb)
	allowed := 0
	for _, o := range all {
		if o.d.Allowed {
			allowed++
		}
	}
	t.Logf("hot key with leasing: %d decisions, %d allowed, %d Redis script calls (%.4f per decision)",
		len(all), allowed, calls, float64(calls)/float64(len(all)))
	if allowed < len(all)*99/100 {
		t.Fatalf("only %d of %d allowed under a limit the load never reaches", allowed, len(all))
	}
	if calls*10 > int64(len(all)) {
		t.Fatalf("%d script calls for %d decisions: leasing should cut round trips by the block size", calls, len(all))
	}
	resp, err := http.Get(p.url + "/admin/hot-keys")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	if !strings.Contains(fmt.Sprint(body), "hot") {
		t.Fatalf("/admin/hot-keys does not list the hot key: %v", body)
	}
}

func scriptCallsOf(t *testing.T, rdb *redis.Client) int64 {
	info := rdb.Info(context.Background(), "commandstats").Val()
	var n int64
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
			var calls int64
			fmt.Sscanf(strings.SplitN(line, ":", 2)[1], "calls=%d", &calls)
			n += calls
		}
	}
	return n
}
