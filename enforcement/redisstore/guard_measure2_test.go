package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

type probeRec struct {
	at  time.Time
	cum time.Duration
}

// TestMeasureDeadlineRules records the true latency of store calls (no
// deadline) from a fresh pipelined store, 64 callers at about 1,000 calls/s,
// ten rounds of 2 s, with a scheduler-lag probe (1 ms sleeps) beside them,
// and counts how many calls each candidate deadline rule would have failed.
// GUARD_MEASURE=1 runs it; GUARD_STRESS=1 adds stress-ng --cpu 2. The
// figures are in BENCHMARKS.md, "Store deadline on a starved machine".
func TestMeasureDeadlineRules(t *testing.T) {
	if os.Getenv("GUARD_MEASURE") == "" {
		t.Skip("GUARD_MEASURE=1 runs the measurement")
	}
	r := testenv.StartRedis(t)
	if os.Getenv("GUARD_STRESS") != "" {
		cmd := exec.Command("stress-ng", "--cpu", "2", "--timeout", "600s", "--quiet")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		time.Sleep(time.Second)
	}
	tick := time.Millisecond
	var pmu sync.Mutex
	probes := []probeRec{{time.Now(), 0}}
	stop := make(chan struct{})
	pdone := make(chan struct{})
	go func() {
		defer close(pdone)
		var cum time.Duration
		for {
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			time.Sleep(tick)
			t1 := time.Now()
			if over := t1.Sub(t0) - tick; over > 0 {
				cum += over
			}
			pmu.Lock()
			probes = append(probes, probeRec{t1, cum})
			pmu.Unlock()
		}
	}()
	type callRec struct {
		start time.Time
		took  time.Duration
	}
	var mu sync.Mutex
	var calls []callRec
	lim := enforcement.Limit{Rate: 1e6, Burst: 1e6}
	for round := range 10 {
		rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
			ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 64, MinIdleConns: 8})
		p := redisstore.NewPipelined(rdb, fmt.Sprintf("l%d", round), redisstore.PipelineConfig{Timeout: time.Second})
		stop := running(t, p)
		_ = p.Store().Preload(context.Background())
		var wg sync.WaitGroup
		stopAt := time.Now().Add(2 * time.Second)
		for w := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; time.Now().Before(stopAt); i++ {
					s := time.Now()
					_, err := p.Take(context.Background(), fmt.Sprintf("k%d-%d", w, i%50), "api", lim, 1)
					took := time.Since(s)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					calls = append(calls, callRec{s, took})
					mu.Unlock()
					time.Sleep(64 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		stop()
		_ = rdb.Close()
	}
	close(stop)
	<-pdone
	cumAt := func(at time.Time) time.Duration {
		i := sort.Search(len(probes), func(i int) bool { return probes[i].at.After(at) })
		if i >= len(probes) {
			return probes[len(probes)-1].cum
		}
		// the sleep in progress at 'at': its overshoot so far
		prev := probes[i-1]
		c := prev.cum
		if over := at.Sub(prev.at) - tick; over > 0 {
			c += over
		}
		return c
	}
	T := 5 * time.Millisecond
	ends := make([]time.Time, len(calls))
	for i, c := range calls {
		ends[i] = c.start.Add(c.took)
	}
	sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
	lastBefore := func(at time.Time) time.Time {
		i := sort.Search(len(ends), func(i int) bool { return !ends[i].Before(at) })
		if i == 0 {
			return time.Time{}
		}
		return ends[i-1]
	}
	// p99 of the calls that completed in the second before at.
	type done struct {
		end  time.Time
		took time.Duration
	}
	dones := make([]done, 0, len(calls))
	for _, c := range calls {
		dones = append(dones, done{c.start.Add(c.took), c.took})
	}
	sort.Slice(dones, func(i, j int) bool { return dones[i].end.Before(dones[j].end) })
	p99Before := func(at time.Time) (time.Duration, int) {
		hi := sort.Search(len(dones), func(i int) bool { return !dones[i].end.Before(at) })
		lo := sort.Search(len(dones), func(i int) bool { return !dones[i].end.Before(at.Add(-time.Second)) })
		w := make([]time.Duration, 0, hi-lo)
		for _, d := range dones[lo:hi] {
			w = append(w, d.took)
		}
		if len(w) == 0 {
			return 0, 0
		}
		sort.Slice(w, func(i, j int) bool { return w[i] < w[j] })
		return w[len(w)*99/100], len(w)
	}
	ks := []int{2, 3, 5}
	var wall, netOfLag, silentNet, silentWall int
	adaptive := make([]int, len(ks))
	var lats []time.Duration
	for _, c := range calls {
		e := c.start.Add(c.took)
		lats = append(lats, c.took)
		if c.took > T {
			wall++
		}
		if c.took-(cumAt(e)-cumAt(c.start)) > T {
			netOfLag++
		}
		f3, f4 := false, false
		for now := c.start.Add(T); now.Before(e); now = now.Add(T / 5) {
			from := lastBefore(now)
			if from.Before(c.start) {
				from = c.start
			}
			f4 = f4 || now.Sub(from) >= T
			f3 = f3 || now.Sub(from)-(cumAt(now)-cumAt(from)) >= T
		}
		if f3 {
			silentNet++
		}
		if f4 {
			silentWall++
		}
		p, n := p99Before(c.start)
		for i, k := range ks {
			d := T // no history yet (fewer than 50 calls in the second before): the floor
			if n >= 50 {
				d = min(time.Second, max(T, time.Duration(k)*p))
			}
			if c.took > d {
				adaptive[i]++
			}
		}
	}
	pct := func(n int) string { return fmt.Sprintf("%d (%.2f%%)", n, 100*float64(n)/float64(len(calls))) }
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	q := func(l []time.Duration, f float64) time.Duration { return l[int(float64(len(l)-1)*f)] }
	t.Logf("%d calls, no deadline: latency p50 %v p90 %v p99 %v p999 %v max %v", len(lats), q(lats, .5), q(lats, .9), q(lats, .99), q(lats, .999), lats[len(lats)-1])
	t.Logf("calls each rule would have failed, T = %v:", T)
	t.Logf("  wall-clock deadline T:                         %s", pct(wall))
	t.Logf("  T of wall time minus the probe's lag:          %s", pct(netOfLag))
	t.Logf("  the store silent for T (no reply to any call): %s", pct(silentWall))
	t.Logf("  the store silent for T, net of the probe's lag: %s", pct(silentNet))
	for i, k := range ks {
		t.Logf("  adaptive max(T, %d × p99 of the last second):   %s", k, pct(adaptive[i]))
	}
	// Grid: slack per tick × starvation threshold, window from T before the call.
	raw := make([]time.Duration, len(probes))
	for i := 1; i < len(probes); i++ {
		raw[i] = probes[i].cum - probes[i-1].cum // overshoot of tick i (raw, ≥ 0)
	}
	for _, slack := range []time.Duration{0, 100 * time.Microsecond, 250 * time.Microsecond} {
		cum := make([]time.Duration, len(probes))
		for i := 1; i < len(probes); i++ {
			cum[i] = cum[i-1] + max(0, raw[i]-slack)
		}
		at := func(x time.Time) time.Duration {
			i := sort.Search(len(probes), func(i int) bool { return probes[i].at.After(x) })
			if i >= len(probes) {
				return cum[len(cum)-1]
			}
			return cum[i-1] + max(0, x.Sub(probes[i-1].at)-tick-slack)
		}
		var fails [4]int
		ths := []time.Duration{100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond, time.Millisecond}
		for _, c := range calls {
			if c.took <= T {
				continue
			}
			// judged at start+T: lag in [start-T, start+T]
			lag := at(c.start.Add(T)) - at(c.start.Add(-T))
			for i, th := range ths {
				if lag < th {
					fails[i]++
				}
			}
		}
		t.Logf("slack %v: late calls judged not starved at start+T, by threshold %v: %v", slack, ths, fails)
	}
	// Idle-probe baseline: lag sums over 10-tick windows.
	var ov []time.Duration
	for i := 1; i < len(probes); i++ {
		ov = append(ov, probes[i].cum-probes[i-1].cum)
	}
	sort.Slice(ov, func(i, j int) bool { return ov[i] < ov[j] })
	t.Logf("probe overshoot per %v tick: n %d p50 %v p90 %v p99 %v max %v", tick, len(ov), q(ov, .5), q(ov, .9), q(ov, .99), ov[len(ov)-1])
}
