package enforcement

import (
	"math"
	"testing"
	"time"
)

func TestBucketSteps(t *testing.T) {
	// One bucket, rate 10/s, burst 5, driven through a table of steps.
	type step struct {
		now          int64 // µs
		cost         int64
		allowed      bool
		tokens       float64
		retryAfterUS int64
		clockBack    bool
	}
	steps := []step{
		{now: 1_000_000, cost: 1, allowed: true, tokens: 4}, // never seen: starts full
		{now: 1_000_000, cost: 4, allowed: true, tokens: 0}, // spends the rest
		{now: 1_000_000, cost: 1, allowed: false, tokens: 0, retryAfterUS: 100_000},
		{now: 1_050_000, cost: 1, allowed: false, tokens: 0.5, retryAfterUS: 50_000},                 // rejection still refills
		{now: 1_100_000, cost: 1, allowed: true, tokens: 0},                                          // exactly at the retry time
		{now: 1_100_000, cost: 0, allowed: true, tokens: 0},                                          // cost 0 always allowed
		{now: 1_000_000, cost: 1, allowed: false, tokens: 0, retryAfterUS: 100_000, clockBack: true}, // clock stepped back
		{now: 2_100_000, cost: 3, allowed: true, tokens: 2},                                          // refilled to the cap, not beyond
		{now: 3_000_000, cost: 5, allowed: true, tokens: 0},
		{now: 3_000_000, cost: 5, allowed: false, tokens: 0, retryAfterUS: 500_000}, // weighted cost waits longer
	}
	var b Bucket
	for i, s := range steps {
		r := b.Take(s.now, 10, 5, s.cost)
		if r.Allowed != s.allowed || math.Abs(r.Tokens-s.tokens) > 1e-9 || r.RetryAfterUS != s.retryAfterUS || r.ClockBack != s.clockBack {
			t.Fatalf("step %d (now=%d cost=%d): got allowed=%v tokens=%v retry=%d back=%v; want %v %v %d %v",
				i, s.now, s.cost, r.Allowed, r.Tokens, r.RetryAfterUS, r.ClockBack, s.allowed, s.tokens, s.retryAfterUS, s.clockBack)
		}
	}
}

func TestBucketClockBackNeverRemovesTokens(t *testing.T) {
	var b Bucket
	b.Take(10_000_000, 1, 10, 5) // 5 left at t=10s
	before := b.Tokens
	r := b.Take(4_000_000, 1, 10, 0) // clock jumps back 6 s
	if !r.ClockBack || r.Tokens < before {
		t.Fatalf("after a backwards jump tokens = %v (was %v), clockBack=%v", r.Tokens, before, r.ClockBack)
	}
	// And time resumes from the later reading: no refill is double-counted.
	r = b.Take(11_000_000, 1, 10, 0)
	if math.Abs(r.Tokens-6) > 1e-9 {
		t.Fatalf("1 s after the last good reading tokens = %v, want 6", r.Tokens)
	}
}

func TestBucketFull(t *testing.T) {
	var b Bucket
	if !b.Full(1, 1, 1) {
		t.Fatal("a never-seen bucket is full")
	}
	b.Take(1_000_000, 2, 4, 4)
	if b.Full(2_999_999, 2, 4) || !b.Full(3_000_000, 2, 4) {
		t.Fatal("bucket must be full exactly after burst/rate seconds")
	}
}

func TestPeriodWindow(t *testing.T) {
	cases := []struct {
		p          Period
		at         string
		start, end string
	}{
		{PeriodMonth, "2026-01-31T23:59:59Z", "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"},
		{PeriodMonth, "2026-02-01T00:00:00Z", "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"},
		{PeriodMonth, "2026-12-31T23:59:59.999Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{PeriodDay, "2028-02-29T12:00:00+05:00", "2028-02-29T00:00:00Z", "2028-03-01T00:00:00Z"},
		{PeriodHour, "2026-07-31T09:59:59Z", "2026-07-31T09:00:00Z", "2026-07-31T10:00:00Z"},
	}
	for _, c := range cases {
		start, end := c.p.Window(mustTime(t, c.at))
		if !start.Equal(mustTime(t, c.start)) || !end.Equal(mustTime(t, c.end)) {
			t.Errorf("%s window of %s = [%s, %s), want [%s, %s)", c.p, c.at, start, end, c.start, c.end)
		}
	}
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
