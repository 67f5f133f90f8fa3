package chsink_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
)

// The rollups count actual cost: a reservation's decision counts its
// estimate, its settle (in a later batch, minutes later) actual −
// estimate in the reservation's own minute, a charge its cost; an expired
// reservation keeps its estimate. Settles and charges are not requests,
// and the raw table holds decisions only.
func TestRollupsCountActualCost(t *testing.T) {
	s, conn, db := setupDB(t)
	ctx := context.Background()
	base := time.Date(2026, 5, 3, 10, 0, 30, 0, time.UTC).UnixMilli()
	ev := func(o int64, e metering.Event) chsink.Record {
		e.EventID, e.Key, e.Scope, e.Tier, e.Source, e.Policy, e.Instance = "e"+string(rune('a'+o)), "acct", "tokens", "llm", "shared", "p", "i"
		if e.TS == 0 {
			e.TS = base
		}
		return chsink.Record{Offset: o, Event: e}
	}
	p, err := s.Progress(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	first := []chsink.Record{
		ev(0, metering.Event{Cost: 300, Allowed: true, Kind: metering.KindDecision, Reservation: "r1"}),
		ev(1, metering.Event{Cost: 40, Allowed: true, Kind: metering.KindDecision, Reservation: "r2"}), // never settled
	}
	if err := s.Write(ctx, 0, first, 1, &p); err != nil {
		t.Fatal(err)
	}
	second := []chsink.Record{
		ev(2, metering.Event{TS: base + 120_000, Allowed: true, Kind: metering.KindSettle, Reservation: "r1", Estimate: 300, Actual: 100, ReservedTS: base}),
		ev(3, metering.Event{TS: base + 180_000, Allowed: true, Kind: metering.KindCharge, Actual: 55}),
	}
	if err := s.Write(ctx, 0, second, 3, &p); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"usage_minute", "usage_hour", "usage_day"} {
		var req, cost uint64
		if err := conn.QueryRow(ctx, "SELECT sum(requests), sum(cost) FROM "+db+"."+table+" WHERE key = 'acct'").Scan(&req, &cost); err != nil {
			t.Fatal(err)
		}
		if req != 2 || cost != 300+40-200+55 {
			t.Fatalf("%s: %d requests, cost %d; want 2 and %d", table, req, cost, 300+40-200+55)
		}
	}
	// Minute by minute, no bucket goes below zero: the refund sits with
	// the estimate it refunds.
	rows, err := conn.Query(ctx, "SELECT start, sum(cost) FROM "+db+".usage_minute WHERE key = 'acct' GROUP BY start ORDER BY start")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []uint64
	for rows.Next() {
		var start time.Time
		var c uint64
		if err := rows.Scan(&start, &c); err != nil {
			t.Fatal(err)
		}
		got = append(got, c)
	}
	if len(got) != 2 || got[0] != 300+40-200 || got[1] != 55 {
		t.Fatalf("minutes: %v, want [140 55]", got)
	}
	var raw uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+db+".decisions_raw WHERE key = 'acct'").Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if raw != 2 {
		t.Fatalf("raw rows %d, want the 2 decisions", raw)
	}
}
