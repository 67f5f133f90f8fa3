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

	"github.com/ratewarden/ratewarden/testkit/testenv"
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
	t.Parallel()
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

const lossPolicy = `version: 1
default_tier: free
tiers:
  free: { rate: 100000, burst: 100000 }
  pro:  { rate: 100000, burst: 100000, quota: { limit: 100, period: month } }
  big:  { rate: 100000, burst: 100000, quota: { limit: 10000, period: month } }
keys: { acct_restart: pro, acct_evict: pro, acct_paced: big }
`

// waitFor polls cond every 20 ms until it holds, failing after within
// (a bound for a starved machine, not the expected time) with what.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	return testenv.WaitFor(t, within, what, cond)
}

// spend sends n decisions of cost through /check; every one must be allowed
// by Redis (source shared).
func spend(t *testing.T, limiter *proc, key string, cost, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if a := check(t, limiter, key, "api:search", "", cost); !a.Allowed || a.Source != "shared" {
			t.Fatalf("decision %d of %s: %+v, want allowed by Redis", i+1, key, a)
		}
	}
}

// warm makes sure the limiter's connections to a restarted Redis work
// (cost-0 decisions spend nothing) so the decisions that count are Redis's.
func warm(t *testing.T, limiter *proc, key string) {
	t.Helper()
	ok := 0
	waitFor(t, 60*time.Second, "the limiter decides with Redis again", func() bool {
		if check(t, limiter, key, "api:search", "", 0).Source == "degraded" {
			ok = 0
		} else {
			ok++
		}
		return ok >= 3
	})
}

// exactlyRemaining asserts that the limiter admits exactly want more tokens
// of key's quota (cost 1 each, all decided by Redis), then rejects.
func exactlyRemaining(t *testing.T, limiter *proc, key string, want int) {
	t.Helper()
	for i := 0; i < want; i++ {
		if a := check(t, limiter, key, "api:search", "", 1); !a.Allowed || a.Source != "shared" {
			t.Fatalf("%s: token %d of the %d remaining: %+v", key, i+1, want, a)
		}
	}
	if a := check(t, limiter, key, "api:search", "", 1); a.Allowed {
		t.Fatalf("%s: token %d allowed; only %d remained (a fresh allowance?)", key, want+1, want)
	}
}

