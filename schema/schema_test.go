package schema_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

var (
	ch      *testenv.ClickHouse
	cluster testenv.SharedClickHouseCluster
)

func TestMain(m *testing.M) {
	code := testenv.MainWithClickHouse(m, &ch)
	cluster.Close()
	os.Exit(code)
}

func TestMigrationsAreNumberedAndSplit(t *testing.T) {
	migs, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(migs) < 2 {
		t.Fatalf("want at least 2 migrations, got %d", len(migs))
	}
	for i, m := range migs {
		if i > 0 && m.Version <= migs[i-1].Version {
			t.Fatalf("%s not after %s", m.Name, migs[i-1].Name)
		}
		for _, s := range m.Statements {
			if strings.HasPrefix(s, "--") || strings.TrimSpace(s) == "" {
				t.Fatalf("%s: empty or comment-only statement %q", m.Name, s)
			}
			if !strings.Contains(s, "${DB}.") {
				t.Fatalf("%s: statement does not name its table as ${DB}.x: %q", m.Name, s)
			}
		}
	}
}

// snapshot describes everything Apply could change: tables, their columns
// and engines, and the recorded migrations.
func snapshot(t *testing.T, db string) string {
	t.Helper()
	return snapshotOn(t, ch, db)
}

func snapshotOn(t *testing.T, server *testenv.ClickHouse, db string) string {
	t.Helper()
	conn := server.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	rows, err := conn.Query(ctx, "SELECT name, engine, create_table_query FROM system.tables WHERE database = ? ORDER BY name", db)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n, e, q string
		if err := rows.Scan(&n, &e, &q); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %s %s\n", n, e, q)
	}
	rows.Close()
	rows, err = conn.Query(ctx, "SELECT table, name, type FROM system.columns WHERE database = ? ORDER BY table, name", db)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var tb, n, ty string
		if err := rows.Scan(&tb, &n, &ty); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s.%s %s\n", tb, n, ty)
	}
	rows.Close()
	rows, err = conn.Query(ctx, "SELECT version, name FROM "+db+".schema_migrations ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var v uint32
		var n string
		if err := rows.Scan(&v, &n); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "migration %d %s\n", v, n)
	}
	rows.Close()
	return b.String()
}

func TestApplyTwiceChangesNothing(t *testing.T) {
	db := ch.Database(t)
	conn := ch.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatalf("first apply: %v", err)
	}
	first := snapshot(t, db)
	for _, table := range []string{"decisions_raw", "usage_minute", "usage_hour", "usage_day", "shadow_hour", "schema_migrations"} {
		if !strings.Contains(first, table+" ") {
			t.Errorf("table %s missing after Apply:\n%s", table, first)
		}
	}
	v, err := schema.Version(ctx, conn, db)
	if err != nil {
		t.Fatal(err)
	}
	if v != schema.Latest() || v == 0 {
		t.Fatalf("recorded version %d, want %d", v, schema.Latest())
	}
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatalf("second apply: %v", err)
	}
	if second := snapshot(t, db); second != first {
		t.Fatalf("second Apply changed the schema:\nbefore:\n%s\nafter:\n%s", first, second)
	}
}

// TestApplyAtOnce: processes that start together (two consumers of one
// deployment) apply the migrations at the same time. Each checks that a
// column is missing before it adds it, so both may try to add it; the one
// that loses that race must still succeed, and the schema be the one a
// single Apply gives.
func TestApplyAtOnce(t *testing.T) {
	single := ch.Database(t)
	conn := ch.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := schema.Apply(ctx, conn, single); err != nil {
		t.Fatal(err)
	}
	want := strings.ReplaceAll(snapshot(t, single), single, "DB")
	for round := range 3 {
		db := ch.Database(t)
		errs := make(chan error, 4)
		for range cap(errs) {
			c := ch.Conn(t)
			go func() { errs <- schema.Apply(ctx, c, db) }()
		}
		for range cap(errs) {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: an Apply beside others failed: %v", round, err)
			}
		}
		if got := strings.ReplaceAll(snapshot(t, db), db, "DB"); columnsOf(got) != columnsOf(want) {
			t.Fatalf("round %d: applied at once:\n%s\nwant:\n%s", round, got, want)
		}
	}
}

