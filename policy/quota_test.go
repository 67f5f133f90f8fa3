package policy_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// The limiter resolves through this package's Policy.
var _ enforcement.Policy = (*policy.Policy)(nil)

// TestQuotaWindowBoundary: quota windows are UTC calendar windows; the last
// instant of one and the first of the next fall in different windows, and
// so in different Redis counters.
func TestQuotaWindowBoundary(t *testing.T) {
	utc := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	cases := []struct {
		at         string
		period     enforcement.Period
		start, end string
	}{
		{"2026-01-31T23:59:59.999999999Z", enforcement.PeriodMonth, "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"},
		{"2026-02-01T00:00:00Z", enforcement.PeriodMonth, "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"},
		{"2024-02-29T23:59:59Z", enforcement.PeriodMonth, "2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z"}, // leap year
		{"2026-12-31T23:59:59Z", enforcement.PeriodMonth, "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"2027-01-01T00:00:00Z", enforcement.PeriodMonth, "2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z"},
		// A local time is placed by its UTC instant: 00:30 on 1 Feb in +01:00 is still January.
		{"2026-02-01T00:30:00+01:00", enforcement.PeriodMonth, "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"},
		{"2026-03-29T23:59:59Z", enforcement.PeriodDay, "2026-03-29T00:00:00Z", "2026-03-30T00:00:00Z"},
		{"2026-03-30T00:00:00Z", enforcement.PeriodDay, "2026-03-30T00:00:00Z", "2026-03-31T00:00:00Z"},
		{"2026-03-29T00:59:59.5Z", enforcement.PeriodHour, "2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z"},
		{"2026-03-29T01:00:00Z", enforcement.PeriodHour, "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z"},
	}
	for _, c := range cases {
		start, end := c.period.Window(utc(c.at))
		if !start.Equal(utc(c.start)) || !end.Equal(utc(c.end)) || start.Location() != time.UTC {
			t.Errorf("%s %s: window [%s, %s), want [%s, %s) in UTC", c.period, c.at, start, end, c.start, c.end)
		}
	}
	store := redisstore.New(nil, "q")
	lastJan, _ := enforcement.PeriodMonth.Window(utc("2026-01-31T23:59:59Z"))
	firstFeb, _ := enforcement.PeriodMonth.Window(utc("2026-02-01T00:00:00Z"))
	if a, b := store.QuotaKey("acct", "tier:ent", lastJan), store.QuotaKey("acct", "tier:ent", firstFeb); a == b {
		t.Errorf("the last second of January and the first of February share counter %s", a)
	}
}

const quotaPolicy = `
version: 1
default_tier: roomy
tiers:
  qday:  { rate: 1, burst: 10, quota: { limit: 10, period: day } }
  slow:  { rate: 1, period: day, burst: 10, quota: { limit: 10, period: hour } }
  roomy: { rate: 1, burst: 1000, quota: { limit: 5, period: month } }
  free:  { rate: 1, burst: 10, soft_limit_percent: 50, quota: { limit: 100, period: day } }
  soft:  { rate: 1000, burst: 1000, soft_limit_percent: 50, quota: { limit: 10, period: month } }
`

type quotaEnv struct {
	lim   *enforcement.Limiter
	rdb   *redis.Client
	store *redisstore.Store
	pol   *policy.Policy
}

func newQuotaEnv(t *testing.T) *quotaEnv {
	t.Helper()
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	store := redisstore.New(rdb, "quota")
	pol := parse(t, quotaPolicy)
	lim, err := enforcement.New(enforcement.Config{Authority: store, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	return &quotaEnv{lim: lim, rdb: rdb, store: store, pol: pol}
}

func (e *quotaEnv) check(t *testing.T, key, scope, tier string, cost int64) enforcement.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := e.lim.Check(ctx, enforcement.Request{Key: key, Scope: scope, Tier: tier, Cost: cost, HasCost: true})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// used reads the quota counter of key's current window straight from Redis.
// bucketTokens is what the bucket of (key, "s") holds in Redis now (its
// last write, before refill): the bucket a quota refusal must not charge.
func (e *quotaEnv) bucketTokens(t *testing.T, key string) float64 {
	t.Helper()
	b, found, err := redisstore.ReadBucket(context.Background(), e.rdb, e.store.BucketKey(key, "s"))
	if err != nil || !found {
		t.Fatalf("the bucket of %q in Redis: found %v, %v", key, found, err)
	}
	return b.Tokens
}

func (e *quotaEnv) used(t *testing.T, key, tier string) int64 {
	t.Helper()
	res, err := e.pol.Resolve(key, "s", tier)
	if err != nil {
		t.Fatal(err)
	}
	start, _ := res.QuotaPeriod.Window(time.Now())
	n, err := e.rdb.Get(context.Background(), e.store.QuotaKey(key, res.QuotaID, start)).Int64()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return n
}

// untilWindowEnd checks that d waits until the end of period's current
// window, measured between before and after the decision.
func untilWindowEnd(t *testing.T, d enforcement.Decision, period enforcement.Period, before, after time.Time) {
	t.Helper()
	_, end := period.Window(before)
	if _, end2 := period.Window(after); !end2.Equal(end) {
		t.Skipf("the %s window ended during the test; the decision is right either way", period) // once a month, at most
	}
	lo, hi := end.Sub(after)-time.Millisecond, end.Sub(before)+time.Millisecond
	if d.RetryAfter < lo || d.RetryAfter > hi {
		t.Errorf("retryAfter %v, want the time to the end of the %s window (%v … %v)", d.RetryAfter, period, lo, hi)
	}
}

// TestBucketAndQuotaInOneDecision: against a real redis-server, a request
// must pass both the bucket and the quota in one atomic step, a refusal by
// either spends nothing from the other, and retryAfterMs is the later of
// the two waits.
func TestBucketAndQuotaInOneDecision(t *testing.T) {
	e := newQuotaEnv(t)

	t.Run("both exhausted, the quota's wait is later", func(t *testing.T) {
		// Another instance on the same Redis spends the bucket and the quota;
		// this one knows nothing locally, so the shared script decides.
		other, err := enforcement.New(enforcement.Config{Authority: e.store, Policy: e.pol})
		if err != nil {
			t.Fatal(err)
		}
		if d, err := other.Check(context.Background(), enforcement.Request{Key: "qa", Scope: "s", Tier: "qday", Cost: 10, HasCost: true}); err != nil || !d.Allowed {
			t.Fatalf("first request refused: %+v %v", d, err)
		}
		before := time.Now()
		d := e.check(t, "qa", "s", "qday", 1) // the bucket needs 1 s, the quota the end of the day
		after := time.Now()
		if d.Allowed || d.Source != enforcement.SourceShared {
			t.Fatalf("%+v, want a shared rejection", d)
		}
		untilWindowEnd(t, d, enforcement.PeriodDay, before, after)

		// The same, asked of the store directly: one script, one round trip.
		lim := enforcement.Limit{Rate: 1, Burst: 10, QuotaLimit: 10, QuotaPeriod: enforcement.PeriodDay, QuotaID: "direct"}
		if v, err := e.store.Take(context.Background(), "qa2", "s", lim, 10); err != nil || !v.Allowed || v.QuotaUsed != 10 {
			t.Fatalf("store: %+v %v", v, err)
		}
		before = time.Now()
		v, err := e.store.Take(context.Background(), "qa2", "s", lim, 1)
		after = time.Now()
		if err != nil || v.Allowed {
			t.Fatalf("store: %+v %v", v, err)
		}
		untilWindowEnd(t, enforcement.Decision{RetryAfter: v.RetryAfter}, enforcement.PeriodDay, before, after)
	})

	t.Run("both exhausted, the bucket's wait is later", func(t *testing.T) {
		if d := e.check(t, "qb", "s", "slow", 10); !d.Allowed {
			t.Fatalf("first request refused: %+v", d)
		}
		d := e.check(t, "qb", "s", "slow", 1) // the bucket refills 1 a day; the hourly quota ends sooner
		if d.Allowed {
			t.Fatalf("%+v, want a rejection", d)
		}
		if d.RetryAfter < 86_390*time.Second || d.RetryAfter > 86_400*time.Second {
			t.Errorf("retryAfter %v, want the bucket's ~24h (deficit ÷ rate), later than the hour's end", d.RetryAfter)
		}
	})

	t.Run("the quota refuses, the bucket is not charged", func(t *testing.T) {
		// The quota (5) binds long before the bucket (1000): remaining,
		// limit and reset report it.
		if d := e.check(t, "qc", "s", "roomy", 5); !d.Allowed || d.Remaining != 0 || d.Limit != 5 {
			t.Fatalf("first request: %+v, want allowed with 0 of the quota's 5 left", d)
		}
		charged := e.bucketTokens(t, "qc")
		before := time.Now()
		d := e.check(t, "qc", "s", "roomy", 1)
		after := time.Now()
		if d.Allowed || d.Remaining != 0 || d.Limit != 5 {
			t.Fatalf("%+v, want a rejection reporting the spent quota", d)
		}
		if got := e.bucketTokens(t, "qc"); got < charged || charged > 995 {
			t.Fatalf("bucket %v after the refusal (%v before it): a quota refusal must not charge the bucket", got, charged)
		}
		untilWindowEnd(t, d, enforcement.PeriodMonth, before, after)
		if n := e.used(t, "qc", "roomy"); n != 5 {
			t.Errorf("quota counter %d after a refusal, want 5", n)
		}
	})

	t.Run("the bucket refuses, the quota is not charged", func(t *testing.T) {
		if d := e.check(t, "qd", "s", "free", 10); !d.Allowed || !d.Warning {
			t.Fatalf("first request: %+v, want allowed with a warning (bucket 100%% used, soft limit 50%%)", d)
		}
		d := e.check(t, "qd", "s", "free", 5)
		if d.Allowed || d.RetryAfter < 4*time.Second || d.RetryAfter > 5*time.Second {
			t.Fatalf("%+v, want a rejection waiting ~5 s for the bucket", d)
		}
		if n := e.used(t, "qd", "free"); n != 10 {
			t.Errorf("quota counter %d after a bucket refusal, want 10", n)
		}
	})

	t.Run("the quota's soft limit warns", func(t *testing.T) {
		if d := e.check(t, "qs", "s", "soft", 4); !d.Allowed || d.Warning {
			t.Fatalf("40%% of the quota: %+v, want allowed without a warning", d)
		}
		if d := e.check(t, "qs", "s", "soft", 1); !d.Allowed || !d.Warning {
			t.Fatalf("50%% of the quota: %+v, want allowed with a warning", d)
		}
	})

	t.Run("one quota across the scopes of a key", func(t *testing.T) {
		e.check(t, "qe", "a", "roomy", 3)
		e.check(t, "qe", "b", "roomy", 2)
		if d := e.check(t, "qe", "c", "roomy", 1); d.Allowed {
			t.Fatalf("%+v: scope c has a full bucket but the key's quota is spent", d)
		}
		if n := e.used(t, "qe", "roomy"); n != 5 {
			t.Errorf("quota counter %d, want 5", n)
		}
	})

	t.Run("the counter is the current UTC window's", func(t *testing.T) {
		ctx := context.Background()
		now := time.Now()
		start, end := enforcement.PeriodMonth.Window(now)
		prevStart, _ := enforcement.PeriodMonth.Window(start.Add(-time.Second))
		// Last month's allowance spent to the last token changes nothing now.
		if err := e.rdb.Set(ctx, e.store.QuotaKey("qw", "tier:roomy", prevStart), 5, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		if d := e.check(t, "qw", "s", "roomy", 1); !d.Allowed {
			t.Fatalf("%+v: last month's counter was used", d)
		}
		key := e.store.QuotaKey("qw", "tier:roomy", start)
		exp, err := e.rdb.PExpireTime(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if want := end.Add(time.Minute); !time.UnixMilli(exp.Milliseconds()).Equal(want) {
			t.Errorf("counter %s expires at %v, want the window's end + 1 minute (%v)", key, time.UnixMilli(exp.Milliseconds()).UTC(), want)
		}
		// This month's spent: refused until the month ends.
		if err := e.rdb.Set(ctx, key, 5, redis.KeepTTL).Err(); err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		d := e.check(t, "qw", "s2", "roomy", 1)
		untilWindowEnd(t, d, enforcement.PeriodMonth, before, time.Now())
	})
}
