package usage

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// The three ways the old, separate reading of the policy disagreed with the
// limiter, and a scope-specific quota: the view now resolves with the
// limiter's code (the same table runs through the limiter binary in
// cmd/usage-api, TestPolicyAgreesWithTheLimiter).
const resolutionPolicy = `version: 1
default_tier: free
tiers:
  free:   { rate: 10, burst: 20 }
  pro:    { rate: 100, burst: 200, quota: { limit: 5000, period: month } }
rules:
  - name: acct-prefix
    key_prefix: "acct_"
    quota: { limit: 100, period: day }
  - name: acct-longer-prefix
    key_prefix: "acct_big"
    quota: { limit: 900, period: day }
  - name: pro-everything
    tier: pro
    quota: { limit: 700, period: hour }
  - name: vip
    key: "vip_1"
    rate: 1000
    burst: 1000
  - name: exports
    scope: "api:export"
    key_prefix: "vip_"
    quota: { limit: 3, period: day }
keys: { vip_1: pro, plain_pro: pro }
`

func TestQuotaViewResolvesLikeTheLimiter(t *testing.T) {
	e := newEnv(t, sharedCH, testNow)
	writeFile(t, e.policy, resolutionPolicy)
	for _, tc := range []struct {
		key, scope    string
		rule, quotaID string // "" quotaID: no quota
		limit         uint64
		period        string
	}{
		// key_prefix ties go to the rule listed first, not the longest prefix.
		{"acct_big_1", "", "acct-prefix", "rule:acct-prefix", 100, "day"},
		// A rule matching on tier alone applies.
		{"plain_pro", "", "pro-everything", "rule:pro-everything", 700, "hour"},
		// An exact-key rule without a quota wins and keeps its tier's quota,
		// not a lower-ranked rule's.
		{"vip_1", "", "vip", "tier:pro", 5000, "month"},
		// A scope-specific rule's quota, for that scope.
		{"vip_2", "api:export", "exports", "rule:exports", 3, "day"},
		{"nobody", "", "free", "", 0, ""},
	} {
		q := url.Values{"key": {tc.key}}
		if tc.scope != "" {
			q.Set("scope", tc.scope)
		}
		code, b := e.do("GET", "/v1/quota?"+q.Encode(), testAdmin, "")
		r := decode[quotaResponse](t, b)
		if code != 200 {
			t.Fatalf("%v: %d %s", tc, code, b)
		}
		if tc.quotaID == "" {
			if r.Quota != nil || len(r.Quotas) != 0 {
				t.Errorf("%s: a quota is shown where the limiter enforces none: %s", tc.key, b)
			}
			continue
		}
		if r.Quota == nil || r.Quota.Policy != tc.rule || r.Quota.QuotaID != tc.quotaID || r.Quota.Limit != tc.limit || r.Quota.Period != tc.period {
			t.Errorf("%s %s: got %s, want rule %s, %s %d per %s", tc.key, tc.scope, b, tc.rule, tc.quotaID, tc.limit, tc.period)
		}
	}
	if code, b := e.do("GET", "/v1/quota?key=x&tier=gold", testAdmin, ""); code != 400 || !strings.Contains(string(b), "gold") {
		t.Errorf("unknown tier: %d %s", code, b)
	}
}

// With Redis the view shows what the limiter's counter says is left, and
// says plainly when it disagrees with the record.
func TestQuotaViewComparesRedisWithTheRecord(t *testing.T) {
	e := newEnv(t, sharedCH, testNow)
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	srv, err := New(Config{Store: e.store, Signer: e.signer, AdminToken: testAdmin, PolicyPath: e.policy,
		Now: func() time.Time { return e.now }, QueryTimeout: 30 * time.Second, Redis: rdb, KeyPrefix: "rq"})
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	e.http.Config.Handler = srv.Handler()
	seed(t, e.conn, e.db, []decision{
		{ts: time.Date(2026, 7, 3, 0, 0, 0, 0, time.UTC), key: "acct_a", scope: "s", tier: "enterprise", cost: 600, allowed: true},
	})
	start, _ := limits.PeriodMonth.Window(testNow)
	counter := limits.QuotaKey("rq", "acct_a", "tier:enterprise", start)
	ctx := context.Background()

	get := func() quotaInfo {
		t.Helper()
		code, b := e.do("GET", "/v1/quota?key=acct_a", testAdmin, "")
		r := decode[quotaResponse](t, b)
		if code != 200 || r.Quota == nil || r.Quota.Used != 600 || r.Quota.Limit != 1000 {
			t.Fatalf("quota: %d %s", code, b)
		}
		return *r.Quota
	}
	// No counter: Redis lost it.
	q := get()
	if q.Redis == nil || q.Redis.Present || q.Redis.Remaining != 1000 || q.Consistency.State != "redis_behind" ||
		q.Consistency.Difference != -600 || !strings.Contains(q.Consistency.Message, "lost its counter") {
		t.Errorf("no counter: %+v %+v", q.Redis, q.Consistency)
	}
	rdb.Set(ctx, counter, 600, 0)
	if q = get(); q.Consistency.State != "agree" || q.Redis.Remaining != 400 {
		t.Errorf("equal: %+v %+v", q.Redis, q.Consistency)
	}
	rdb.Set(ctx, counter, 650, 0)
	if q = get(); q.Consistency.State != "redis_ahead" || q.Consistency.Difference != 50 || q.Redis.Remaining != 350 {
		t.Errorf("ahead: %+v %+v", q.Redis, q.Consistency)
	}
	r.Close()
	if q = get(); q.Redis != nil || q.Consistency.State != "unknown" || !strings.Contains(q.Consistency.Message, "Redis could not be asked") {
		t.Errorf("Redis down: %+v %+v", q.Redis, q.Consistency)
	}
}
