package redisstore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/proccpu"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// BenchmarkGuardedPipelined: shared-tier decisions as cmd/limiter makes
// them over one server (the guard's deadline and breaker around the
// auto-pipelined store), 10,000 keys, 16 goroutines per core, with the
// allocations and the process's CPU per decision (cpu-ns/op: user +
// system time of this process, Redis excluded, ÷ decisions; it does not
// depend on how many other processes share the cores, as wall time does).
func BenchmarkGuardedPipelined(b *testing.B) {
	r := testenv.StartRedis(b)
	p := pipelined(b, client(b, r.Addr()), "gbench", 100*time.Millisecond)
	benchGuarded(b, runningGuard(b, p, redisstore.GuardSettings{Timeout: 100 * time.Millisecond}, nil, nil))
}

// BenchmarkShared is BenchmarkGuardedPipelined through the store value
// the limiter wires (redisstore.Shared, built by cmd/limiter/internal/sharedtier): the
// same guard and pipeline, with the store's own bookkeeping (Failing) on
// every call.
func BenchmarkShared(b *testing.B) {
	r := testenv.StartRedis(b)
	s := redisstore.NewShared(client(b, r.Addr()), redisstore.SharedConfig{Prefix: "sbench",
		Pipeline: redisstore.PipelineConfig{Timeout: 100 * time.Millisecond},
		Guard:    redisstore.GuardSettings{Timeout: 100 * time.Millisecond}})
	if err := s.Preload(context.Background()); err != nil {
		b.Fatal(err)
	}
	runShared(b, s)
	benchGuarded(b, s)
}

func benchGuarded(b *testing.B, g enforcement.Authority) {
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "acct_" + strconv.Itoa(i)
	}
	var n atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	cpu0 := proccpu.Self()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx, cancel := context.WithCancel(context.Background()) // as net/http's request context
		defer cancel()
		for pb.Next() {
			if _, err := g.Take(ctx, keys[n.Add(1)%int64(len(keys))], "api", roomy, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(proccpu.Self()-cpu0)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}
