package redisstore_test

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/authoritytest"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/proccpu"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func newPipelined(t testing.TB, rdb redisstore.PipelineClient, prefix string) *redisstore.Pipelined {
	t.Helper()
	p := redisstore.NewPipelined(rdb, prefix, redisstore.PipelineConfig{})
	running(t, p)
	return p
}

// running runs p's connections until the test ends, or until stop, which
// waits for Run to return.
func running(t testing.TB, p *redisstore.Pipelined) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func TestPipelinedContract(t *testing.T) {
	r := testenv.StartRedis(t)
	authoritytest.Run(t, newPipelined(t, newClient(t, r.Addr()), "pcontract"))
}

// TestPipelinedConcurrentExact: many goroutines on one key through one
// pipelined store admit exactly the burst (no refill to speak of).
func TestPipelinedConcurrentExact(t *testing.T) {
	r := testenv.StartRedis(t)
	p := newPipelined(t, newClient(t, r.Addr()), "pexact")
	lim := enforcement.Limit{Rate: 0.001, Burst: 500}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				v, err := p.Take(context.Background(), "one", "s", lim, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if v.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 500 {
		t.Fatalf("admitted %d of 1280 with burst 500", admitted.Load())
	}
}

// TestPipelinedNoScript: after SCRIPT FLUSH (a restarted server) the store
// reloads the script and answers.
func TestPipelinedNoScript(t *testing.T) {
	r := testenv.StartRedis(t)
	c := newClient(t, r.Addr())
	p := redisstore.NewPipelined(c, "pns", redisstore.PipelineConfig{})
	stop := running(t, p)
	ctx := context.Background()
	// One token a day: no whole token refills while the test runs, however
	// slow the machine, so the remaining count is exact.
	lim := enforcement.Limit{Rate: 1.0 / 86400, Burst: 10}
	if _, err := p.Take(ctx, "k", "s", lim, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	v, err := p.Take(ctx, "k", "s", lim, 1)
	if err != nil || !v.Allowed || v.Remaining != 8 {
		t.Fatalf("after SCRIPT FLUSH: %+v %v", v, err)
	}
	stop()
	if _, err := p.Take(ctx, "k", "s", lim, 1); err != redisstore.ErrClosed {
		t.Fatalf("after Run: %v, want ErrClosed", err)
	}
}

// TestPipelinedCluster: pipelines split across the slots of a real cluster.
func TestPipelinedCluster(t *testing.T) {
	cl := testenv.StartCluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer rdb.Close()
	p := newPipelined(t, rdb, "pcl")
	lim := enforcement.Limit{Rate: 0.001, Burst: 3}
	var wg sync.WaitGroup
	var bad atomic.Int64
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			allowed := 0
			for range 5 {
				v, err := p.Take(context.Background(), fmt.Sprintf("k%d", i), "s", lim, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if v.Allowed {
					allowed++
				}
			}
			if allowed != 3 {
				bad.Add(1)
			}
		}()
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d keys of 60 did not admit exactly their burst", bad.Load())
	}
}

// benchTake drives a with par×GOMAXPROCS goroutines over 10,000 keys whose
// limit is never reached (the allowed path), and reports decisions/s.
func benchTake(b *testing.B, a enforcement.Authority, par int) {
	lim := enforcement.Limit{Rate: 1e9, Burst: 1e9}
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "acct_" + strconv.Itoa(i)
	}
	var n atomic.Int64
	b.SetParallelism(par)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		i := int(n.Add(7919))
		for pb.Next() {
			i++
			if _, err := a.Take(context.Background(), keys[i%len(keys)], "api", lim, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
}

// BenchmarkSharedTier compares, against one redis-server, the plain store
// (one EVALSHA round trip per decision, go-redis pool), the auto-pipelined
// store, and redis-benchmark running the same script with -P 16.
//
//	go test -run XXX -bench SharedTier -benchtime 200000x ./enforcement/redisstore/
func BenchmarkSharedTier(b *testing.B) {
	r := testenv.StartRedis(b)
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), PoolSize: 256})
	defer c.Close()
	store := redisstore.New(c, "bench")
	if err := store.Preload(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Run("store", func(b *testing.B) {
		defer redisCPU(b, r)()
		benchTake(b, store, 64)
	})
	b.Run("pipelined", func(b *testing.B) {
		p := redisstore.NewPipelined(c, "bench", redisstore.PipelineConfig{})
		defer running(b, p)()
		defer redisCPU(b, r)()
		benchTake(b, p, 64)
	})
	b.Run("redis-benchmark-P16", func(b *testing.B) {
		rps := RedisBenchmarkScript(b, r.Port, max(b.N, 200000), 16)
		b.ReportMetric(rps, "decisions/s")
	})
}

// redisCPU measures redis-server's side of a benchmark: call it before the
// decisions, and what it returns after them. It reports redis-server's
// CPU time (user + system, /proc) per decision, and the part of it spent
// running scripts (INFO commandstats: EVALSHA's usec).
func redisCPU(b *testing.B, r *testenv.Redis) func() {
	b.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	if err := c.ConfigResetStat(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
	cpu0 := processCPU(b, r)
	return func() {
		defer c.Close()
		cpu := processCPU(b, r) - cpu0
		info, err := c.Info(context.Background(), "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		var scriptUS float64
		for _, line := range strings.Split(info, "\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
				for _, f := range strings.Split(rest, ",") {
					if v, ok := strings.CutPrefix(f, "usec="); ok {
						scriptUS, _ = strconv.ParseFloat(v, 64)
					}
				}
			}
		}
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "redis-cpu-µs/decision")
		b.ReportMetric(scriptUS/float64(b.N), "redis-script-µs/decision")
	}
}

