// Command storefloor is the yardstick of the limiter's own decision latency
// (issue 15), as bench/barejson is the HTTP floor's: it asks Redis at a
// fixed rate (open model) from one Go process, with nothing of the limiter
// around the call, and prints the latency quantiles of
//
//   - ping:   a PING through go-redis, the bare round trip to redis-server
//     on this machine;
//   - decide: one decision through redisstore.Store (one EVALSHA of the
//     bucket script in the calling goroutine: no HTTP, guard, pipeline or
//     local tier) over -keys distinct keys.
//
// Each call is timed from its start to its reply, the span the limiter's
// limiter_decision_duration_seconds histogram covers, so the two read side
// by side: what is left between them is the limiter's own work and its
// goroutine hand-offs. A call starts when it is due, or as soon as one of
// -conns callers is free.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
)

func main() {
	addr := flag.String("redis", "127.0.0.1:6379", "redis-server address")
	op := flag.String("op", "decide", "what each call does: ping or decide")
	rate := flag.Int("rate", 5000, "calls per second")
	duration := flag.Duration("duration", 20*time.Second, "how long to call")
	conns := flag.Int("conns", 32, "concurrent callers (and Redis connections)")
	keys := flag.Int("keys", 10000, "distinct keys of the decide calls")
	flag.Parse()
	if *rate <= 0 || *conns <= 0 || *keys <= 0 || *duration <= 0 {
		log.Fatal("storefloor: -rate, -conns, -keys and -duration must be positive")
	}

	rdb := redis.NewClient(&redis.Options{Addr: *addr, PoolSize: *conns, MinIdleConns: *conns,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer rdb.Close()
	store := redisstore.New(rdb, "storefloor")
	// The limit is never reached: every decision is the allowed path.
	lim := enforcement.Limit{Rate: 1e6, Burst: 1e6}
	names := make([]string, *keys)
	for i := range names {
		names[i] = "acct_" + strconv.Itoa(i)
	}
	var call func(ctx context.Context, i int) error
	switch *op {
	case "ping":
		call = func(ctx context.Context, _ int) error { return rdb.Ping(ctx).Err() }
	case "decide":
		call = func(ctx context.Context, i int) error {
			_, err := store.Take(ctx, names[i%len(names)], "api", lim, 1)
			return err
		}
	default:
		log.Fatalf("storefloor: -op %q: want ping or decide", *op)
	}
	ctx := context.Background()
	if err := store.Preload(ctx); err != nil {
		log.Fatalf("storefloor: loading the bucket script: %v", err)
	}
	for i := range 2 * *conns { // warm the connections before timing
		if err := call(ctx, i); err != nil {
			log.Fatalf("storefloor: warm-up call: %v", err)
		}
	}

	n := int(int64(*rate) * int64(*duration) / int64(time.Second))
	due := make(chan int, *conns)
	hists := make([]*hdrhistogram.Histogram, *conns)
	errs := make([]int, *conns)
	var wg sync.WaitGroup
	for w := range *conns {
		hists[w] = hdrhistogram.New(1, int64(time.Minute/time.Microsecond), 3)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range due {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				start := time.Now()
				err := call(cctx, i)
				took := time.Since(start)
				cancel()
				if err != nil {
					errs[w]++
					continue
				}
				_ = hists[w].RecordValue(max(took.Microseconds(), 1))
			}
		}()
	}
	interval := time.Second / time.Duration(*rate)
	begin := time.Now()
	for i := range n {
		if d := time.Until(begin.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		due <- i
	}
	close(due)
	wg.Wait()

	all := hdrhistogram.New(1, int64(time.Minute/time.Microsecond), 3)
	failed := 0
	for w := range hists {
		all.Merge(hists[w])
		failed += errs[w]
	}
	fmt.Printf("storefloor op=%s rate=%d calls=%d errors=%d p50=%d p99=%d p999=%d max=%d\n", *op, *rate, n, failed,
		all.ValueAtQuantile(50), all.ValueAtQuantile(99), all.ValueAtQuantile(99.9), all.Max())
	if failed > 0 {
		os.Exit(1)
	}
}
