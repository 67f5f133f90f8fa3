package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/internal/testenv"
)

const e2eAdmin = "e2e-admin-token-0123456789"

// agreementPolicy: generous buckets (only quotas ever reject), and the three
// ways the usage API's old, separate reading of the policy disagreed with
// the limiter (see TestPolicyAgreesWithTheLimiter).
const agreementPolicy = `version: 1
default_tier: free
tiers:
  free:   { rate: 100000, burst: 100000 }
  pro:    { rate: 100000, burst: 100000, quota: { limit: 5000, period: month } }
  gold:   { rate: 100000, burst: 100000, quota: { limit: 8000, period: day } }
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
    rate: 100000
  - name: exports
    key_prefix: "vip_"
    scope: "api:export"
    quota: { limit: 30, period: day }
  - name: gold-search
    tier: gold
    scope: "api:*"
    rate: 50000
keys: { vip_1: pro, plain_pro: pro, gold_1: gold }
`

// quotaView is the part of GET /v1/quota the tests read.
type quotaView struct {
	Tier  string
	Quota *struct {
		QuotaID, Rule, Policy, Period, PeriodStart, ResetsAt string
		Limit, Used, Remaining                               uint64
		Redis                                                *struct {
			Used, Remaining uint64
			Present         bool
		}
		Consistency struct {
			State      string
			Difference int64
			Message    string
		}
	}
}

