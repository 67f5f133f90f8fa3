package chsink_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/proccpu"
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

func records(from, n int, base time.Time) []chsink.Record {
	out := make([]chsink.Record, n)
	for i := range out {
		o := from + i
		out[i] = chsink.Record{Offset: int64(o), Event: metering.Event{
			EventID: fmt.Sprintf("e%09d", o), TS: base.UnixMilli() + int64(o), Key: fmt.Sprintf("k%03d", o%300),
			Scope: "s", Tier: "pro", Cost: 2, Allowed: o%2 == 0, Source: "shared", Policy: "p", Instance: "i",
		}}
	}
	return out
}

func setup(tb testing.TB) (*chsink.Sink, func(string) uint64) {
	s, conn, db := setupDB(tb)
	sum := func(table string) uint64 {
		var n uint64
		if err := conn.QueryRow(context.Background(), "SELECT sum(requests) FROM "+db+"."+table+" WHERE key != ''").Scan(&n); err != nil {
			tb.Fatal(err)
		}
		return n
	}
	return s, sum
}

// setupDB returns a sink on a fresh, migrated database, its connection and name.
func setupDB(tb testing.TB) (*chsink.Sink, driver.Conn, string) {
	conn := ch.Conn(tb)
	db := ch.Database(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := schema.Apply(ctx, conn, db); err != nil {
		tb.Fatal(err)
	}
	s, err := chsink.New(conn, db, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return s, conn, db
}

// A table that is behind gets only what it lacks; tables that are ahead
// get nothing again.
func TestWriteGivesEachTableOnlyWhatItLacks(t *testing.T) {
	s, sum := setup(t)
	ctx := context.Background()
	base := time.Date(2026, 5, 3, 0, 0, 0, 0, time.UTC)
	p, err := s.Progress(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if p.Resume() != 0 {
		t.Fatalf("empty tables resume at %d, want 0", p.Resume())
	}
	if err := s.Write(ctx, 2, records(0, 100, base), 99, &p); err != nil {
		t.Fatal(err)
	}
	// Pretend the minute table never got the first batch (a crash between
	// INSERTs), and replay both batches with a stale progress.
	stale := p
	stale[chsink.Minute] = -1
	recs := records(0, 200, base)
	if err := s.Write(ctx, 2, recs, 199, &stale); err != nil {
		t.Fatal(err)
	}
	if got := sum("usage_hour"); got != 200 {
		t.Fatalf("usage_hour = %d, want 200", got)
	}
	if got := sum("usage_minute"); got != 300 {
		t.Fatalf("usage_minute = %d, want 300 (the stale table got offsets 0..199 again, by design of this test)", got)
	}
	fresh, err := s.Progress(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	for tb, off := range fresh {
		if off != 199 {
			t.Fatalf("progress of table %d is %d, want 199", tb, off)
		}
	}
	// Other partitions are independent.
	if q, _ := s.Progress(ctx, 3); q.Resume() != 0 {
		t.Fatalf("partition 3 resumes at %d, want 0", q.Resume())
	}
	ids := 0
	if err := s.RecentIDs(ctx, 2, -1, func(string, int64, int64) { ids++ }); err != nil {
		t.Fatal(err)
	}
	if ids != 200 {
		t.Fatalf("RecentIDs gave %d ids, want 200", ids)
	}
}

func TestWriteRefusesABatchSpanningTwoMonths(t *testing.T) {
	s, _ := setup(t)
	recs := records(0, 2, time.Date(2026, 5, 31, 23, 59, 59, 999_000_000, time.UTC))
	var p chsink.Progress
	for i := range p {
		p[i] = -1
	}
	if err := s.Write(context.Background(), 0, recs, 1, &p); err == nil {
		t.Fatal("a batch spanning May and June was written")
	}
}

// BenchmarkWrite measures the sink alone: 50,000-event batches of one
// partition into ClickHouse (four INSERTs each).
func BenchmarkWrite(b *testing.B) {
	s, _ := setup(b)
	const batch = 50_000
	base := time.Date(2026, 5, 3, 0, 0, 0, 0, time.UTC)
	var p chsink.Progress
	for i := range p {
		p[i] = -1
	}
	all := make([][]chsink.Record, 0, b.N)
	for i := 0; i < b.N; i++ {
		all = append(all, records(i*batch, batch, base))
	}
	b.ResetTimer()
	start, cpu := time.Now(), proccpu.Self()
	for i := 0; i < b.N; i++ {
		if err := s.Write(context.Background(), 0, all[i], int64((i+1)*batch-1), &p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "events/s")
	// The sink's own CPU (this process; ClickHouse runs apart).
	b.ReportMetric((proccpu.Self()-cpu).Seconds()*1e6/float64(b.N*batch), "cpu-s/Mevent")
}

// Shadow verdicts and the Envoy domain reach decisions_raw, and shadow_hour
// counts them per shadow limit and key; a replay does not count them twice.
func TestWriteRecordsShadowVerdictsAndDomain(t *testing.T) {
	s, conn, db := setupDB(t)
	ctx := context.Background()
	base := time.Date(2026, 5, 3, 10, 0, 0, 0, time.UTC)
	recs := records(0, 10, base)
	for i := range recs {
		e := &recs[i].Event
		if i < 6 {
			e.Shadow, e.ShadowRejected = "tight", i%3 == 0 // offsets 0 and 3 would be rejected
		}
		if i < 4 {
			e.ShadowRevision = 7 // the candidate of rollout 7 gave the verdict
		}
		if i == 9 {
			e.Domain = "edge"
		}
	}
	p, err := s.Progress(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, 1, recs, 9, &p); err != nil {
		t.Fatal(err)
	}
	// The same messages again after a restart: progress read back from
	// ClickHouse, so nothing is written twice.
	again, err := s.Progress(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, 1, recs, 9, &again); err != nil {
		t.Fatal(err)
	}
	var dec, would, rej uint64
	if err := conn.QueryRow(ctx, "SELECT sum(decisions), sum(would_reject), sum(rejected) FROM "+db+".shadow_hour WHERE key != '' AND shadow = 'tight'").Scan(&dec, &would, &rej); err != nil {
		t.Fatal(err)
	}
	// Offsets 0..5 carry the verdict; 0 and 3 would be rejected; the odd
	// offsets 1, 3, 5 were rejected by the enforced limit.
	if dec != 6 || would != 2 || rej != 3 {
		t.Fatalf("shadow_hour decisions/would_reject/rejected = %d/%d/%d, want 6/2/3", dec, would, rej)
	}
	// Rollout 7: offsets 0..3; 0 and 3 would be rejected, 1 and 3 were:
	// offset 0 alone is newly rejected (allowed, and the candidate denies).
	var newly uint64
	if err := conn.QueryRow(ctx, "SELECT sum(decisions), sum(newly_rejected), sum(would_reject), sum(rejected) FROM "+db+".rollout_shadow WHERE rollout = 7").Scan(&dec, &newly, &would, &rej); err != nil {
		t.Fatal(err)
	}
	if dec != 4 || newly != 1 || would != 2 || rej != 2 {
		t.Fatalf("rollout_shadow decisions/newly_rejected/would_reject/rejected = %d/%d/%d/%d, want 4/1/2/2", dec, newly, would, rej)
	}
	var n, nDomain, nRollout uint64
	if err := conn.QueryRow(ctx, "SELECT countIf(shadow = 'tight' AND shadow_rejected = 1), countIf(domain = 'edge'), countIf(shadow_revision = 7) FROM "+db+".decisions_raw WHERE kafka_partition = 1 AND kafka_offset <= 9").Scan(&n, &nDomain, &nRollout); err != nil {
		t.Fatal(err)
	}
	if n != 2 || nDomain != 1 || nRollout != 4 {
		t.Fatalf("decisions_raw: %d rows shadow-rejected by tight, %d with domain edge, %d of rollout 7; want 2, 1 and 4", n, nDomain, nRollout)
	}
	fresh, err := s.Progress(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if fresh[chsink.ShadowHour] != 9 || fresh[chsink.RolloutShadow] != 9 {
		t.Fatalf("shadow_hour, rollout_shadow progress = %d, %d, want 9", fresh[chsink.ShadowHour], fresh[chsink.RolloutShadow])
	}
}

// shadow_hour came with a later migration: on an upgraded consumer it has no
// marker yet, and must not send the resume point back to the topic's start.
func TestATableAddedLaterDoesNotRewindTheResumePoint(t *testing.T) {
	p := chsink.Progress{500, 500, 500, 500, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}
	if got := p.Resume(); got != 501 {
		t.Fatalf("resume with shadow_hour never written = %d, want 501", got)
	}
	p[chsink.ShadowHour] = 400
	if got := p.Resume(); got != 401 {
		t.Fatalf("resume with shadow_hour at 400 = %d, want 401", got)
	}
	if got := (chsink.Progress{-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}).Resume(); got != 0 {
		t.Fatalf("resume of empty tables = %d, want 0", got)
	}
}

// policy_revision and decided_us reach decisions_raw as given, and as NULL
// for an event without them (file mode, a local decision).
func TestWriteRecordsRevisionAndDecidedInstant(t *testing.T) {
	s, conn, db := setupDB(t)
	ctx := context.Background()
	base := time.Date(2026, 5, 3, 10, 0, 0, 0, time.UTC)
	recs := records(0, 6, base)
	for i := range recs {
		e := &recs[i].Event
		if i%2 == 0 {
			e.PolicyRevision = int64(40 + i)
		}
		if i%3 == 0 {
			e.DecidedUS = base.UnixMicro() + int64(i)*1000 + 123
		}
	}
	p, err := s.Progress(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, 2, recs, 5, &p); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, "SELECT kafka_offset, policy_revision, decided_us FROM "+db+".decisions_raw WHERE kafka_partition = 2 ORDER BY kafka_offset")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := 0
	for rows.Next() {
		var off uint64
		var rev, us *int64
		if err := rows.Scan(&off, &rev, &us); err != nil {
			t.Fatal(err)
		}
		e := recs[off].Event
		if (rev == nil) != (e.PolicyRevision == 0) || (rev != nil && *rev != e.PolicyRevision) ||
			(us == nil) != (e.DecidedUS == 0) || (us != nil && *us != e.DecidedUS) {
			t.Errorf("offset %d: policy_revision %v, decided_us %v; want %d, %d (0 = NULL)", off, rev, us, e.PolicyRevision, e.DecidedUS)
		}
		got++
	}
	if err := rows.Err(); err != nil || got != len(recs) {
		t.Fatalf("%d rows (%v), want %d", got, err, len(recs))
	}
}
