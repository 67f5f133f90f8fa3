package global_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// BenchmarkDecision compares one decision on a global limit (decide.lua on
// the region's pool) with one on a regional limit (redisstore's bucket
// script), on the same redis-server, one call at a time: the pool must
// cost what a bucket costs.
func BenchmarkDecision(b *testing.B) {
	home := testenv.StartRedis(b)
	regions := startRegions(b, home, "a")
	rdb := client(b, regions[0].redis.Addr())
	lim := enforcement.Limit{Rate: 1e6, Burst: 1e6}
	ctx := context.Background()
	s := redisstore.New(rdb, "t")
	// Alternate the two, call by call, so that a machine whose load
	// drifts slows both alike; the ratio is the figure.
	var regional, glob time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := s.Take(ctx, "k", "api", lim, 1); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := regions[0].g.Take(ctx, "k", "api", lim, 1); err != nil {
			b.Fatal(err)
		}
		regional, glob = regional+t1.Sub(t0), glob+time.Since(t1)
	}
	b.ReportMetric(float64(regional.Nanoseconds())/float64(b.N), "regional-ns/op")
	b.ReportMetric(float64(glob.Nanoseconds())/float64(b.N), "global-ns/op")
	b.ReportMetric(glob.Seconds()/regional.Seconds(), "global/regional")
}