func getQuota(t *testing.T, api *proc, key, scope, tier string) quotaView {
	t.Helper()
	q := url.Values{"key": {key}}
	if scope != "" {
		q.Set("scope", scope)
	}
	if tier != "" {
		q.Set("tier", tier)
	}
	code, b := call(t, "GET", api.url+"/v1/quota?"+q.Encode(), e2eAdmin, "")
	if code != 200 {
		t.Fatalf("quota %s: %d %s", q.Encode(), code, b)
	}
	var v quotaView
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

type checkAnswer struct {
	Allowed bool
	Policy  string
	Source  string
}

func check(t *testing.T, limiter *proc, key, scope, tier string, cost int) checkAnswer {
	t.Helper()
	body := fmt.Sprintf(`{"key":%q,"scope":%q,"cost":%d`, key, scope, cost)
	if tier != "" {
		body += fmt.Sprintf(`,"tier":%q`, tier)
	}
	code, b := call(t, "POST", limiter.url+"/check", "", body+"}")
	if code != 200 {
		t.Fatalf("check %s: %d %s", body, code, b)
	}
	var a checkAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

func redisClient(t *testing.T, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialTimeout: 5 * time.Second,
		ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// enforcedCounter is what the limiter wrote for key: its one quota
// counter's Redis key (rl:{key}:q:<QuotaID>:<window start>), QuotaID,
// window start and end (the expiry the bucket script sets is window end +
// 60 s). ok is false when the limiter wrote no quota counter.
func enforcedCounter(t *testing.T, rdb *redis.Client, key string) (rkey, quotaID string, start, end time.Time, ok bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys, err := rdb.Keys(ctx, "rl:{"+key+"}:q:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) == 0 {
		return "", "", time.Time{}, time.Time{}, false
	}
	if len(keys) > 1 {
		t.Fatalf("%s: several quota counters %v", key, keys)
	}
	rkey = keys[0]
	rest := strings.TrimPrefix(rkey, "rl:{"+key+"}:q:")
	i := strings.LastIndexByte(rest, ':')
	sec, err := strconv.ParseInt(rest[i+1:], 10, 64)
	if err != nil {
		t.Fatalf("counter %s: %v", rkey, err)
	}
	exp, err := rdb.PExpireTime(ctx, rkey).Result()
	if err != nil {
		t.Fatal(err)
	}
	end = time.UnixMilli(exp.Milliseconds()).Add(-time.Minute).UTC()
	return rkey, rest[:i], time.Unix(sec, 0).UTC(), end, true
}

func periodOf(start, end time.Time) string {
	switch d := end.Sub(start); {
	case d == time.Hour:
		return "hour"
	case d == 24*time.Hour:
		return "day"
	case start.AddDate(0, 1, 0).Equal(end):
		return "month"
	}
	return fmt.Sprintf("unknown (%s to %s)", start, end)
}

// TestPolicyAgreesWithTheLimiter runs one table of (key, scope, tier)
// through the limiter binary's POST /check (real Redis) and the usage-api
// binary's GET /v1/quota, and requires the same rule, quota counter, limit
// and period: the rule from /check's "policy"; the counter, its window and
// so its period from the key the limiter's bucket script wrote in Redis; the
// limit by probing the limiter (a counter set to limit − 1 admits one more
// token, set to limit it admits none).
func TestPolicyAgreesWithTheLimiter(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	r := testenv.StartRedis(t)
	rdb := redisClient(t, r.Addr())
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(agreementPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	limiter := start(t, "limiter", "LIMITER_ADDR", "/healthz", "POLICY_FILE="+policy, "REDIS_ADDRS="+r.Addr(),
		"LIMITER_GRPC_ADDR=",       // off: no fixed port shared with other tests
		"LIMITER_STORE_TIMEOUT=2s") // a deadline a loaded machine does not miss: every answer here is Redis's
	api := start(t, "usage-api", "USAGE_API_ADDR", "/readyz", "POLICY_FILE="+policy, "REDIS_ADDRS="+r.Addr(),
		"CLICKHOUSE_ADDR="+ch.Addr(), "CLICKHOUSE_DATABASE="+ch.Database(t),
		"USAGE_ADMIN_TOKEN="+e2eAdmin, "USAGE_TOKEN_SECRET=e2e-secret-0123456789abcdef")

	for _, tc := range []struct {
		name             string
		key, scope, tier string
		rule             string // the winning rule, as /check reports it
		quotaID          string // "" = no quota
	}{
		{"key_prefix ties go to the rule listed first", "acct_big_1", "api:search", "", "acct-prefix", "rule:acct-prefix"},
		{"a rule matching on tier alone applies", "plain_pro", "api:search", "", "pro-everything", "rule:pro-everything"},
		{"a higher rule without a quota keeps the tier's quota", "vip_1", "api:search", "", "vip", "tier:pro"},
		{"a scope rule's own quota", "vip_2", "api:export", "", "exports", "rule:exports"},
		{"the exact key outranks the scope rule", "vip_1", "api:export", "", "vip", "tier:pro"},
		{"the tier named in the request", "someone", "api:search", "pro", "pro-everything", "rule:pro-everything"},
		{"a glob-scope rule without a quota keeps the tier's", "gold_1", "api:search", "", "gold-search", "tier:gold"},
		{"no quota at all", "nobody", "api:search", "", "free", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			view := getQuota(t, api, tc.key, tc.scope, tc.tier)
			first := check(t, limiter, tc.key, tc.scope, tc.tier, 1)
			if !first.Allowed || first.Policy != tc.rule {
				t.Fatalf("/check: %+v, want allowed under rule %s", first, tc.rule)
			}
			rkey, quotaID, wstart, wend, ok := enforcedCounter(t, rdb, tc.key)
			if tc.quotaID == "" {
				if ok || view.Quota != nil {
					t.Fatalf("no quota expected: limiter wrote %q, usage API shows %+v", rkey, view.Quota)
				}
				return
			}
			if !ok {
				t.Fatalf("the limiter wrote no quota counter for %s", tc.key)
			}
			q := view.Quota
			if q == nil {
				t.Fatalf("the usage API shows no quota; the limiter counts %s", quotaID)
			}
			if quotaID != tc.quotaID || q.QuotaID != quotaID || q.Policy != first.Policy {
				t.Errorf("counter: limiter %s under rule %s, usage API %s under rule %s; want %s", quotaID, first.Policy, q.QuotaID, q.Policy, tc.quotaID)
			}
			if got := periodOf(wstart, wend); got != q.Period || wstart.Format(time.RFC3339) != q.PeriodStart || wend.Format(time.RFC3339) != q.ResetsAt {
				// The window may have turned over between the two reads (at
				// most once per hour): say so rather than guess.
				t.Errorf("period: limiter %s [%s, %s), usage API %s [%s, %s)", got, wstart, wend, q.Period, q.PeriodStart, q.ResetsAt)
			}
			ctx := context.Background()
			if err := rdb.Set(ctx, rkey, q.Limit-1, 0).Err(); err != nil {
				t.Fatal(err)
			}
			if a := check(t, limiter, tc.key, tc.scope, tc.tier, 1); !a.Allowed {
				t.Errorf("with %d of %d spent the limiter rejects: its limit is lower than the usage API's", q.Limit-1, q.Limit)
			}
			if err := rdb.Set(ctx, rkey, q.Limit, 0).Err(); err != nil {
				t.Fatal(err)
			}
			if a := check(t, limiter, tc.key, tc.scope, tc.tier, 1); a.Allowed {
				t.Errorf("with %d of %d spent the limiter allows: its limit is higher than the usage API's", q.Limit, q.Limit)
			}
			if err := rdb.Del(ctx, rkey).Err(); err != nil { // the next case may share the counter
				t.Fatal(err)
			}
		})
	}
}
