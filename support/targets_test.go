package support_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/support"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// targetPolicy resolves every key to one limit with a daily quota.
type targetPolicy struct{}

func (targetPolicy) Resolve(_, _, _ string) (enforcement.Resolved, error) {
	return enforcement.Resolved{Limit: enforcement.Limit{Rate: 1000, Burst: 2000, QuotaLimit: 1 << 40,
		QuotaPeriod: limits.PeriodDay, QuotaID: "day"}, Policy: "bench", Tier: "bench", Cost: 1}, nil
}

func p99(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[(len(d)*99+99)/100-1]
}

// BenchmarkSupportTargets prints the support tools' figures beside their
// goals (docs/support.md, BENCHMARKS.md "Support tools"): inspect's p99
// with 1,000,000 keys in the store and 5 limiters; the p99 from a reset
// to every limiter having dropped its local view; and /check's
// throughput while inspect runs every 100 ms, over the same run without.
// One iteration is the whole measurement:
//
//	go test -run '^$' -bench SupportTargets -benchtime 1x ./support/
func BenchmarkSupportTargets(b *testing.B) {
	r := testenv.StartRedis(b)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: r.Addr(), ReadTimeout: 30 * time.Second, MaxRetries: -1})
	defer admin.Close()
	// A million keys of the limiter's layout (written in one script: the
	// server's DEBUG POPULATE is disabled).
	fill := "for i = ARGV[1], ARGV[1] + 99999 do redis.call('SET', 'rl:{pop' .. i .. '}:b2:api', '0123456789abcdef') end return 1"
	for from := 0; from < 1_000_000; from += 100_000 {
		if err := admin.Eval(ctx, fill, nil, from).Err(); err != nil {
			b.Fatal(err)
		}
	}
	if n, err := admin.DBSize(ctx).Result(); err != nil || n < 1_000_000 {
		b.Fatalf("dbsize %d, %v", n, err)
	}
	const limiters = 5
	var urls []string
	var lims []*enforcement.Limiter
	forgot := make([]chan struct{}, limiters)
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for i := range limiters {
		rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), PoolSize: 16})
		defer rdb.Close()
		lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, "rl"), Policy: targetPolicy{}})
		if err != nil {
			b.Fatal(err)
		}
		lims = append(lims, lim)
		srv := httptest.NewServer(support.LocalHandler(support.Local{Limiter: lim, Instance: fmt.Sprint("limiter-", i)}))
		defer srv.Close()
		urls = append(urls, srv.URL)
		forgot[i] = make(chan struct{}, 1024)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_ = support.Listen(lctx, rdb, "rl", func(key, scope string) { lim.Forget(key, scope); forgot[i] <- struct{}{} })
		}(i)
	}
	store := redisstore.New(admin, "rl")
	in := &support.Inspector{Limiters: urls, Store: store, Timeout: time.Second}
	for _, l := range lims {
		if _, err := l.Check(ctx, enforcement.Request{Key: "acct", Scope: "api", Cost: 1, HasCost: true}); err != nil {
			b.Fatal(err)
		}
	}
	// Subscriptions in place: a reset announced now reaches all five.
	for {
		n, err := admin.PubSubNumSub(ctx, "rl:resets").Result()
		if err != nil {
			b.Fatal(err)
		}
		if n["rl:resets"] == limiters {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.ResetTimer()
	for range b.N {
		var inspects []time.Duration
		for range 200 {
			t0 := time.Now()
			rep := in.Inspect(ctx, "acct", "api")
			inspects = append(inspects, time.Since(t0))
			if rep.Bucket.Error != "" {
				b.Fatal(rep.Bucket.Error)
			}
		}
		var resets []time.Duration
		lim, _ := targetPolicy{}.Resolve("", "", "")
		for i := range 100 {
			t0 := time.Now()
			if _, err := store.Reset(ctx, "acct", "api", lim.Limit, redisstore.ResetRefill, 0, fmt.Sprint("bench-", b.N, "-", i, "-", t0.UnixNano()), []byte(`{}`)); err != nil {
				b.Fatal(err)
			}
			for _, ch := range forgot {
				<-ch
			}
			resets = append(resets, time.Since(t0))
		}
		// /check throughput: 4 goroutines over 4 limiters, in 1 s windows
		// alternating without inspect and with one every 100 ms (so that
		// the machine's other load falls on both alike).
		rate := func(inspecting bool) float64 {
			var n atomic.Int64
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			var cw sync.WaitGroup
			for g := range 4 {
				cw.Add(1)
				go func(g int) {
					defer cw.Done()
					for i := 0; cctx.Err() == nil; i++ {
						_, _ = lims[g].Check(cctx, enforcement.Request{Key: fmt.Sprint("k", g, "-", i%1000), Scope: "api", Cost: 1, HasCost: true})
						n.Add(1)
					}
				}(g)
			}
			if inspecting {
				t := time.NewTicker(100 * time.Millisecond)
				for cctx.Err() == nil {
					select {
					case <-t.C:
						in.Inspect(cctx, "acct", "api")
					case <-cctx.Done():
					}
				}
				t.Stop()
			}
			cw.Wait()
			return float64(n.Load())
		}
		var without, with float64
		const pairs = 10
		for range pairs {
			without += rate(false) / pairs
			with += rate(true) / pairs
		}
		b.Logf("inspect p99, 1,000,000 keys, %d limiters: %v (goal ≤ 250ms)", limiters, p99(inspects))
		b.Logf("reset → every limiter dropped its view, p99: %v (goal ≤ 1s)", p99(resets))
		b.Logf("/check with inspect every 100 ms ÷ without: %.0f/s ÷ %.0f/s = %.3f (goal ≥ 0.98)", with, without, with/without)
		b.ReportMetric(float64(p99(inspects).Microseconds()), "inspect-p99-µs")
		b.ReportMetric(float64(p99(resets).Microseconds()), "reset-p99-µs")
		b.ReportMetric(with/without, "check-ratio")
	}
}
