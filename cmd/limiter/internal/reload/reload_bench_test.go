package reload

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement"
)

// BenchmarkDecisionDuringReloads measures the latency of decisions through
// the real limiter on a real redis-server, steady and while the policy is
// reloaded 100 times a second (file written, read, validated, swapped):
// a reload must not slow a decision. "parse-only" does the same work
// without the swap, to tell the CPU a reload takes on a small machine from
// any effect of the swap itself. Reported: p50, p99, p99.9 and max in µs,
// and the reloads done.
func BenchmarkDecisionDuringReloads(b *testing.B) {
	for _, mode := range []string{"steady", "parse-only-100-per-s", "reloading-100-per-s"} {
		reloading := mode != "steady"
		b.Run(mode, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "policy.yaml")
			writeAtomic(b, path, generation(0))
			p0 := mustLoad(b, path)
			lim := redisLimiter(b, p0)
			r := NewPolicy(path, lim, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
			r.Set(p0)

			stop := make(chan struct{})
			var wg sync.WaitGroup
			reloads := 0
			if reloading {
				wg.Add(1)
				go func() {
					defer wg.Done()
					t := time.NewTicker(10 * time.Millisecond)
					defer t.Stop()
					for gen := 1; ; gen++ {
						select {
						case <-stop:
							return
						case <-t.C:
						}
						writeAtomic(b, path, generation(gen))
						if mode == "parse-only-100-per-s" {
							mustLoad(b, path)
						} else {
							r.reload("bench")
						}
						reloads++
					}
				}()
			}
			ctx := context.Background()
			took := make([]time.Duration, 0, b.N)
			i := 0
			for b.Loop() {
				i++
				req := enforcement.Request{Key: "k" + strconv.Itoa(i%1000), Scope: "api:x"}
				start := time.Now()
				if _, err := lim.Check(ctx, req); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
			}
			close(stop)
			wg.Wait()
			slices.Sort(took)
			q := func(p float64) float64 {
				return float64(took[min(len(took)-1, int(p*float64(len(took))))].Nanoseconds()) / 1e3
			}
			b.ReportMetric(q(0.5), "p50-µs")
			b.ReportMetric(q(0.99), "p99-µs")
			b.ReportMetric(q(0.999), "p99.9-µs")
			b.ReportMetric(float64(took[len(took)-1].Nanoseconds())/1e3, "max-µs")
			b.ReportMetric(float64(reloads), "reloads")
		})
	}
}