// TestQuotaSurvivesRedisLoss: mid-period, with usage recorded in ClickHouse
// through the real pipeline (limiter → Kafka → meter-consumer), Redis
// restarts empty and, separately, a quota counter is deleted as an eviction
// would. The usage API says plainly that Redis is behind the record; the
// reconciler in meter-consumer restores the counter within one interval, and
// the next decisions see exactly limit − recorded allowed cost. A third key
// under paced traffic measures the over-admission while the counter is lost.
func TestQuotaSurvivesRedisLoss(t *testing.T) {
	t.Parallel()
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	kafka := testenv.StartKafka(t, "ratelimit.decisions", 4)
	r := testenv.StartRedis(t)
	rdb := redisClient(t, r.Addr())
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(lossPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"KAFKA_BROKERS=" + kafka.Addr(), "KAFKA_TOPIC=" + kafka.Topic(), "CLICKHOUSE_ADDR=" + ch.Addr(),
		"CLICKHOUSE_DATABASE=" + db, "POLICY_FILE=" + policy, "REDIS_ADDRS=" + r.Addr()}
	limiter := start(t, "limiter", "LIMITER_ADDR", "/healthz", append(common, "LIMITER_GRPC_ADDR=", "LIMITER_STORE_TIMEOUT=2s")...)
	api := start(t, "usage-api", "USAGE_API_ADDR", "/readyz", append(common,
		"USAGE_ADMIN_TOKEN="+e2eAdmin, "USAGE_TOKEN_SECRET=e2e-secret-0123456789abcdef")...)
	// First without the reconciler (REDIS_ADDRS empty for meter-consumer):
	// the loss must be visible before anything repairs it.
	meterEnv := append(append([]string{}, common...), "METER_BATCH_WAIT=50ms", "REDIS_ADDRS=")
	meter := start(t, "meter-consumer", "METER_ADDR", "/readyz", meterEnv...)

	recorded := func(key string, used uint64) func() bool {
		return func() bool {
			q := getQuota(t, api, key, "", "").Quota
			return q != nil && q.Used == used && q.Consistency.State == "agree"
		}
	}
	spend(t, limiter, "acct_restart", 6, 10) // 60 of 100
	waitFor(t, 2*time.Minute, "60 tokens of acct_restart recorded and agreeing with Redis", recorded("acct_restart", 60))

	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	q := getQuota(t, api, "acct_restart", "", "").Quota
	if q.Consistency.State != "redis_behind" || q.Consistency.Difference != -60 || q.Redis == nil || q.Redis.Present ||
		q.Redis.Remaining != 100 || q.Remaining != 40 || !strings.Contains(q.Consistency.Message, "lost its counter") {
		t.Fatalf("after the restart the usage API shows %+v", *q)
	}
	t.Logf("usage API after the Redis restart: %s", q.Consistency.Message)

	// Now the reconciler: meter-consumer with REDIS_ADDRS, every second.
	meter.stop(t)
	const every = time.Second
	meterEnv = append(append([]string{}, common...), "METER_BATCH_WAIT=50ms", "METER_RECONCILE_EVERY="+every.String())
	start(t, "meter-consumer", "METER_ADDR", "/readyz", meterEnv...)
	counter := func(key string) int64 {
		rkey, _, _, _, ok := enforcedCounter(t, rdb, key)
		if !ok {
			return -1
		}
		v, err := rdb.Get(context.Background(), rkey).Int64()
		if err != nil {
			return -1
		}
		return v
	}
	waitFor(t, 60*time.Second, "the reconciler restores acct_restart's counter to 60", func() bool { return counter("acct_restart") == 60 })
	warm(t, limiter, "acct_restart")
	exactlyRemaining(t, limiter, "acct_restart", 40)
	waitFor(t, 2*time.Minute, "the usage API shows acct_restart's 100 agreeing", recorded("acct_restart", 100))

	// An eviction: the counter alone disappears, the reconciler running.
	spend(t, limiter, "acct_evict", 3, 10) // 30 of 100
	waitFor(t, 2*time.Minute, "30 tokens of acct_evict recorded", recorded("acct_evict", 30))
	rkey, _, _, _, _ := enforcedCounter(t, rdb, "acct_evict")
	if err := rdb.Del(context.Background(), rkey).Err(); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 60*time.Second, "the reconciler restores acct_evict's counter to 30", func() bool {
		v, err := rdb.Get(context.Background(), rkey).Int64()
		return err == nil && v == 30
	})
	t.Logf("evicted counter restored %s after the eviction (METER_RECONCILE_EVERY=%s)", took.Round(time.Millisecond), every)
	exactlyRemaining(t, limiter, "acct_evict", 70)

	// Over-admission under traffic: 9,000 of 10,000 spent and recorded; the
	// counter is lost; decisions of 10 tokens every 20 ms (500 tokens/s)
	// until the first rejection. Without the reconciler they would run for
	// the whole fresh allowance (10,000 tokens, 20 s).
	spend(t, limiter, "acct_paced", 900, 10)
	waitFor(t, 2*time.Minute, "9000 tokens of acct_paced recorded", recorded("acct_paced", 9000))
	rkey, _, _, _, _ = enforcedCounter(t, rdb, "acct_paced")
	if err := rdb.Del(context.Background(), rkey).Err(); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	admitted := 0
	for {
		a := check(t, limiter, "acct_paced", "api:search", "", 10)
		if !a.Allowed {
			break
		}
		admitted += 10
		if admitted >= 10000 {
			t.Fatal("a fresh allowance: 10,000 tokens admitted after the counter was lost")
		}
		time.Sleep(20 * time.Millisecond)
	}
	over := admitted - 1000
	t.Logf("paced traffic (500 tokens/s) after the loss: %d tokens admitted where 1000 remained: over-admission %d tokens over %s (METER_RECONCILE_EVERY=%s)",
		admitted, over, time.Since(lost).Round(time.Millisecond), every)
	if over < 0 {
		t.Errorf("admitted %d, less than the 1000 that remained", admitted)
	}
}
