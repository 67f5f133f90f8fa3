package preview_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog/preview"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const candidate = `
version: 1
default_tier: free
tiers:
  free: { rate: 0.001, burst: 2 }
`

// record inserts n allowed shared decisions of key, one a millisecond
// from at, into decisions_raw.
func record(t testing.TB, conn driver.Conn, db string, at time.Time, keyOf func(i int) string, n int) {
	t.Helper()
	ctx := context.Background()
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".decisions_raw (event_id, ts, event_time, key, scope, tier, cost, allowed, source, remaining, limit_value, policy, dry_run, warning, instance, kafka_partition, kafka_offset)")
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		ts := at.Add(time.Duration(i) * time.Millisecond)
		if err := batch.Append(fmt.Sprintf("e%d", i), uint64(ts.UnixMilli()), ts.Truncate(time.Second), keyOf(i), "api", "free",
			uint64(1), uint8(1), "shared", int64(0), int64(20), "free", uint8(0), uint8(0), "lim-1", uint32(0), uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
}

func setup(t testing.TB) (driver.Conn, string) {
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)
	conn := ch.Conn(t)
	if err := schema.Apply(context.Background(), conn, db); err != nil {
		t.Fatal(err)
	}
	return conn, db
}

// TestPreviewStaysWithinItsRowBudget: a window holding more rows than the
// budget is sampled by key, and a hot key that alone exceeds the budget
// stops the replay at it, said as Capped with the instant reached.
func TestPreviewStaysWithinItsRowBudget(t *testing.T) {
	conn, db := setup(t)
	ctx := context.Background()
	// A key the half-sample keeps (rawscan samples by cityHash64(key)),
	// asked of the server rather than assumed.
	hot := ""
	for i := 0; hot == "" && i < 100; i++ {
		k := fmt.Sprintf("hot%d", i)
		var in uint8
		if err := conn.QueryRow(ctx, "SELECT cityHash64(?) % 1000000 < 500000", k).Scan(&in); err != nil {
			t.Fatal(err)
		}
		if in == 1 {
			hot = k
		}
	}
	now := time.Now().UTC()
	start := now.Add(-10 * time.Minute)
	record(t, conn, db, start, func(int) string { return hot }, 200)
	p, err := policy.Parse([]byte(candidate))
	if err != nil {
		t.Fatal(err)
	}
	res, err := preview.Run(ctx, conn, preview.Config{Database: db, MaxRows: 100}, policy.NewWithOverrides(p, nil, nil), now)
	if err != nil {
		t.Fatal(err)
	}
	if res.Recorded != 200 || res.Sample != 0.5 || !res.Capped || res.Decisions != 100 {
		t.Fatalf("%+v: want 200 recorded, half the keys sampled, capped at 100 decisions", res)
	}
	// The 100th decision of the key, 99 ms after the first; the 2 first
	// are allowed by the candidate's burst of 2.
	if want := start.Add(99 * time.Millisecond).Truncate(time.Millisecond); !res.CoveredTo.Equal(want) {
		t.Fatalf("covered to %s, want %s", res.CoveredTo, want)
	}
	if res.NewlyRejected != 98 || len(res.TopKeys) != 1 || res.TopKeys[0].Key != hot {
		t.Fatalf("%+v", res)
	}
	// Within the budget: every row, not capped.
	res, err = preview.Run(ctx, conn, preview.Config{Database: db}, policy.NewWithOverrides(p, nil, nil), now)
	if err != nil || res.Capped || res.Sample != 1 || res.Decisions != 200 || res.NewlyRejected != 198 {
		t.Fatalf("%+v %v", res, err)
	}
}

// BenchmarkPreview is a push's preview with the default row budget over
// an hour holding 1,000,000 decisions of 10,000 keys: what a push waits.
func BenchmarkPreview(b *testing.B) {
	conn, db := setup(b)
	now := time.Now().UTC()
	const n = 1_000_000
	record(b, conn, db, now.Add(-time.Hour+time.Minute), func(i int) string { return fmt.Sprintf("acct_%d", (i*7919)%10000) }, n)
	p, err := policy.Parse([]byte(candidate))
	if err != nil {
		b.Fatal(err)
	}
	cand := policy.NewWithOverrides(p, nil, nil)
	b.ResetTimer()
	var rows int64
	for range b.N {
		res, err := preview.Run(context.Background(), conn, preview.Config{Database: db}, cand, now)
		if err != nil {
			b.Fatal(err)
		}
		rows += res.Decisions
	}
	b.ReportMetric(float64(rows)/float64(b.N), "rows/op")
	b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
}
