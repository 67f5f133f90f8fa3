package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// snapshot is what Redis holds for one key: its value and whether it is
// there (a bucket that is full is not).
func snapshot(t *testing.T, rdb *redis.Client, key string) string {
	t.Helper()
	v, err := rdb.Get(context.Background(), key).Result()
	if err == redis.Nil {
		return "<absent>"
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestPeekWritesNothing: a peek answers what a decision would (the tokens
// after the cost, the quota after it) and leaves the bucket and the quota
// counter byte for byte as they were; on an exhausted key it answers a
// rejection whose retry time is honest: the tokens are there once it has
// passed.
func TestPeekWritesNothing(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(t, r.Addr())
	s := redisstore.New(rdb, "peek")
	ctx := context.Background()
	lim := enforcement.Limit{Rate: 20, Burst: 10, QuotaLimit: 1000, QuotaPeriod: enforcement.PeriodDay, QuotaID: "day"}
	start, _ := lim.QuotaPeriod.Window(time.Now())
	bkey, qkey := s.BucketKey("acct", "api"), s.QuotaKey("acct", "day", start)

	// A key never seen: the peek says what the first request would get,
	// and Redis still holds nothing.
	v, err := s.Peek(ctx, "acct", "api", lim, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !v.Allowed || v.Remaining != 7 || v.QuotaUsed != 3 {
		t.Fatalf("peek of a new key = %+v, want allowed, 7 left, quota used 3", v)
	}
	if b, q := snapshot(t, rdb, bkey), snapshot(t, rdb, qkey); b != "<absent>" || q != "<absent>" {
		t.Fatalf("a peek wrote: bucket %q, quota %q", b, q)
	}

	// A bucket refilling so slowly that Redis keeps its key (a key lives
	// until its bucket is full again) for however long 50 peeks take: at
	// rate 20 it went after 200 ms, and a loaded machine's peeks found it
	// gone, a change no peek made.
	slow := lim
	slow.Rate = 0.001
	if _, err := s.Take(ctx, "acct", "api", slow, 4); err != nil {
		t.Fatal(err)
	}
	beforeB, beforeQ := snapshot(t, rdb, bkey), snapshot(t, rdb, qkey)
	for range 50 {
		v, err := s.Peek(ctx, "acct", "api", slow, 2)
		if err != nil {
			t.Fatal(err)
		}
		if !v.Allowed || v.QuotaUsed != 6 {
			t.Fatalf("peek after spending 4 = %+v, want allowed with quota used 6", v)
		}
	}
	if b, q := snapshot(t, rdb, bkey), snapshot(t, rdb, qkey); b != beforeB || q != beforeQ {
		t.Fatalf("peeks changed the store: bucket %x → %x, quota %q → %q", beforeB, b, beforeQ, q)
	}

	// Exhausted: the peek rejects, and waiting its retry time is enough.
	if _, err := s.Take(ctx, "acct", "api", lim, 10); err != nil {
		t.Fatal(err)
	}
	for {
		v, err = s.Take(ctx, "acct", "api", lim, 10)
		if err != nil {
			t.Fatal(err)
		}
		if !v.Allowed {
			break
		}
	}
	// The key would go by itself within 500 ms (when the bucket is full
	// again): kept, so that what is compared is what the peek did.
	if err := rdb.Persist(ctx, bkey).Err(); err != nil {
		t.Fatal(err)
	}
	beforeB = snapshot(t, rdb, bkey)
	p, err := s.Peek(ctx, "acct", "api", lim, 10)
	if err != nil {
		t.Fatal(err)
	}
	if p.Allowed || p.RetryAfter <= 0 || p.RetryAfter > 500*time.Millisecond+time.Millisecond {
		t.Fatalf("peek of an exhausted key = %+v, want a rejection within the bucket's refill (500 ms)", p)
	}
	if b := snapshot(t, rdb, bkey); b != beforeB {
		t.Fatal("a rejected peek wrote the bucket")
	}
	time.Sleep(p.RetryAfter) // a promise about the future: never early, so no race
	if v, err := s.Take(ctx, "acct", "api", lim, 10); err != nil || !v.Allowed {
		t.Fatalf("after the peek's retry time: %+v, %v; want allowed", v, err)
	}
}

// TestPeekQuotaExhausted: a key whose quota is spent peeks as rejected
// until the window ends, and the counter is untouched.
func TestPeekQuotaExhausted(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(t, r.Addr())
	s := redisstore.New(rdb, "peekq")
	ctx := context.Background()
	lim := enforcement.Limit{Rate: 100, Burst: 100, QuotaLimit: 5, QuotaPeriod: enforcement.PeriodDay, QuotaID: "day"}
	if v, err := s.Take(ctx, "acct", "api", lim, 5); err != nil || !v.Allowed {
		t.Fatalf("spend the quota: %+v, %v", v, err)
	}
	start, end := lim.QuotaPeriod.Window(time.Now())
	qkey := s.QuotaKey("acct", "day", start)
	before := snapshot(t, rdb, qkey)
	v, err := s.Peek(ctx, "acct", "api", lim, 1)
	if err != nil {
		t.Fatal(err)
	}
	if v.Allowed || v.QuotaUsed != 5 || v.RetryAfter < time.Until(end)-time.Minute {
		t.Fatalf("peek of a spent quota = %+v, want rejected until the window's end (%v)", v, time.Until(end))
	}
	if after := snapshot(t, rdb, qkey); after != before {
		t.Fatalf("the quota counter moved: %q → %q", before, after)
	}
}

// TestSharedPeek: the guarded store answers peeks as the bare one does.
func TestSharedPeek(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(t, r.Addr())
	sh := redisstore.NewShared(rdb, redisstore.SharedConfig{Prefix: "sharedpeek"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sh.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	lim := enforcement.Limit{Rate: 0.01, Burst: 3}
	if _, err := sh.Take(ctx, "k", "s", lim, 2); err != nil {
		t.Fatal(err)
	}
	v, err := sh.Peek(ctx, "k", "s", lim, 1)
	if err != nil || !v.Allowed || v.Remaining != 0 {
		t.Fatalf("peek = %+v, %v; want allowed with 0 left", v, err)
	}
	v, err = sh.Peek(ctx, "k", "s", lim, 1)
	if err != nil || !v.Allowed {
		t.Fatalf("second peek = %+v, %v; want allowed again (nothing spent)", v, err)
	}
}
