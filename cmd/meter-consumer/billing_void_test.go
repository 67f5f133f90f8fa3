package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/billing"
	"github.com/ratewarden/ratewarden/metering/billing/chstore"
	"github.com/ratewarden/ratewarden/metering/billing/kafkapub"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestVoidedRangeLateEventsAndExports holds the rules of docs/billing.md
// ("Voids, late events and exports") through the real consumer: a void
// of a range removes exactly that range (the rollups the usage API reads,
// the statement, the export's lines), another key's usage untouched; a
// late event into the voided range counts, and a second void (a new id)
// removes exactly it; the same void sent again changes nothing. After the
// month is final and exported, a void of another of its ranges and a late
// event into the voided range leave the frozen statement and its export
// as they were, and the next month's statement and export carry them as
// one adjustment.
func TestVoidedRangeLateEventsAndExports(t *testing.T) {
	t.Parallel()
	ch := testenv.StartClickHouse(t)
	kafka := testenv.StartKafka(t, "ratelimit.decisions", 2)
	db := ch.Database(t)
	mp := startMeter(t, []string{"KAFKA_BROKERS=" + kafka.Addr(), "KAFKA_TOPIC=" + kafka.Topic(),
		"CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + db, "METER_BATCH_WAIT=50ms"})
	waitStatus(t, mp, 200, 60*time.Second) // the schema is applied

	// acct and other, every 3 hours of March 2026 (UTC), two scopes.
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	var evs []metering.Event
	for i := 0; i < 240; i++ {
		evs = append(evs, metering.Event{EventID: fmt.Sprintf("v%05d", i), TS: base.Add(time.Duration(i) * 3 * time.Hour).UnixMilli(),
			Key: []string{"acct", "other"}[i%2], Scope: []string{"api", "llm"}[i%3%2], Tier: "pro", Cost: uint64(1 + i%4),
			Allowed: i%9 != 0, Source: "shared", Policy: "p", Instance: "i"})
	}
	send(t, kafka.Addr(), kafka.Topic(), evs)
	conn := ch.Conn(t)
	waitRaw(t, conn, db, len(evs), 3*time.Minute)

	store, err := chstore.New(conn, db)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: []string{kafka.Addr()}, Topic: kafka.Topic()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	corr := &billing.Corrector{Store: store, Log: pub}
	now := time.Date(2026, 3, 20, 0, 0, 0, 0, time.UTC)
	st := &billing.Statements{Store: store, Now: func() time.Time { return now }}
	x := &billing.Exporter{Statements: st, Store: store}
	march, _ := billing.ParsePeriod("2026-03", "")
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(5*time.Minute))
	defer cancel()

	sum := func(key string, from, to time.Time) billing.Totals {
		var t0 billing.Totals
		for _, e := range evs {
			if at := time.UnixMilli(e.TS); e.Key == key && !at.Before(from) && at.Before(to) {
				t0.Requests++
				if e.Allowed {
					t0.Cost += int64(e.Cost)
				}
			}
		}
		return t0
	}
	usage := func(key string, from, to time.Time) billing.Totals { // the rollups the usage API reads, every tier summed
		rows, err := store.Usage(ctx, key, from, to)
		if err != nil {
			t.Fatal(err)
		}
		var u billing.Totals
		for _, r := range rows {
			u.Requests += r.Requests
			u.Cost += r.Cost
		}
		return u
	}
	statement := func(key string, p billing.Period) billing.Statement {
		s, err := st.Get(ctx, key, p, true)
		if err != nil {
			t.Fatal(err)
		}
		if !*s.Verified {
			t.Fatalf("%s %s: the rollups and the raw record disagree: %+v %+v", key, p, *s.Rollups, *s.Raw)
		}
		return s
	}
	minus := func(a, b billing.Totals) billing.Totals {
		return billing.Totals{Requests: a.Requests - b.Requests, Cost: a.Cost - b.Cost}
	}
	plus := func(a, b billing.Totals) billing.Totals { return minus(a, minus(billing.Totals{}, b)) }
	apply := func(r billing.Request, wantCreated bool) billing.Correction {
		t.Helper()
		c, created, err := corr.Apply(ctx, r, "alice")
		if err != nil || created != wantCreated {
			t.Fatalf("correction %s: created %t, %v", r.ID, created, err)
		}
		return c
	}
	monthEnd := base.AddDate(0, 1, 0)
	all, otherAll := sum("acct", base, monthEnd), sum("other", base, monthEnd)
	from, to := time.Date(2026, 3, 5, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC)
	inRange := sum("acct", from, to)

	// A void removes exactly the range, from the rollups and the statement.
	void := billing.Request{ID: "void-1", Key: "acct", From: &from, To: &to, Reason: "test traffic"}
	if c := apply(void, true); c.Net() != minus(billing.Totals{}, inRange) {
		t.Fatalf("the void's net %+v, want -%+v", c.Net(), inRange)
	}
	waitUntil(t, 2*time.Minute, "the void in the rollups", func() bool { return usage("acct", from, to) == billing.Totals{} })
	if s := statement("acct", march); s.Totals != minus(all, inRange) {
		t.Fatalf("the statement after the void: %+v, want %+v", s.Totals, minus(all, inRange))
	}
	if u := usage("other", base, monthEnd); u != otherAll {
		t.Fatalf("another key's usage changed: %+v, want %+v", u, otherAll)
	}

	// A late event into the voided range counts; a second void removes
	// exactly it; the first void sent again changes nothing.
	late := metering.Event{EventID: "late-1", TS: time.Date(2026, 3, 6, 12, 0, 30, 0, time.UTC).UnixMilli(), Key: "acct", Scope: "api",
		Tier: "pro", Cost: 7, Allowed: true, Source: "shared", Policy: "p", Instance: "i"}
	send(t, kafka.Addr(), kafka.Topic(), []metering.Event{late})
	lateT := billing.Totals{Requests: 1, Cost: 7}
	waitUntil(t, 2*time.Minute, "the late event in the voided range", func() bool { return usage("acct", from, to) == lateT })
	if s := statement("acct", march); s.Totals != minus(all, minus(inRange, lateT)) {
		t.Fatalf("the statement with the late event: %+v", s.Totals)
	}
	apply(void, false)
	again := void
	again.ID = "void-2"
	if c := apply(again, true); c.Net() != minus(billing.Totals{}, lateT) {
		t.Fatalf("the second void's net %+v, want exactly the late event", c.Net())
	}
	waitUntil(t, 2*time.Minute, "the second void in the rollups", func() bool { return usage("acct", from, to) == billing.Totals{} })
	final := minus(all, inRange)
	waitUntil(t, 2*time.Minute, "the statement net of both voids", func() bool { return statement("acct", march).Totals == final })

	// Final and exported: the export's lines name each void as a line of
	// its own, the range removed exactly, and sum to the statement.
	now = time.Date(2026, 4, 10, 0, 0, 0, 0, time.UTC)
	rows, err := x.Rows(ctx, march, []string{"acct"}, false)
	if err != nil {
		t.Fatal(err)
	}
	var total, voided billing.Totals
	for _, r := range rows {
		total.Requests += r.Requests
		total.Cost += r.Cost
		if r.Line == billing.LineCorrection {
			voided.Requests += r.Requests
			voided.Cost += r.Cost
		}
	}
	if total != final || voided != minus(billing.Totals{}, plus(inRange, lateT)) {
		t.Fatalf("the export's lines sum to %+v (voids %+v); want %+v (voids -%+v and the late event)", total, voided, final, inRange)
	}

	// After the export: a void of another range and a late event into
	// the first leave March as billed; April carries both as one
	// adjustment, and so does its export once final.
	from2, to2 := time.Date(2026, 3, 20, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 21, 0, 0, 0, 0, time.UTC)
	inRange2 := sum("acct", from2, to2)
	apply(billing.Request{ID: "void-3", Key: "acct", From: &from2, To: &to2, Reason: "outage retries"}, true)
	late2 := late
	late2.EventID, late2.TS = "late-2", time.Date(2026, 3, 6, 13, 0, 0, 0, time.UTC).UnixMilli()
	send(t, kafka.Addr(), kafka.Topic(), []metering.Event{late2})
	adj := minus(lateT, inRange2)
	waitUntil(t, 2*time.Minute, "the void and the late event in March's rollups", func() bool { return usage("acct", base, monthEnd) == plus(final, adj) })
	if s := statement("acct", march); s.Totals != final || s.State != billing.StateFinal {
		t.Fatalf("the final statement changed: %+v", s)
	}
	rowsAgain, err := x.Rows(ctx, march, []string{"acct"}, false)
	if err != nil || fmt.Sprint(rowsAgain) != fmt.Sprint(rows) {
		t.Fatalf("March's export changed after it was exported: %v\n%v\n%v", err, rowsAgain, rows)
	}
	april := march.Next()
	if s := statement("acct", april); len(s.Adjustments) != 1 || s.Adjustments[0] != (billing.Adjustment{Period: "2026-03", Requests: adj.Requests, Cost: adj.Cost}) {
		t.Fatalf("April's adjustments %+v, want %+v of 2026-03", s.Adjustments, adj)
	}
	now = time.Date(2026, 5, 10, 0, 0, 0, 0, time.UTC)
	aprilRows, err := x.Rows(ctx, april, []string{"acct"}, false)
	if err != nil || len(aprilRows) != 1 || aprilRows[0].Line != billing.LineAdjustment || aprilRows[0].Ref != "2026-03" ||
		aprilRows[0].Requests != adj.Requests || aprilRows[0].Cost != adj.Cost {
		t.Fatalf("April's export: %+v, %v; want the one adjustment %+v", aprilRows, err, adj)
	}
}
