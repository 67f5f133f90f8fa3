package chsink_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/testenv"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/schema"
)

var ch *testenv.ClickHouse

func TestMain(m *testing.M) {
	os.Exit(testenv.MainWithClickHouse(m, &ch))
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
	sum := func(table string) uint64 {
		var n uint64
		if err := conn.QueryRow(context.Background(), "SELECT sum(requests) FROM "+db+"."+table+" WHERE key != ''").Scan(&n); err != nil {
			tb.Fatal(err)
		}
		return n
	}
	return s, sum
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
	if err := s.RecentIDs(ctx, 2, -1, func(string, int64) { ids++ }); err != nil {
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
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if err := s.Write(context.Background(), 0, all[i], int64((i+1)*batch-1), &p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "events/s")
}
