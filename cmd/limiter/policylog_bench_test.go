package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// BenchmarkPushToFleet measures push → applied on every instance of a
// fleet of limiter binaries (built with -race, as every process test
// here): from the moment the write returns (read back as applied) until
// the last limiter's /readyz reports the revision, polled every 2 ms. It
// reports p50, p99 and max over the pushes of each iteration, and logs
// them beside the goal (p99 ≤ 1 s).
//
// Knobs (environment): BENCH_FLEET limiters (default 3), BENCH_PUSHES per
// iteration (default 100), BENCH_CHECKS_PER_SEC of /check load spread over
// the fleet meanwhile (default 0), BENCH_NO_TOPIC=1 to start the fleet
// before the policy topic exists (the first push is then timed apart).
func BenchmarkPushToFleet(b *testing.B) {
	fleetN, pushes := benchEnvInt("BENCH_FLEET", 3), benchEnvInt("BENCH_PUSHES", 100)
	rate, noTopic := benchEnvInt("BENCH_CHECKS_PER_SEC", 0), os.Getenv("BENCH_NO_TOPIC") == "1"
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
	w := policylog.NewClient(l, true)
	first := func() {
		if err := l.Ensure(ctx); err != nil {
			b.Fatal(err)
		}
		if _, err := w.Push(ctx, logDocA, "bench", "first", policylog.NoExpect); err != nil {
			b.Fatal(err)
		}
	}
	if !noTopic {
		first()
	}
	var fleet []*limiterProc
	for i := range fleetN {
		fleet = append(fleet, startLimiter(b, logBootstrap, "KAFKA_BROKERS="+k.Addr(), "POLICY_SOURCE=kafka",
			fmt.Sprintf("LIMITER_INSTANCE_ID=b%d", i), "LIMITER_GRPC_ADDR="))
	}
	reached := func(rev int64) time.Duration {
		done := time.Now()
		for _, p := range fleet {
			for deadline := time.Now().Add(testenv.Timeout(30 * time.Second)); ; {
				if pol := p.policyOf(b); pol["revision"] == float64(rev) {
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("%s never reached revision %d", p.url, rev)
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
		return time.Since(done)
	}
	stop := benchLoad(fleet, rate)
	defer func() {
		if rate > 0 {
			b.Logf("checks answered 200 meanwhile: %.0f/s (asked %d/s)", stop(), rate)
		}
	}()
	if noTopic {
		first()
		b.Logf("the first push onto a fleet started without the topic: applied everywhere %v after it returned", reached(1))
	}
	b.ResetTimer()
	for range b.N {
		var lat []time.Duration
		for i := range pushes {
			o, err := w.Push(ctx, logDocA+fmt.Sprintf("# push %d\n", i), "bench", "push", policylog.NoExpect)
			if err != nil {
				b.Fatal(err)
			}
			lat = append(lat, reached(o.Head))
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		p50, p99, pmax := lat[len(lat)/2], lat[(len(lat)*99+99)/100-1], lat[len(lat)-1]
		b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(pmax.Microseconds())/1000, "max-ms")
		verdict := "met"
		if p99 > time.Second {
			verdict = "NOT met"
		}
		b.Logf("push → fleet of %d under %d checks/s, %d pushes: p50 %v, p99 %v, max %v (goal p99 ≤ 1s: %s)",
			fleetN, rate, pushes, p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond), pmax.Round(100*time.Microsecond), verdict)
	}
}

func benchEnvInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n >= 0 {
		return n
	}
	return def
}

// benchLoad sends /check to the fleet at rate requests per second in all
// (round robin, many keys) until stop is called; stop returns once every
// sender has, with the rate of answered checks achieved.
func benchLoad(fleet []*limiterProc, rate int) (stop func() float64) {
	if rate <= 0 {
		return func() float64 { return 0 }
	}
	began := time.Now()
	var answered atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	const senders = 16
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Duration(float64(time.Second) * senders / float64(rate)))
			defer tick.Stop()
			for i := s; ; i += senders {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				p := fleet[i%len(fleet)]
				resp, err := client.Post(p.url+"/check", "application/json",
					strings.NewReader(fmt.Sprintf(`{"key":"acct_%d","scope":"api:read","cost":1}`, i%1000)))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 200 {
						answered.Add(1)
					}
				}
			}
		}()
	}
	return func() float64 {
		cancel()
		wg.Wait()
		return float64(answered.Load()) / time.Since(began).Seconds()
	}
}