// columnsOf is a snapshot without its recorded migrations, which a
// concurrent Apply may record more than once.
func columnsOf(snap string) string {
	var keep []string
	for _, l := range strings.Split(snap, "\n") {
		if !strings.HasPrefix(l, "migration ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func TestApplyRejectsBadDatabaseName(t *testing.T) {
	conn := ch.Conn(t)
	if err := schema.Apply(context.Background(), conn, "x; DROP DATABASE default"); err == nil {
		t.Fatal("Apply accepted a database name that is not an identifier")
	}
}

// The summing rollups keep markers (empty key) apart and sum only counters.
func TestRollupMarkersSurviveMerges(t *testing.T) {
	db := ch.Database(t)
	conn := ch.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	for i := 0; i < 3; i++ {
		b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".usage_minute (key, scope, tier, start, requests, allowed, rejected, cost, warnings, batches, kafka_partition, kafka_offset)")
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Append("k", "s", "free", start, uint64(2), uint64(1), uint64(1), uint64(5), uint64(0), uint64(0), uint32(0), uint64(0)); err != nil {
			t.Fatal(err)
		}
		if err := b.Append("", "", "", start, uint64(0), uint64(0), uint64(0), uint64(0), uint64(0), uint64(1), uint32(3), uint64(100*(i+1))); err != nil {
			t.Fatal(err)
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
	}
	if err := conn.Exec(ctx, "OPTIMIZE TABLE "+db+".usage_minute FINAL"); err != nil {
		t.Fatal(err)
	}
	var req, cost uint64
	if err := conn.QueryRow(ctx, "SELECT sum(requests), sum(cost) FROM "+db+".usage_minute WHERE key = ?", "k").Scan(&req, &cost); err != nil {
		t.Fatal(err)
	}
	if req != 6 || cost != 15 {
		t.Fatalf("sum(requests)=%d sum(cost)=%d, want 6 and 15", req, cost)
	}
	var maxOff uint64
	var markers uint64
	if err := conn.QueryRow(ctx, "SELECT max(kafka_offset), count() FROM "+db+".usage_minute WHERE key = '' AND kafka_partition = 3").Scan(&maxOff, &markers); err != nil {
		t.Fatal(err)
	}
	if maxOff != 300 || markers != 3 {
		t.Fatalf("markers after merge: max offset %d count %d, want 300 and 3", maxOff, markers)
	}
	var dataRows uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+db+".usage_minute WHERE key = 'k'").Scan(&dataRows); err != nil {
		t.Fatal(err)
	}
	if dataRows != 1 {
		t.Fatalf("data rows after OPTIMIZE FINAL: %d, want 1 (collapsed)", dataRows)
	}
}

// applyBelow creates db and runs the statements of every migration below
// version by hand, recording none: a database as an older release, or a
// crash mid-migration, left it.
func applyBelow(ctx context.Context, t *testing.T, conn driver.Conn, db string, version uint32) {
	t.Helper()
	migs, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+db); err != nil {
		t.Fatal(err)
	}
	for _, m := range migs {
		if m.Version >= version {
			break
		}
		for _, s := range m.Statements {
			if err := conn.Exec(ctx, strings.ReplaceAll(s, "${DB}", db)); err != nil {
				t.Fatalf("%s: %v", m.Name, err)
			}
		}
	}
}

// A crash after one ADD COLUMN of a migration and before its recording
// leaves the column in place: the re-run must skip it, not fail (18.16 has
// no ADD COLUMN IF NOT EXISTS).
func TestApplyResumesAfterAPartialAddColumnMigration(t *testing.T) {
	db := ch.Database(t)
	conn := ch.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	applyBelow(ctx, t, conn, db, 2) // 0001: decisions_raw
	if err := conn.Exec(ctx, "ALTER TABLE "+db+".decisions_raw ADD COLUMN domain String DEFAULT ''"); err != nil {
		t.Fatal(err)
	}
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatalf("Apply after a partial migration: %v", err)
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = ? AND table = 'decisions_raw' AND name IN ('domain', 'shadow', 'shadow_rejected')", db).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("decisions_raw has %d of the columns domain, shadow, shadow_rejected; want 3", n)
	}
}

// Rows written into decisions_raw before 0058 (every one a decision) read
// as decisions whose actual_cost is their cost when allowed, 0 when
// rejected; a settle written after it carries a negative actual_cost.
func TestRawRowsFromBeforeSettlesReadAsDecisions(t *testing.T) {
	db := ch.Database(t)
	conn := ch.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	applyBelow(ctx, t, conn, db, 58)
	insert := func(columns string, rows ...[]any) {
		t.Helper()
		b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".decisions_raw ("+columns+")")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if err := b.Append(r...); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
	}
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	old := "event_id, ts, event_time, key, cost, allowed, kafka_offset"
	insert(old, []any{"a", uint64(at.UnixMilli()), at, "k", uint64(5), uint8(1), uint64(1)},
		[]any{"b", uint64(at.UnixMilli()), at, "k", uint64(3), uint8(0), uint64(2)})
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	insert(old+", kind, reservation, estimate, actual, reserved_ts, actual_cost",
		[]any{"c", uint64(at.UnixMilli() + 60_000), at.Add(time.Minute), "k", uint64(0), uint8(1), uint64(3), "settle", "r", uint64(5), uint64(2), uint64(at.UnixMilli()), int64(-3)})
	var decisions, settles uint64
	var actual, allowedCost int64
	if err := conn.QueryRow(ctx, "SELECT countIf(kind = 'decision'), countIf(kind = 'settle'), sum(actual_cost), sumIf(actual_cost, event_id = 'a') FROM "+db+".decisions_raw").
		Scan(&decisions, &settles, &actual, &allowedCost); err != nil {
		t.Fatal(err)
	}
	if decisions != 2 || settles != 1 || allowedCost != 5 || actual != 5-3 {
		t.Fatalf("%d decisions, %d settles, actual cost %d (row a %d); want 2, 1, 2 and 5", decisions, settles, actual, allowedCost)
	}
}
