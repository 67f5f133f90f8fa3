package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/internal/testenv"
)

// killPolicy is a limit no key reaches during the test: every decision is
// the shared store's (or degraded), never a local rejection.
const killPolicy = `
version: 1
default_tier: big
tiers:
  big: { rate: 1000000, burst: 1000000 }
`

// TestClusterMasterKilledUnderLoad kills (SIGKILL) one master of a real
// 3-master Cluster while decisions for the keys of every master are in
// flight from concurrent clients, through the binary at its default store
// settings (LIMITER_STORE_TIMEOUT 5 ms, four batches in flight to each
// master). No decision for a key of a live master is ever answered
// anything but shared: not while the master dies, not in the first
// requests after, not while the others mark it failed and the cluster
// client reloads its slots. Every decision for the dead master's keys asked
// after it died is degraded.
//
// Nothing is timed: whether a live key's decision is late is the guard's
// call, and its starvation rule (a call waits Timeout plus StarvedGrace of
// the time this process ran, up to MaxWait, when the process or the machine
// was short of CPU) is what keeps a loaded machine from failing a healthy
// master; a dead master's decisions held a live master's for up to the
// dead batch's deadline (1 s) before the lanes per master, far beyond that.
func TestClusterMasterKilledUnderLoad(t *testing.T) {
	c := testenv.StartCluster(t, 3)
	p := startLimiter(t, killPolicy, "REDIS_ADDRS="+strings.Join(c.Addrs(), ","))
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer cc.Close()
	ctx := context.Background()
	keys := make([]string, 60)
	owner := map[string]string{}
	perMaster := map[string]int{}
	for i := range keys {
		keys[i] = fmt.Sprintf("acct_%d", i)
		n, err := cc.MasterForKey(ctx, keyslot.BucketKey("rl", keys[i], "api"))
		if err != nil {
			t.Fatal(err)
		}
		owner[keys[i]] = n.Options().Addr
		perMaster[owner[keys[i]]]++
	}
	if len(perMaster) != 3 {
		t.Fatalf("the keys land on %d masters, want 3: %v", len(perMaster), perMaster)
	}
	dead := c.Masters[0].Addr()

	type obs struct {
		key     string
		at, end time.Time
		status  int
		source  string
	}
	const workers, perWorker = 6, 20000 // bounded in count; stop bounds it in time
	var (
		mu    sync.Mutex
		all   []obs
		asked atomic.Int64
		wg    sync.WaitGroup
	)
	stop := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]obs, 0, 1024)
			defer func() { mu.Lock(); all = append(all, mine...); mu.Unlock() }()
			for i := range perWorker {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[(w*7+i)%len(keys)]
				start := time.Now()
				d, status := p.check(t, k, "api", 1)
				mine = append(mine, obs{key: k, at: start, end: time.Now(), status: status, source: d.Source})
				asked.Add(1)
			}
		}()
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	// Load on every master before the kill.
	waitFor(t, "decisions flow before the kill", 60*time.Second, func() bool { return asked.Load() >= 5*int64(len(keys)) })

	c.Masters[0].Process().Kill() // SIGKILL; returns once the process is gone
	deadAt := time.Now()
	c.KillMaster(t, 0) // and until the live masters have marked it failed
	failedAt, askedAtFail := time.Now(), asked.Load()
	waitFor(t, "decisions flow after the live masters marked the dead one failed", 60*time.Second,
		func() bool { return asked.Load() >= askedAtFail+5*int64(len(keys)) })
	close(stop)
	wg.Wait()

	sort.Slice(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })
	counts := map[string]int{}
	var bad []string
	for _, o := range all {
		onDead := owner[o.key] == dead
		switch {
		case o.status != 200:
			bad = append(bad, fmt.Sprintf("%s answered %d", o.key, o.status))
		case !onDead && o.source != "shared":
			bad = append(bad, fmt.Sprintf("%s (live master %s) answered %s, asked %v after the kill",
				o.key, owner[o.key], o.source, o.at.Sub(deadAt).Round(time.Microsecond)))
		case onDead && o.at.After(deadAt) && o.source != "degraded":
			bad = append(bad, fmt.Sprintf("%s (dead master) answered %s, asked %v after the kill",
				o.key, o.source, o.at.Sub(deadAt).Round(time.Microsecond)))
		}
		phase := "before"
		switch {
		case o.at.After(failedAt):
			phase = "after-marked-failed"
		case o.at.After(deadAt):
			phase = "after-kill"
		case o.end.After(deadAt):
			phase = "in-flight-at-kill"
		}
		if onDead {
			phase += "/dead"
		} else {
			phase += "/live"
		}
		counts[phase]++
	}
	t.Logf("%d decisions (%d workers), by phase and master: %v; the live masters marked the dead one failed %v after the kill",
		len(all), workers, counts, failedAt.Sub(deadAt).Round(time.Millisecond))
	if len(bad) > 0 {
		t.Fatalf("%d wrong answers, the first: %s", len(bad), strings.Join(bad[:min(len(bad), 10)], "; "))
	}
	for _, phase := range []string{"after-kill/live", "after-kill/dead", "after-marked-failed/live", "after-marked-failed/dead"} {
		if counts[phase] == 0 {
			t.Fatalf("no decisions %s: the test needs some (%v)", phase, counts)
		}
	}
}