// processCPU is redis-server's user + system CPU time so far.
func processCPU(b *testing.B, r *testenv.Redis) time.Duration {
	b.Helper()
	cpu, err := proccpu.Of(r.Process().Pid())
	if err != nil {
		b.Fatal(err)
	}
	return cpu
}

// RedisBenchmarkScript runs redis-benchmark with pipelining depth p against
// the bucket script on 10,000 random keys (the allowed path) and returns
// its requests per second.
func RedisBenchmarkScript(tb testing.TB, port, n, p int) float64 {
	tb.Helper()
	sha, err := exec.Command("redis-cli", "-p", strconv.Itoa(port), "script", "load", redisstore.BucketScriptSource()).Output()
	if err != nil {
		tb.Fatalf("script load: %v", err)
	}
	key := keyslot.BucketKey("rb", "__rand_int__", "api") // redis-benchmark substitutes __rand_int__
	out, err := exec.Command("redis-benchmark", "-p", strconv.Itoa(port), "-n", strconv.Itoa(n), "-c", "50",
		"-P", strconv.Itoa(p), "-r", "10000", "--csv",
		"EVALSHA", strings.TrimSpace(string(sha)), "2", key, key, "1000000000", "1000000000", "1", "0", "0", "0", "0").CombinedOutput()
	if err != nil {
		tb.Fatalf("redis-benchmark: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, ",")
		if len(f) >= 2 && strings.HasPrefix(f[0], `"EVALSHA`) {
			v, err := strconv.ParseFloat(strings.Trim(f[1], `"`), 64)
			if err == nil {
				return v
			}
		}
	}
	tb.Fatalf("redis-benchmark: no result in %s", out)
	return 0
}

// batchOf makes a Pipelined store whose one worker waits (up to a minute,
// never reached: the test sends that many at once) until n decisions are
// queued, so that they go out as one batch: one EVALSHA of batch.lua.
func batchOf(t *testing.T, c *redis.Client, prefix string, n int) *redisstore.Pipelined {
	t.Helper()
	p := redisstore.NewPipelined(c, prefix, redisstore.PipelineConfig{Workers: 1, MinBatch: n, MaxDelay: time.Minute})
	running(t, p)
	return p
}

func evalshaCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return n
		}
	}
	return 0
}

// TestPipelinedBatchIsOneCallInOrder: decisions batched into one script
// call are each atomic and run in queue order, as separate calls would: ten
// decisions on one key with burst 6 admit exactly 6, and the remaining
// counts of the admitted ones are 5, 4, …, 0 — while Redis saw one EVALSHA.
func TestPipelinedBatchIsOneCallInOrder(t *testing.T) {
	r := testenv.StartRedis(t)
	c := newClient(t, r.Addr())
	if err := redisstore.New(c, "pbatch").Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	const n = 10
	p := batchOf(t, c, "pbatch", n)
	lim := enforcement.Limit{Rate: 1.0 / 86400, Burst: 6} // one token a day: nothing refills meanwhile
	before := evalshaCalls(t, c)
	var mu sync.Mutex
	var remaining []int64
	var rejected int
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := p.Take(context.Background(), "one", "s", lim, 1)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if v.Allowed {
				remaining = append(remaining, v.Remaining)
			} else {
				rejected++
				if v.RetryAfter <= 0 {
					t.Errorf("rejected with retry after %v", v.RetryAfter)
				}
			}
		}()
	}
	wg.Wait()
	slices.Sort(remaining)
	if !slices.Equal(remaining, []int64{0, 1, 2, 3, 4, 5}) || rejected != 4 {
		t.Fatalf("admitted with remaining %v, rejected %d; want 0…5 and 4", remaining, rejected)
	}
	if got := evalshaCalls(t, c) - before; got != 1 {
		t.Fatalf("%d EVALSHA calls for one batch of %d", got, n)
	}
}

// TestPipelinedBatchIsolatesAFailedDecision: a key of the wrong type, or a
// string that is not a bucket, makes its own decision fail (the store's
// error, named), and the other decisions of the same script call stand.
func TestPipelinedBatchIsolatesAFailedDecision(t *testing.T) {
	r := testenv.StartRedis(t)
	c := newClient(t, r.Addr())
	ctx := context.Background()
	store := redisstore.New(c, "pbad")
	if err := c.HSet(ctx, store.BucketKey("bad", "s"), "t", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, store.BucketKey("short", "s"), "not a bucket", 0).Err(); err != nil {
		t.Fatal(err)
	}
	p := batchOf(t, c, "pbad", 4)
	lim := enforcement.Limit{Rate: 1.0 / 86400, Burst: 5}
	keys := []string{"good1", "bad", "good2", "short"}
	verdicts := make([]enforcement.Verdict, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			verdicts[i], errs[i] = p.Take(ctx, k, "s", lim, 1)
		}()
	}
	wg.Wait()
	for _, i := range []int{0, 2} {
		if errs[i] != nil || !verdicts[i].Allowed || verdicts[i].Remaining != 4 {
			t.Errorf("%s: %+v %v, want allowed with 4 left", keys[i], verdicts[i], errs[i])
		}
	}
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "WRONGTYPE") || !strings.Contains(errs[1].Error(), store.BucketKey("bad", "s")) {
		t.Errorf("bad key: %v, want the WRONGTYPE error naming its bucket", errs[1])
	}
	if errs[3] == nil || !strings.Contains(errs[3].Error(), "is not a bucket (12 bytes, not 16)") {
		t.Errorf("short key: %v, want the error saying its value is not a bucket", errs[3])
	}
}
