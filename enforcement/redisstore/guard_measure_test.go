package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

type countObs struct {
	calls, errs atomic.Int64
	mu          sync.Mutex
	lat         []time.Duration
}

func (o *countObs) StoreCall(took time.Duration, err error) {
	o.calls.Add(1)
	if err != nil {
		if o.errs.Add(1) <= 3 {
			fmt.Printf("store error after %v: %v\n", took, err)
		}
	}
	o.mu.Lock()
	o.lat = append(o.lat, took)
	o.mu.Unlock()
}
func (o *countObs) BreakerState(redisstore.State) {}

// TestMeasureDegradedDecisions is the harness behind BENCHMARKS.md, "Store
// deadline on a starved machine": ten fresh limiters in turn (Limiter →
// guard with the default 5 ms → pipelined EVALSHA, as cmd/limiter builds
// them) against one healthy redis-server, each hit by 64 callers at once
// and then about 1,000 decisions/s for 2 s; it counts degraded decisions
// and store failures. GUARD_MEASURE=1 runs it; GUARD_STRESS=1 adds
// stress-ng --cpu 2. It uses only the API the guard had before the
// redesign, so the same file measures both.
func TestMeasureDegradedDecisions(t *testing.T) {
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
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: std\ntiers:\n  std: { rate: 1000000, burst: 1000000 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	timeout := 5 * time.Millisecond
	rounds := 10
	for round := range rounds {
		rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
			ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 64, MinIdleConns: 8})
		p := redisstore.NewPipelined(rdb, fmt.Sprintf("m%d", round), redisstore.PipelineConfig{Timeout: timeout})
		stop := running(t, p)
		_ = p.Store().Preload(context.Background())
		obs := &countObs{}
		g := runningGuard(t, p, redisstore.GuardSettings{Timeout: timeout}, obs, nil)
		lim, err := enforcement.New(enforcement.Config{Authority: g, Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		var degraded, total atomic.Int64
		// A fresh limiter: 64 requests at once, then 2 s at about 1,000/s from 64 goroutines.
		var wg sync.WaitGroup
		stopAt := time.Now().Add(2 * time.Second)
		for w := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; time.Now().Before(stopAt); i++ {
					d, err := lim.Check(context.Background(), enforcement.Request{Key: fmt.Sprintf("k%d-%d", w, i%50), Scope: "api"})
					if err != nil {
						t.Error(err)
						return
					}
					total.Add(1)
					if d.Source == enforcement.SourceDegraded {
						degraded.Add(1)
					}
					time.Sleep(64 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		sort.Slice(obs.lat, func(i, j int) bool { return obs.lat[i] < obs.lat[j] })
		l := obs.lat
		t.Logf("round %d: decisions %d degraded %d store calls %d errors %d breaker %v; store call p50 %v p99 %v max %v",
			round, total.Load(), degraded.Load(), obs.calls.Load(), obs.errs.Load(), g.State(),
			l[len(l)/2], l[len(l)*99/100], l[len(l)-1])
		stop()
		_ = rdb.Close()
	}
}
