package redisstore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// BenchmarkStoreTake: shared-tier decisions from one process against one
// local redis-server, one EVALSHA round trip each, over 10,000 keys, with
// b.SetParallelism(16) goroutines per core to keep Redis busy.
func BenchmarkStoreTake(b *testing.B) {
	r := testenv.StartRedis(b)
	s := redisstore.New(newClient(b, r.Addr()), "bench")
	ctx := context.Background()
	lim := enforcement.Limit{Rate: 1e6, Burst: 1e6}
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "acct_" + strconv.Itoa(i)
	}
	var n atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Take(ctx, keys[n.Add(1)%int64(len(keys))], "api", lim, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}
