package chstore_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/ratewarden/ratewarden/metering/billing"
	"github.com/ratewarden/ratewarden/metering/billing/chstore"
)

// benchRows is the raw rows of the benchmark's key in its month:
// BILLING_BENCH_RAW_ROWS, default 10⁷ (the target is 10⁸: run it
// with TMPDIR on a disk with ~10 GB free, not a tmpfs).
func benchRows(b *testing.B) int {
	n := 10_000_000
	if s := os.Getenv("BILLING_BENCH_RAW_ROWS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1000 {
			b.Fatalf("BILLING_BENCH_RAW_ROWS=%q: want an integer ≥ 1000", s)
		}
		n = v
	}
	return n
}

// BenchmarkStatement measures, for one key with benchRows raw rows in
// March 2026 (over 3 scopes), a statement's latency (p50, p99, from the
// rollups, in Asia/Kolkata so both edges are read from usage_minute) and
// one verify (the raw record recomputed), each printed beside its goal:
// statement p99 ≤ 1 s, verify ≤ 60 s. The rows are generated inside
// ClickHouse (INSERT … SELECT from numbers()) and the rollups summed from
// them, as the meter-consumer would have written them.
func BenchmarkStatement(b *testing.B) {
	benchOnce.Do(func() { benchSetup(b) })
	if benchErr != "" {
		b.Fatal(benchErr)
	}
	ctx := context.Background()
	st, p, v := benchSt, benchPeriod, benchVerified
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t := time.Now()
		s, err := st.Get(ctx, "acct_big", p, false)
		if err != nil || s.Totals != v.Totals {
			b.Fatalf("statement: %v %+v", err, s.Totals)
		}
		lat = append(lat, time.Since(t))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p99 := lat[len(lat)*99/100]
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
	b.ReportMetric(benchVerify.Seconds(), "verify-s")
	b.Logf("statement: p50 %s, p99 %s over %d (goal p99 ≤ 1 s); verify %s (goal ≤ 60 s)", lat[len(lat)/2].Round(time.Microsecond), p99.Round(time.Microsecond), len(lat), benchVerify.Round(time.Millisecond))
}

// The benchmark's data, written once for every b.N the benchmark is run
// with.
var (
	benchOnce     sync.Once
	benchErr      string
	benchSt       *billing.Statements
	benchPeriod   billing.Period
	benchVerified billing.Statement
	benchVerify   time.Duration
)

func benchSetup(b *testing.B) {
	fail := func(err error) { benchErr = err.Error() }
	n := benchRows(b)
	// Its own connection, with a read timeout for INSERTs of minutes: the
	// data outlives the first run of b (the server goes at TestMain's end).
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{ch.Addr()}, Auth: clickhouse.Auth{Database: "default", Username: "default"},
		DialTimeout: 5 * time.Second, ReadTimeout: 30 * time.Minute, MaxOpenConns: 4})
	if err != nil {
		fail(err)
		return
	}
	const db = "bench_statement"
	ctx := context.Background()
	pl := &pipeline{conn: conn, db: db}
	if err := applySchema(ctx, pl); err != nil {
		fail(err)
		return
	}
	start := time.Date(2026, 2, 28, 12, 0, 0, 0, time.UTC) // a little of February in Kolkata's March
	span := int64(32 * 24 * 3600 * 1000)
	t0 := time.Now()
	raw := "INSERT INTO " + db + ".decisions_raw (event_id, ts, event_time, key, scope, tier, cost, allowed, source, remaining, limit_value, policy, dry_run, warning, instance, kafka_partition, kafka_offset)" +
		" SELECT toString(number), ts, toDateTime(intDiv(ts, 1000)), 'acct_big', concat('api:s', toString(number % 3)), 'pro', 1 + number % 5, number % 7 != 0, 'shared', 0, 100, 'p', 0, 0, 'i', 0, number" +
		" FROM (SELECT number, " + strconv.FormatInt(start.UnixMilli(), 10) + " + intDiv(number * " + strconv.FormatInt(span, 10) + ", " + strconv.Itoa(n) + ") AS ts FROM system.numbers LIMIT " + strconv.Itoa(n) + ")"
	if err := conn.Exec(ctx, raw); err != nil {
		fail(err)
		return
	}
	for _, r := range []struct{ table, trunc string }{{"usage_minute", "toStartOfMinute"}, {"usage_hour", "toStartOfHour"}} {
		q := "INSERT INTO " + db + "." + r.table + " (key, scope, tier, start, requests, allowed, rejected, cost, warnings, batches, kafka_partition, kafka_offset)" +
			" SELECT key, scope, tier, " + r.trunc + "(event_time) AS b, count(), countIf(allowed = 1), countIf(allowed = 0), sumIf(cost, allowed = 1), 0, 0, 0, 0" +
			" FROM " + db + ".decisions_raw GROUP BY key, scope, tier, b"
		if err := conn.Exec(ctx, q); err != nil {
			fail(err)
			return
		}
	}
	b.Logf("%d raw rows of acct_big and their rollups written in %s", n, time.Since(t0).Round(time.Millisecond))

	store, err := chstore.New(conn, db)
	if err != nil {
		fail(err)
		return
	}
	benchSt = &billing.Statements{Store: store, Now: func() time.Time { return time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC) }} // closing: computed every time
	if benchPeriod, err = billing.ParsePeriod("2026-03", "Asia/Kolkata"); err != nil {
		fail(err)
		return
	}
	t1 := time.Now()
	benchVerified, err = benchSt.Get(ctx, "acct_big", benchPeriod, true)
	benchVerify = time.Since(t1)
	if err != nil || !*benchVerified.Verified {
		fail(fmt.Errorf("verify: %v %+v", err, benchVerified))
		return
	}
	b.Logf("verify: %s for %d requests in the period (goal ≤ 60 s)", benchVerify.Round(time.Millisecond), benchVerified.Raw.Requests)
}
