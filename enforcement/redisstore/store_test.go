package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/authoritytest"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestStoreContract(t *testing.T) {
	r := testenv.StartRedis(t)
	authoritytest.Run(t, redisstore.New(newClient(t, r.Addr()), "contract"))
}

// spendConcurrently has instances × goroutines callers spend one token each,
// released at the same moment, and returns how many were admitted and how
// long the run took.
func spendConcurrently(t *testing.T, instances, goroutines, each int, spend func(instance int) bool) (admitted int64, took time.Duration) {
	var wg sync.WaitGroup
	var n atomic.Int64
	start := make(chan struct{})
	for i := 0; i < instances; i++ {
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				for j := 0; j < each; j++ {
					if spend(i) {
						n.Add(1)
					}
				}
			}(i)
		}
	}
	began := time.Now()
	close(start)
	wg.Wait()
	return n.Load(), time.Since(began)
}

// TestCheckThenActRace: several limiter instances (separate clients, each
// with its own connection pool) and many goroutines spend one key at the
// same moment. The atomic script never admits more than the capacity plus
// what refilled during the run; a read-then-write client does, which is
// what makes this test able to fail.
func TestCheckThenActRace(t *testing.T) {
	r := testenv.StartRedis(t)
	const instances, goroutines, each = 6, 16, 10
	lim := enforcement.Limit{Rate: 5, Burst: 40}
	withinLimit := func(admitted int64, took time.Duration) bool {
		return float64(admitted) <= float64(lim.Burst)+lim.Rate*took.Seconds()+1
	}

	stores := make([]*redisstore.Store, instances)
	for i := range stores {
		stores[i] = redisstore.New(newClient(t, r.Addr()), "race")
	}
	admitted, took := spendConcurrently(t, instances, goroutines, each, func(i int) bool {
		v, err := stores[i].Take(context.Background(), "hot", "s", lim, 1)
		if err != nil {
			t.Error(err)
			return false
		}
		return v.Allowed
	})
	t.Logf("atomic script: %d of %d admitted in %v (capacity %d + refill %.1f)",
		admitted, instances*goroutines*each, took, lim.Burst, lim.Rate*took.Seconds())
	if !withinLimit(admitted, took) {
		t.Fatalf("atomic script admitted %d in %v: more than capacity + refill", admitted, took)
	}

	// The same load through a read, decide in the client, write sequence.
	clients := make([]*redis.Client, instances)
	for i := range clients {
		clients[i] = newClient(t, r.Addr())
	}
	admitted, took = spendConcurrently(t, instances, goroutines, each, func(i int) bool {
		return readThenWrite(t, clients[i], "race-naive", lim)
	})
	t.Logf("read-then-write: %d admitted in %v", admitted, took)
	if withinLimit(admitted, took) {
		t.Fatalf("the read-then-write variant stayed within the limit (%d admitted): the race was not exercised", admitted)
	}
}

// readThenWrite is the broken design from the seed's section 4: the same
// bucket arithmetic, but the read and the write are two commands.
func readThenWrite(t *testing.T, c *redis.Client, key string, lim enforcement.Limit) bool {
	ctx := context.Background()
	vals, err := c.HMGet(ctx, key, "t", "ts").Result()
	if err != nil {
		t.Error(err)
		return false
	}
	b := enforcement.Bucket{}
	if s, ok := vals[0].(string); ok {
		b.Tokens, _ = strconv.ParseFloat(s, 64)
		b.TS, _ = strconv.ParseInt(vals[1].(string), 10, 64)
	}
	res := b.Take(time.Now().UnixMicro(), lim.Rate, lim.Burst, 1)
	// The gap between the read and the write: in a real client, the network
	// round trip and the decision. Every request that reads inside it sees
	// the same tokens.
	time.Sleep(time.Millisecond)
	if err := c.HSet(ctx, key, "t", strconv.FormatFloat(b.Tokens, 'g', -1, 64), "ts", b.TS).Err(); err != nil {
		t.Error(err)
	}
	return res.Allowed
}

func TestIdleKeyEvaporatesOnceRefilled(t *testing.T) {
	r := testenv.StartRedis(t)
	c := newClient(t, r.Addr())
	s := redisstore.New(c, "ttl")
	ctx := context.Background()

	// The TTL is the time to refill: 3 tokens at 0.01/s is 300 s. It counts
	// down from the Take, so it may be short of 300 s by at most the time
	// the Take and the PTTL took (a loaded machine can take long).
	slow := enforcement.Limit{Rate: 0.01, Burst: 5}
	before := time.Now()
	if _, err := s.Take(ctx, "slow", "s", slow, 3); err != nil {
		t.Fatal(err)
	}
	pttl := c.PTTL(ctx, s.BucketKey("slow", "s")).Val()
	took := time.Since(before)
	if pttl > 300*time.Second || pttl < 300*time.Second-took-time.Millisecond {
		t.Fatalf("TTL = %v, want the time to refill 3 tokens at 0.01/s (300 s) less at most %v", pttl, took)
	}

	// A bucket that refills in 300 ms is gone once those have passed since
	// the Take answered (its TTL was set before that).
	lim := enforcement.Limit{Rate: 10, Burst: 5}
	if _, err := s.Take(ctx, "idle", "s", lim, 3); err != nil {
		t.Fatal(err)
	}
	answered := time.Now()
	key := s.BucketKey("idle", "s")
	if pttl := c.PTTL(ctx, key).Val(); pttl > 300*time.Millisecond || pttl == -1 {
		t.Fatalf("TTL = %v, want at most 300ms (the time to refill 3 tokens at 10/s)", pttl)
	}
	time.Sleep(time.Until(answered.Add(350 * time.Millisecond)))
	if n := c.Exists(ctx, key).Val(); n != 0 {
		t.Fatalf("refilled bucket still in Redis")
	}
	// A cost-0 request on an unseen key writes nothing at all.
	if _, err := s.Take(ctx, "peek", "s", lim, 0); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, s.BucketKey("peek", "s")).Val(); n != 0 {
		t.Fatalf("cost 0 created a bucket")
	}
}

