package main

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/internal/testenv"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
)

// BenchmarkPushToFleet measures push → applied on every instance of a
// fleet of three limiter binaries (built with -race, as every process test
// here): from the moment the write returns (read back as applied) until
// the last limiter's /readyz reports the revision, polled every 2 ms. It
// reports p50, p99 and max over 100 pushes per iteration.
func BenchmarkPushToFleet(b *testing.B) {
	k, err := testenv.NewKafka("ratelimit.decisions", 1)
	if err != nil {
		b.Fatal(err)
	}
	defer k.Close()
	l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}, Wait: 100 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	if err := l.Ensure(ctx); err != nil {
		b.Fatal(err)
	}
	w := policylog.NewClient(l, true)
	if _, err := w.Push(ctx, logDocA, "bench", "first", policylog.NoExpect); err != nil {
		b.Fatal(err)
	}
	var fleet []*limiterProc
	for i := range 3 {
		fleet = append(fleet, startLimiter(b, logBootstrap, "KAFKA_BROKERS="+k.Addr(), "POLICY_SOURCE=kafka",
			fmt.Sprintf("LIMITER_INSTANCE_ID=b%d", i), "LIMITER_GRPC_ADDR="))
	}
	b.ResetTimer()
	const pushes = 100
	for range b.N {
		var lat []time.Duration
		for i := range pushes {
			o, err := w.Push(ctx, logDocA+fmt.Sprintf("# push %d\n", i), "bench", "push", policylog.NoExpect)
			if err != nil {
				b.Fatal(err)
			}
			done := time.Now()
			for _, p := range fleet {
				for deadline := time.Now().Add(testenv.Timeout(30 * time.Second)); ; {
					if pol := p.policyOf(b); pol["revision"] == float64(o.Head) {
						break
					}
					if time.Now().After(deadline) {
						b.Fatalf("%s never reached revision %d", p.url, o.Head)
					}
					time.Sleep(2 * time.Millisecond)
				}
			}
			lat = append(lat, time.Since(done))
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[(len(lat)*99+99)/100-1].Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	}
}
