package chstore_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/billing"
	"github.com/ratewarden/ratewarden/metering/billing/chstore"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

var ch *testenv.ClickHouse

func TestMain(m *testing.M) { os.Exit(testenv.MainWithClickHouse(m, &ch)) }

// pipeline is a fresh, migrated database and the meter-consumer's sink
// writing into it, so that the rollups and the raw record are exactly what
// the pipeline makes of the events.
type pipeline struct {
	conn  driver.Conn
	db    string
	sink  *chsink.Sink
	store *chstore.Store
	next  int64 // the next Kafka offset
}

func newPipeline(t *testing.T) *pipeline {
	t.Helper()
	conn, db := ch.Conn(t), ch.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := applySchema(ctx, &pipeline{conn: conn, db: db}); err != nil {
		t.Fatal(err)
	}
	sink, err := chsink.New(conn, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	store, err := chstore.New(conn, db)
	if err != nil {
		t.Fatal(err)
	}
	return &pipeline{conn: conn, db: db, sink: sink, store: store}
}

// write stores evs as the consumer would, in batches that each hold one
// month's events (the sink's rule).
func (p *pipeline) write(t *testing.T, evs ...metering.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prog, err := p.sink.Progress(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var batch []chsink.Record
	var month chsink.Months
	flush := func() {
		if len(batch) == 0 {
			return
		}
		if err := p.sink.Write(ctx, 0, batch, batch[len(batch)-1].Offset, &prog); err != nil {
			t.Fatal(err)
		}
		batch = nil
	}
	for _, e := range evs {
		m := chsink.MonthsOf(&e)
		if j, ok := month.Join(m); len(batch) > 0 && ok {
			month = j
		} else {
			flush()
			month = m
		}
		batch = append(batch, chsink.Record{Offset: p.next, Event: e})
		p.next++
	}
	flush()
}

func applySchema(ctx context.Context, p *pipeline) error { return schema.Apply(ctx, p.conn, p.db) }

var ids int

func ev(key, scope string, at time.Time, cost uint64, allowed bool) metering.Event {
	ids++
	return metering.Event{EventID: fmt.Sprintf("ev%06d", ids), TS: at.UnixMilli(), Key: key, Scope: scope, Tier: "pro",
		Cost: cost, Allowed: allowed, Source: "shared", Policy: "p", Instance: "i"}
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

func statement(t *testing.T, st *billing.Statements, key string, p billing.Period, verify bool) billing.Statement {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := st.Get(ctx, key, p, verify)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStatementOfAMonthInAZone: a month in Asia/Kolkata (+05:30) is summed
// exactly from the rollups (minutes at its edges, hours inside), a
// settle's difference counts in its reservation's month, the raw record
// agrees; after the grace the statement is frozen, a late event leaves it
// unchanged and shows in the next period as an adjustment naming it.
func TestStatementOfAMonthInAZone(t *testing.T) {
	t.Parallel()
	pl := newPipeline(t)
	now := utc("2026-04-01T12:00:00Z")
	st := &billing.Statements{Store: pl.store, Grace: 72 * time.Hour, Now: func() time.Time { return now },
		Units: func(key, scope string) string {
			if scope == "llm" {
				return "tokens"
			}
			return ""
		}}
	reserve := ev("acct", "llm", utc("2026-03-20T09:00:00Z"), 50, true)
	reserve.Reservation = "r1"
	settle := metering.Event{EventID: "settle-r1", TS: utc("2026-04-02T09:00:00Z").UnixMilli(), Key: "acct", Scope: "llm", Tier: "pro",
		Allowed: true, Source: "shared", Kind: metering.KindSettle, Reservation: "r1", Estimate: 50, Actual: 30, ReservedTS: reserve.TS}
	pl.write(t,
		ev("acct", "api", utc("2026-02-28T18:29:59.999Z"), 5, true), // February in Kolkata
		ev("acct", "api", utc("2026-02-28T18:30:00Z"), 3, true),     // the month's first instant
		ev("acct", "llm", utc("2026-03-15T10:00:00Z"), 100, true),
		reserve,
		ev("acct", "api", utc("2026-03-31T18:29:59.999Z"), 7, false), // rejected: a request, no cost
		ev("acct", "api", utc("2026-03-31T18:30:00Z"), 1, true),      // April in Kolkata
		ev("other", "api", utc("2026-03-10T00:00:00Z"), 9, true),
		settle,
	)
	march, err := billing.ParsePeriod("2026-03", "Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	s := statement(t, st, "acct", march, true)
	want := billing.Totals{Requests: 4, Cost: 3 + 100 + 30}
	if s.State != billing.StateClosing || s.Totals != want || s.Verified == nil || !*s.Verified || *s.Raw != want {
		t.Fatalf("closing statement: %+v (raw %+v), want totals %+v, verified", s, s.Raw, want)
	}
	if len(s.Meters) != 2 || s.Meters[0] != (billing.Meter{Scope: "api", Requests: 2, Cost: 3}) ||
		s.Meters[1] != (billing.Meter{Scope: "llm", Unit: "tokens", Requests: 2, Cost: 130}) {
		t.Fatalf("meters %+v", s.Meters)
	}

	now = utc("2026-04-10T00:00:00Z") // past the grace: final
	s = statement(t, st, "acct", march, false)
	if s.State != billing.StateFinal || s.FinalizedAt != "2026-04-10T00:00:00Z" || s.Totals != want {
		t.Fatalf("final statement: %+v", s)
	}

	// A late event of March after it was frozen.
	pl.write(t, ev("acct", "api", utc("2026-03-10T00:00:00Z"), 4, true))
	now = utc("2026-04-11T00:00:00Z")
	s = statement(t, st, "acct", march, true)
	live := billing.Totals{Requests: 5, Cost: 137}
	if s.Totals != want || s.FinalizedAt != "2026-04-10T00:00:00Z" || !*s.Verified || *s.Rollups != live || *s.Raw != live {
		t.Fatalf("the frozen statement after a late event: %+v rollups %+v raw %+v", s, s.Rollups, s.Raw)
	}
	april := s2(t, march.Next(), st)
	if len(april.Adjustments) != 1 || april.Adjustments[0] != (billing.Adjustment{Period: "2026-03", Requests: 1, Cost: 4}) ||
		april.Totals != (billing.Totals{Requests: 2, Cost: 5}) || april.State != billing.StateOpen {
		t.Fatalf("april: %+v", april)
	}
	// Frozen in turn, April keeps the adjustment, and May owes nothing more.
	now = utc("2026-05-10T00:00:00Z")
	if again := s2(t, march.Next(), st); again.Totals != april.Totals || again.State != billing.StateFinal {
		t.Fatalf("april frozen: %+v", again)
	}
	if may := s2(t, march.Add(2), st); len(may.Adjustments) != 0 || may.Totals != (billing.Totals{}) {
		t.Fatalf("may: %+v", may)
	}
}

func s2(t *testing.T, p billing.Period, st *billing.Statements) billing.Statement {
	return statement(t, st, "acct", p, false)
}