// TestMemoryPerBucket measures what one bucket costs Redis (MEMORY USAGE),
// with a realistic key, and reports it; it fails only if the state stops
// being small.
func TestMemoryPerBucket(t *testing.T) {
	r := testenv.StartRedis(t)
	c := newClient(t, r.Addr())
	s := redisstore.New(c, "rl")
	ctx := context.Background()
	lim := enforcement.Limit{Rate: 0.01, Burst: 200} // slow refill: the keys outlive the test
	const n = 1000
	for i := 0; i < n; i++ {
		if _, err := s.Take(ctx, fmt.Sprintf("acct_%06d", i), "api:search", lim, 10); err != nil {
			t.Fatal(err)
		}
	}
	per, err := c.MemoryUsage(ctx, s.BucketKey("acct_000001", "api:search")).Result()
	if err != nil {
		t.Fatal(err)
	}
	info := c.Info(ctx, "memory").Val()
	t.Logf("MEMORY USAGE of one bucket: %d bytes (key %q); INFO memory excerpt: %s", per, s.BucketKey("acct_000001", "api:search"), firstLine(info, "used_memory:"))
	if per > 200 {
		t.Fatalf("one bucket uses %d bytes, more than 200", per)
	}
}

func firstLine(s, prefix string) string {
	for _, l := range splitLines(s) {
		if len(l) >= len(prefix) && l[:len(prefix)] == prefix {
			return l
		}
	}
	return ""
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func TestNoScriptIsReloaded(t *testing.T) {
	r := testenv.StartRedis(t)
	c := newClient(t, r.Addr())
	s := redisstore.New(c, "noscript")
	ctx := context.Background()
	// One token a day: no whole token refills while the test runs, however
	// slow the machine, so the remaining count is exact.
	lim := enforcement.Limit{Rate: 1.0 / 86400, Burst: 5}
	if _, err := s.Take(ctx, "k", "s", lim, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	v, err := s.Take(ctx, "k", "s", lim, 1)
	if err != nil || !v.Allowed || v.Remaining != 3 {
		t.Fatalf("after SCRIPT FLUSH: %+v, %v", v, err)
	}
}

// TestStoredBucketIsReadInGo: what the scripts write (state.lua) is what
// DecodeBucket reads, and EncodeBucket writes what the scripts read.
func TestStoredBucketIsReadInGo(t *testing.T) {
	r := testenv.StartRedis(t)
	c := newClient(t, r.Addr())
	s := redisstore.New(c, "state")
	ctx := context.Background()
	lim := enforcement.Limit{Rate: 1.0 / 86400, Burst: 10} // a token a day: no refill during the test
	before := time.Now()
	if _, err := s.Take(ctx, "k", "api", lim, 3); err != nil {
		t.Fatal(err)
	}
	b, found, err := redisstore.ReadBucket(ctx, c, s.BucketKey("k", "api"))
	if err != nil || !found {
		t.Fatalf("ReadBucket after a decision: found %v, %v", found, err)
	}
	if math.Abs(b.Tokens-7) > 1e-3 {
		t.Errorf("tokens %v, want 7 (10 − 3)", b.Tokens)
	}
	if at := time.UnixMicro(b.TS); at.Before(before.Add(-time.Minute)) || at.After(time.Now().Add(time.Minute)) {
		t.Errorf("last update at %v, want about now (%v), on Redis's clock", at, before)
	}
	if ttl := c.PTTL(ctx, s.BucketKey("k", "api")).Val(); ttl < 2*24*time.Hour || ttl > 3*24*time.Hour+time.Minute {
		t.Errorf("TTL %v, want the 3 days three tokens take to refill", ttl)
	}

	// A state written by hand is the one the script starts from.
	set := enforcement.Bucket{Tokens: 2.5, TS: b.TS}
	if got, err := redisstore.DecodeBucket(redisstore.EncodeBucket(set)); err != nil || got != set {
		t.Fatalf("DecodeBucket(EncodeBucket(%+v)) = %+v, %v", set, got, err)
	}
	if err := c.Set(ctx, s.BucketKey("k", "api"), redisstore.EncodeBucket(set), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	v, err := s.Take(ctx, "k", "api", lim, 2)
	if err != nil || !v.Allowed || v.Remaining != 0 {
		t.Fatalf("taking 2 of 2.5: %+v %v, want allowed with 0 whole tokens left", v, err)
	}
	if _, found, _ := redisstore.ReadBucket(ctx, c, s.BucketKey("absent", "api")); found {
		t.Fatal("ReadBucket found a bucket nobody wrote")
	}
	if _, err := redisstore.DecodeBucket("short"); err == nil {
		t.Fatal("DecodeBucket accepted 5 bytes")
	}
}
