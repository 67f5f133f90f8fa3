package reconcile_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/metering/quotause"
	"github.com/ratewarden/ratewarden/metering/reconcile"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

var ch *testenv.ClickHouse

func TestMain(m *testing.M) { os.Exit(testenv.MainWithClickHouse(m, &ch)) }

// env is one test's servers: a fresh ClickHouse database with the schema,
// a Redis (standalone unless the test brings a Cluster), the policy file,
// and a clock the test moves.
type env struct {
	t      *testing.T
	conn   driver.Conn
	db     string
	sink   *chsink.Sink
	rdb    redis.UniversalClient
	prefix string
	pol    *policy.Current
	path   string
	now    atomic.Pointer[time.Time]
	offset int64
	reg    *prometheus.Registry
	rec    *reconcile.Reconciler
}

func newEnv(t *testing.T, rdb redis.UniversalClient, policyYAML string, conn driver.Conn) *env {
	t.Helper()
	if conn == nil {
		conn = ch.Conn(t)
	}
	e := &env{t: t, conn: conn, db: ch.Database(t), rdb: rdb, prefix: fmt.Sprintf("t%d", time.Now().UnixNano()%1e9)}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := schema.Apply(ctx, conn, e.db); err != nil {
		t.Fatal(err)
	}
	sink, err := chsink.New(conn, e.db, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.sink = sink
	e.path = filepath.Join(t.TempDir(), "policy.yaml")
	e.setPolicy(policyYAML)
	e.pol = policy.NewCurrent(e.path, func(err error) { t.Errorf("policy refused: %v", err) })
	now := time.Now().UTC()
	e.now.Store(&now)
	reader, err := quotause.NewReader(conn, e.db)
	if err != nil {
		t.Fatal(err)
	}
	e.reg = prometheus.NewRegistry()
	e.rec, err = reconcile.New(reconcile.Config{
		Redis: rdb, KeyPrefix: e.prefix, Rows: reader, Policy: e.pol.Get,
		Every: 200 * time.Millisecond, ReadTimeout: 5 * time.Second,
		Now:      func() time.Time { return *e.now.Load() },
		Registry: e.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// setPolicy writes the policy file; policy.Current notices the new size or
// modification time (the mtime is moved forward so that a rewrite within
// the file system's timestamp granularity is still seen).
func (e *env) setPolicy(y string) {
	e.t.Helper()
	if err := os.WriteFile(e.path, []byte(y), 0o644); err != nil {
		e.t.Fatal(err)
	}
	mt := time.Now().Add(time.Duration(e.offset+1) * time.Second)
	e.offset++
	if err := os.Chtimes(e.path, mt, mt); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) setNow(t time.Time) { t = t.UTC(); e.now.Store(&t) }

// record writes allowed (or rejected) decisions into ClickHouse as the
// meter-consumer would (chsink: raw and rollups), one batch per call.
func (e *env) record(at time.Time, key, scope, tier string, cost uint64, n int, allowed bool) {
	e.t.Helper()
	var recs []chsink.Record
	for i := 0; i < n; i++ {
		e.offset++
		recs = append(recs, chsink.Record{Offset: e.offset, Event: metering.Event{
			EventID: fmt.Sprintf("ev-%d", e.offset), TS: at.UnixMilli(), Key: key, Scope: scope, Tier: tier,
			Cost: cost, Allowed: allowed, Source: "shared", Policy: tier, Instance: "test",
		}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var p chsink.Progress
	for i := range p {
		p[i] = recs[0].Offset - 1
	}
	if err := e.sink.Write(ctx, 0, recs, e.offset, &p); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) pass() reconcile.Result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := e.rec.Pass(ctx)
	if err != nil {
		e.t.Fatalf("pass: %v", err)
	}
	return res
}

func (e *env) counterKey(key, quotaID string, p limits.Period) string {
	start, _ := p.Window(*e.now.Load())
	return limits.QuotaKey(e.prefix, key, quotaID, start)
}

// counter is the quota counter's value, -1 when absent.
func (e *env) counter(key, quotaID string, p limits.Period) int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := e.rdb.Get(ctx, e.counterKey(key, quotaID, p)).Int64()
	if err == redis.Nil {
		return -1
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return v
}

func (e *env) resolve(key, scope, tier string) limits.Resolved {
	e.t.Helper()
	pol, err := e.pol.Get()
	if err != nil {
		e.t.Fatal(err)
	}
	res, err := pol.Resolve(key, scope, tier)
	if err != nil {
		e.t.Fatal(err)
	}
	return res
}

// take is one decision of the limiter's own bucket script (redisstore), on
// the real clock: what the next /check would see.
func (e *env) take(store *redisstore.Store, key, scope, tier string, cost int64) bool {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := store.Take(ctx, key, scope, e.resolve(key, scope, tier).Limit, cost)
	if err != nil {
		e.t.Fatal(err)
	}
	return v.Allowed
}

func newClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second,
		WriteTimeout: 2 * time.Second, ContextTimeoutEnabled: true})
}

// A generous bucket, so that only the quota ever rejects.
const monthlyPolicy = `
version: 1
default_tier: free
tiers:
  free: { rate: 100000, burst: 100000 }
  pro:  { rate: 100000, burst: 100000, quota: { limit: 100, period: month } }
  big:  { rate: 100000, burst: 100000, quota: { limit: 1000, period: month } }
keys: { acct_pro: pro, acct_free: free }
`

// spendAndRecord spends cost×n through the bucket script and records the
// same decisions in ClickHouse: the state just before Redis is lost.
func (e *env) spendAndRecord(store *redisstore.Store, key, scope, tier string, cost int64, n int) {
	e.t.Helper()
	for i := 0; i < n; i++ {
		if !e.take(store, key, scope, tier, cost) {
			e.t.Fatalf("setup: decision %d of %s was rejected", i, key)
		}
	}
	e.record(time.Now(), key, scope, tier, uint64(cost), n, true)
}

// exactlyAllowed asserts that the next decisions of cost 1 allow exactly
// want and then reject: the remaining quota the limiter sees.
func (e *env) exactlyAllowed(store *redisstore.Store, key, scope, tier string, want int) {
	e.t.Helper()
	for i := 0; i < want; i++ {
		if !e.take(store, key, scope, tier, 1) {
			e.t.Fatalf("decision %d of %s rejected; want %d allowed (the true remaining quota)", i+1, key, want)
		}
	}
	if e.take(store, key, scope, tier, 1) {
		e.t.Fatalf("decision %d of %s allowed; the true remaining quota is %d", want+1, key, want)
	}
}

func TestRestoresQuotaAfterRedisRestartsEmpty(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(r.Addr())
	defer rdb.Close()
	e := newEnv(t, rdb, monthlyPolicy, nil)
	store := redisstore.New(rdb, e.prefix)

	e.spendAndRecord(store, "acct_pro", "api:search", "pro", 6, 10) // 60 of 100
	if got := e.counter("acct_pro", "tier:pro", limits.PeriodMonth); got != 60 {
		t.Fatalf("counter before the restart = %d, want 60", got)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := e.counter("acct_pro", "tier:pro", limits.PeriodMonth); got != -1 {
		t.Fatalf("counter after the restart = %d, want absent", got)
	}
	res := e.pass()
	if res.Raised != 1 || res.Largest != 60 || res.Counters != 1 {
		t.Fatalf("pass = %+v, want one counter raised by 60", res)
	}
	if got := value(e.rec.Metrics().Largest); got != 60 {
		t.Errorf("meter_quota_largest_correction = %v, want 60", got)
	}
	// The next decisions see limit − recorded = 40, not a fresh 100.
	e.exactlyAllowed(store, "acct_pro", "api:search", "pro", 40)
}

func TestRestoresEvictedQuotaKeyWithTheBucketScriptsTTL(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(r.Addr())
	defer rdb.Close()
	e := newEnv(t, rdb, monthlyPolicy, nil)
	store := redisstore.New(rdb, e.prefix)
	e.spendAndRecord(store, "acct_pro", "api:search", "pro", 5, 5) // 25 of 100

	key := e.counterKey("acct_pro", "tier:pro", limits.PeriodMonth)
	ctx := context.Background()
	scriptExpiry, err := rdb.PExpireTime(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, key).Err(); err != nil { // what an eviction does
		t.Fatal(err)
	}
	if res := e.pass(); res.Raised != 1 || res.Largest != 25 {
		t.Fatalf("pass = %+v, want one counter raised by 25", res)
	}
	got, err := rdb.PExpireTime(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	_, end := limits.PeriodMonth.Window(*e.now.Load())
	if got != scriptExpiry || got != time.Duration(limits.QuotaKeyExpiry(end).UnixMilli())*time.Millisecond {
		t.Errorf("expiry after the raise = %v, the bucket script's = %v", got, scriptExpiry)
	}
	e.exactlyAllowed(store, "acct_pro", "api:search", "pro", 75)
}

func TestNeverLowersACounterAheadOfTheRecord(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(r.Addr())
	defer rdb.Close()
	e := newEnv(t, rdb, monthlyPolicy, nil)
	store := redisstore.New(rdb, e.prefix)
	e.spendAndRecord(store, "acct_pro", "api:search", "pro", 10, 3) // 30 recorded
	for i := 0; i < 5; i++ {                                        // 50 more spent, still in flight to ClickHouse
		if !e.take(store, "acct_pro", "api:search", "pro", 10) {
			t.Fatal("setup: rejected")
		}
	}
	before, _ := rdb.PExpireTime(context.Background(), e.counterKey("acct_pro", "tier:pro", limits.PeriodMonth)).Result()
	res := e.pass()
	if res.Raised != 0 || res.Counters != 1 {
		t.Fatalf("pass = %+v, want the counter compared and left alone", res)
	}
	if got := e.counter("acct_pro", "tier:pro", limits.PeriodMonth); got != 80 {
		t.Fatalf("counter = %d, want 80 (never lowered to the record's 30)", got)
	}
	after, _ := rdb.PExpireTime(context.Background(), e.counterKey("acct_pro", "tier:pro", limits.PeriodMonth)).Result()
	if after != before {
		t.Errorf("expiry changed from %v to %v on a no-op", before, after)
	}
	if got := value(e.rec.Metrics().Reconciled.WithLabelValues("unchanged")); got != 1 {
		t.Errorf(`meter_quota_reconciled_total{result="unchanged"} = %v, want 1`, got)
	}
}

func TestNoOpForKeysWithoutAQuota(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(r.Addr())
	defer rdb.Close()
	e := newEnv(t, rdb, monthlyPolicy, nil)
	e.record(time.Now(), "acct_free", "api:search", "free", 3, 20, true)
	e.record(time.Now(), "acct_free", "api:other", "free", 1, 5, false)
	res := e.pass()
	if res.Counters != 0 || res.Raised != 0 || res.NoQuotaRow != 2 {
		t.Fatalf("pass = %+v, want nothing compared and 2 rows without a quota", res)
	}
	if n, err := rdb.DBSize(context.Background()).Result(); err != nil || n != 0 {
		t.Fatalf("Redis holds %d keys (%v), want none touched", n, err)
	}

	// A policy without any quota does not even read ClickHouse.
	e.setPolicy("version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 10, burst: 10 }\n")
	if res := e.pass(); res.Counters != 0 {
		t.Fatalf("pass = %+v", res)
	}
	if n, _ := rdb.DBSize(context.Background()).Result(); n != 0 {
		t.Fatalf("Redis holds %d keys, want none", n)
	}
}

// Rollups are per (key, scope, tier); counters are per (key, QuotaID). A
// scope-specific rule with its own quota and a dry-run rule are attributed
// the way the limiter counts them.
func TestAttributesScopesToTheirQuotaCounters(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(r.Addr())
	defer rdb.Close()
	e := newEnv(t, rdb, `
version: 1
default_tier: pro
tiers:
  pro: { rate: 1000, burst: 1000, quota: { limit: 100, period: month } }
rules:
  - name: exports
    tier: pro
    scope: "api:export"
    quota: { limit: 10, period: day }
  - name: trial
    scope: "api:beta"
    dry_run: true
`, nil)
	e.record(time.Now(), "k", "api:search", "pro", 2, 10, true) // tier:pro
	e.record(time.Now(), "k", "api:list", "pro", 1, 7, true)    // tier:pro
	e.record(time.Now(), "k", "api:export", "pro", 3, 2, true)  // rule:exports
	e.record(time.Now(), "k", "api:beta", "pro", 50, 1, true)   // dry run: tier:pro's counter, not counted
	res := e.pass()
	if res.Counters != 2 || res.Raised != 2 {
		t.Fatalf("pass = %+v, want 2 counters raised", res)
	}
	if got := e.counter("k", "tier:pro", limits.PeriodMonth); got != 27 {
		t.Errorf("tier:pro = %d, want 27", got)
	}
	if got := e.counter("k", "rule:exports", limits.PeriodDay); got != 6 {
		t.Errorf("rule:exports = %d, want 6", got)
	}
}

// The clock is the test's: the windows of hour, day and month quotas all
// turn over at the start of a month (two months from today, so that the
// counters' expiry is in the future for the real Redis clock).
func TestPeriodsAcrossABoundary(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(r.Addr())
	defer rdb.Close()
	e := newEnv(t, rdb, `
version: 1
default_tier: hourly
tiers:
  hourly:  { rate: 1000, burst: 1000, quota: { limit: 1000, period: hour } }
  daily:   { rate: 1000, burst: 1000, quota: { limit: 1000, period: day } }
  monthly: { rate: 1000, burst: 1000, quota: { limit: 1000, period: month } }
`, nil)
	now := time.Now().UTC()
	boundary := time.Date(now.Year(), now.Month()+2, 1, 0, 0, 0, 0, time.UTC)
	tiers := []struct {
		tier   string
		period limits.Period
		before int64 // recorded in the window that ends at the boundary
	}{
		{"hourly", limits.PeriodHour, 7},
		{"daily", limits.PeriodDay, 7 + 13},
		{"monthly", limits.PeriodMonth, 7 + 13 + 11},
	}
	for _, tc := range tiers {
		key := "k_" + tc.tier
		e.record(boundary.Add(-10*time.Minute), key, "s", tc.tier, 7, 1, true)       // this hour
		e.record(boundary.Add(-110*time.Minute), key, "s", tc.tier, 13, 1, true)     // this day, an earlier hour
		e.record(boundary.Add(-(15*24+3)*time.Hour), key, "s", tc.tier, 11, 1, true) // this month, an earlier day
		e.record(boundary.Add(-10*time.Minute), key, "s", tc.tier, 5, 1, false)      // rejected: spends nothing
	}
	e.setNow(boundary.Add(-30 * time.Second))
	if res := e.pass(); res.Raised != 3 {
		t.Fatalf("pass before the boundary = %+v, want 3 raised", res)
	}
	old := map[string]string{}
	for _, tc := range tiers {
		key := "k_" + tc.tier
		if got := e.counter(key, "tier:"+tc.tier, tc.period); got != tc.before {
			t.Errorf("%s before the boundary = %d, want %d", tc.tier, got, tc.before)
		}
		old[tc.tier] = e.counterKey(key, "tier:"+tc.tier, tc.period)
	}

	for _, tc := range tiers {
		e.record(boundary.Add(10*time.Second), "k_"+tc.tier, "s", tc.tier, 3, 1, true)
	}
	e.setNow(boundary.Add(30 * time.Second))
	if res := e.pass(); res.Raised != 3 {
		t.Fatalf("pass after the boundary = %+v, want 3 raised", res)
	}
	for _, tc := range tiers {
		key := "k_" + tc.tier
		if got := e.counter(key, "tier:"+tc.tier, tc.period); got != 3 {
			t.Errorf("%s after the boundary = %d, want 3 (a new window)", tc.tier, got)
		}
		if nk := e.counterKey(key, "tier:"+tc.tier, tc.period); nk == old[tc.tier] {
			t.Errorf("%s: the new window has the old counter %s", tc.tier, nk)
		}
		v, err := rdb.Get(context.Background(), old[tc.tier]).Int64()
		if err != nil || v != tc.before {
			t.Errorf("%s: the previous window's counter = %d, %v; want %d, untouched", tc.tier, v, err, tc.before)
		}
	}
}

// A key moves from pro to big in the middle of the month (the keys map
// changes): the limiter counts its later decisions against tier:big, so the
// reconciler attributes by the tier each decision was made under.
func TestTierChangeMidPeriod(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(r.Addr())
	defer rdb.Close()
	e := newEnv(t, rdb, monthlyPolicy, nil)
	store := redisstore.New(rdb, e.prefix)
	// The requests name no tier; the events carry the tier they resolved to.
	for i := 0; i < 3; i++ {
		if !e.take(store, "acct_pro", "api:search", "", 10) {
			t.Fatal("setup: rejected")
		}
	}
	e.record(time.Now(), "acct_pro", "api:search", "pro", 10, 3, true)
	e.setPolicy(strings.Replace(monthlyPolicy, "acct_pro: pro", "acct_pro: big", 1))
	if got := e.resolve("acct_pro", "api:search", "").QuotaID; got != "tier:big" {
		t.Fatalf("after the change the key resolves to %s", got)
	}
	for i := 0; i < 20; i++ {
		if !e.take(store, "acct_pro", "api:search", "", 10) {
			t.Fatal("setup: rejected")
		}
	}
	e.record(time.Now(), "acct_pro", "api:search", "big", 10, 20, true)

	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	if res := e.pass(); res.Raised != 2 {
		t.Fatalf("pass = %+v, want both counters raised", res)
	}
	if got := e.counter("acct_pro", "tier:pro", limits.PeriodMonth); got != 30 {
		t.Errorf("tier:pro = %d, want 30", got)
	}
	if got := e.counter("acct_pro", "tier:big", limits.PeriodMonth); got != 200 {
		t.Errorf("tier:big = %d, want 200 (the pro spend is not the big quota's)", got)
	}
	e.exactlyAllowed(store, "acct_pro", "api:search", "", 800)
}

func TestRedisClusterCountersAreRaised(t *testing.T) {
	c := testenv.StartCluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), DialTimeout: 2 * time.Second,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, ContextTimeoutEnabled: true})
	defer rdb.Close()
	e := newEnv(t, rdb, monthlyPolicy, nil)
	e.setPolicy(strings.Replace(monthlyPolicy, "default_tier: free", "default_tier: pro", 1))
	for i := 0; i < 30; i++ {
		e.record(time.Now(), fmt.Sprintf("acct_%02d", i), "s", "pro", uint64(i+1), 1, true)
	}
	res := e.pass()
	if res.Counters != 30 || res.Raised != 30 || res.Failed != 0 {
		t.Fatalf("pass = %+v, want 30 counters raised on the cluster", res)
	}
	for i := 0; i < 30; i++ {
		if got := e.counter(fmt.Sprintf("acct_%02d", i), "tier:pro", limits.PeriodMonth); got != int64(i+1) {
			t.Errorf("acct_%02d = %d, want %d", i, got, i+1)
		}
	}
}

// ClickHouse stops: passes fail, are counted and retried, Run keeps going,
// readiness says why; when ClickHouse is back the counter is restored.
func TestSurvivesClickHouseDown(t *testing.T) {
	own := testenv.StartClickHouse(t) // its own server: this test stops it
	conn := own.Conn(t)
	r := testenv.StartRedis(t)
	rdb := newClient(r.Addr())
	defer rdb.Close()
	e := newEnv(t, rdb, monthlyPolicy, conn)
	e.record(time.Now(), "acct_pro", "s", "pro", 9, 1, true)
	own.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.rec.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(testenv.Timeout(30 * time.Second)):
			t.Error("Run did not return within 30 s of its context ending")
		}
	}()

	// Waits for three failed passes (Run retries after 200 ms, the interval
	// here); 60 s is for a starved machine, not the expected time.
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		if ok, _ := e.rec.Ready(); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never unready while ClickHouse was down")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ok, why := e.rec.Ready(); ok || !strings.Contains(why, "failed") {
		t.Errorf("Ready = %v, %q", ok, why)
	}
	if n := value(e.rec.Metrics().Errors.WithLabelValues("clickhouse")); n < 3 {
		t.Errorf(`meter_quota_reconcile_errors_total{stage="clickhouse"} = %v, want ≥ 3`, n)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned while ClickHouse was down: %v", err)
	default:
	}

	if err := own.Start(); err != nil {
		t.Fatal(err)
	}
	// Waits for the next pass after ClickHouse answers again (the retry
	// backoff is at most the 200 ms interval).
	deadline = time.Now().Add(testenv.Timeout(60 * time.Second))
	for e.counter("acct_pro", "tier:pro", limits.PeriodMonth) != 9 {
		if time.Now().After(deadline) {
			t.Fatal("counter not restored within 60 s of ClickHouse coming back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	deadline = time.Now().Add(testenv.Timeout(30 * time.Second))
	for {
		if ok, _ := e.rec.Ready(); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still unready after a successful pass")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Redis stops: the pass fails per key under its deadline, is counted, and
// Run goes on.
func TestSurvivesRedisDown(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := newClient(r.Addr())
	defer rdb.Close()
	e := newEnv(t, rdb, monthlyPolicy, nil)
	e.record(time.Now(), "acct_pro", "s", "pro", 4, 1, true)
	r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.rec.Pass(ctx); err == nil || !strings.Contains(err.Error(), "acct_pro") {
		t.Fatalf("pass with Redis down: %v, want an error naming the key", err)
	}
	if n := value(e.rec.Metrics().Errors.WithLabelValues("redis")); n != 1 {
		t.Errorf(`errors{stage="redis"} = %v, want 1`, n)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	if res := e.pass(); res.Raised != 1 {
		t.Fatalf("pass after Redis is back = %+v", res)
	}
}

// value is the current value of one counter or gauge.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}
