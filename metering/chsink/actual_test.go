package chsink_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
)

// The rollups count actual cost: a reservation's decision counts its
// estimate, its settle (in a later batch, minutes later) actual −
// estimate in the reservation's own minute, a charge its cost; an expired
// reservation keeps its estimate. Settles and charges are not requests.
// decisions_raw holds them as rows of their kind, whose actual_cost sums
// to the same actual cost, once however often a batch is written again.
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
	// Written again after a restart, from the progress ClickHouse holds:
	// nothing counts twice.
	if p, err = s.Progress(ctx, 0); err != nil {
		t.Fatal(err)
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
	var raw, decisions uint64
	var actual int64
	if err := conn.QueryRow(ctx, "SELECT count(), countIf(kind = 'decision'), sum(actual_cost) FROM "+db+".decisions_raw WHERE key = 'acct'").Scan(&raw, &decisions, &actual); err != nil {
		t.Fatal(err)
	}
	if raw != 4 || decisions != 2 || actual != 300+40-200+55 {
		t.Fatalf("decisions_raw: %d rows, %d decisions, actual cost %d; want 4, 2 and %d", raw, decisions, actual, 300+40-200+55)
	}
	var kind, reservation string
	var estimate, act, reservedTS uint64
	var cost int64
	if err := conn.QueryRow(ctx, "SELECT kind, reservation, estimate, actual, reserved_ts, actual_cost FROM "+db+".decisions_raw WHERE kafka_offset = 2").
		Scan(&kind, &reservation, &estimate, &act, &reservedTS, &cost); err != nil {
		t.Fatal(err)
	}
	if kind != "settle" || reservation != "r1" || estimate != 300 || act != 100 || reservedTS != uint64(base) || cost != -200 {
		t.Fatalf("the settle's row: %s %s estimate %d actual %d reserved_ts %d actual_cost %d", kind, reservation, estimate, act, reservedTS, cost)
	}
}

// A settle in a later UTC month than its reservation counts its difference
// in the reservation's minute, in the earlier month's partition, through
// its table's carry stream, in the same batch as the later month's
// events: a refund there leaves the month at its actual cost (never
// wrapped below zero), the later month holds only its own costs. The
// carry stream progresses on its own: when only one of the two INSERTs of
// a table landed, writing the batch again adds what is missing, once. A
// batch that carries nothing writes no carry INSERT; one that spans two
// months of its own is refused. The settle's raw row is in its own month.
func TestASettleInALaterMonthCountsInItsReservationsMinute(t *testing.T) {
	_, conn, db := setupDB(t)
	inserts := map[string]int{}
	var mu sync.Mutex
	s, err := chsink.New(conn, db, func(t chsink.Table, _ int, _ time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			inserts[t.String()]++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	reserved := time.Date(2026, 11, 30, 23, 59, 50, 0, time.UTC).UnixMilli()
	settled := time.Date(2026, 12, 1, 0, 0, 20, 0, time.UTC).UnixMilli()
	ev := func(o int64, e metering.Event) chsink.Record {
		e.EventID, e.Key, e.Scope, e.Tier, e.Source, e.Policy, e.Instance = "m"+string(rune('a'+o)), "acct", "tokens", "llm", "shared", "p", "i"
		return chsink.Record{Offset: o, Event: e}
	}
	reservation := ev(0, metering.Event{TS: reserved, Cost: 300, Allowed: true, Kind: metering.KindDecision, Reservation: "r1"})
	settle := ev(1, metering.Event{TS: settled, Allowed: true, Kind: metering.KindSettle, Reservation: "r1", Estimate: 300, Actual: 120, ReservedTS: reserved})
	later := ev(2, metering.Event{TS: settled + 10_000, Cost: 10, Allowed: true})
	nov, dec := chsink.MonthOf(reserved), chsink.MonthOf(settled)
	if got, want := chsink.MonthsOf(&settle.Event), (chsink.Months{Event: dec, Carry: nov}); got != want {
		t.Fatalf("MonthsOf(settle) = %+v, want %+v", got, want)
	}
	if m, ok := chsink.MonthsOf(&later.Event).Join(chsink.MonthsOf(&settle.Event)); !ok || m != (chsink.Months{Event: dec, Carry: nov}) {
		t.Fatalf("December's decision and the settle carried to November: %+v %v, want one batch", m, ok)
	}
	if _, ok := chsink.MonthsOf(&reservation.Event).Join(chsink.MonthsOf(&later.Event)); ok {
		t.Fatal("a decision of November and one of December joined one batch")
	}
	p, err := s.Progress(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, 1, []chsink.Record{reservation, later}, 2, &p); err == nil {
		t.Fatal("a batch of November's and December's decisions was written")
	}
	if p, err = s.Progress(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, 1, []chsink.Record{reservation}, 0, &p); err != nil {
		t.Fatal(err)
	}
	if n := inserts["usage_minute:carry"]; n != 0 || inserts["usage_minute"] != 1 {
		t.Fatalf("a batch that carries nothing: %d carry INSERTs, %d of usage_minute; want 0 and 1", n, inserts["usage_minute"])
	}
	// The batch of the settle and December's decision. First only the
	// tables' own INSERTs land (as if the carry INSERTs had failed), then
	// the batch is written again from the progress ClickHouse holds, then
	// once more.
	batch := []chsink.Record{settle, later}
	half := p
	for _, c := range []chsink.Table{chsink.CarryMinute, chsink.CarryHour, chsink.CarryDay, chsink.CarryRegionMinute, chsink.CarryRegionHour, chsink.CarryRegionDay} {
		if p[c] != 0 {
			t.Fatalf("progress of %s after a batch that carries nothing: %d, want 0 (its marker rode the table's INSERT)", c, p[c])
		}
		half[c] = 2
	}
	if err := s.Write(ctx, 1, batch, 2, &half); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 2; round++ {
		if p, err = s.Progress(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if round == 0 && (p[chsink.Minute] != 2 || p[chsink.CarryMinute] != 0) {
			t.Fatalf("after the tables' INSERTs alone: progress %v", p)
		}
		if err := s.Write(ctx, 1, batch, 2, &p); err != nil {
			t.Fatal(err)
		}
	}
	if n := inserts["usage_minute:carry"]; n != 1 {
		t.Fatalf("%d carry INSERTs into usage_minute, want the one of the settle", n)
	}
	for _, table := range []string{"usage_minute", "usage_hour", "usage_day", "usage_region_minute"} {
		rows, err := conn.Query(ctx, "SELECT toYYYYMM(start), sum(cost), sum(requests) FROM "+db+"."+table+" WHERE key = 'acct' GROUP BY toYYYYMM(start) ORDER BY toYYYYMM(start)")
		if err != nil {
			t.Fatal(err)
		}
		got := map[uint32][2]uint64{}
		for rows.Next() {
			var month uint32
			var cost, req uint64
			if err := rows.Scan(&month, &cost, &req); err != nil {
				t.Fatal(err)
			}
			got[month] = [2]uint64{cost, req}
		}
		rows.Close()
		if table == "usage_region_minute" {
			if len(got) != 0 {
				t.Fatalf("%s: %v, want nothing (no event carries a region)", table, got)
			}
			continue
		}
		if len(got) != 2 || got[202611] != [2]uint64{120, 1} || got[202612] != [2]uint64{10, 1} {
			t.Fatalf("%s per month (cost, requests): %v, want 202611 (120, 1) and 202612 (10, 1)", table, got)
		}
	}
	var minute time.Time
	var cost uint64
	if err := conn.QueryRow(ctx, "SELECT start, sum(cost) FROM "+db+".usage_minute WHERE key = 'acct' AND start < toDateTime('2026-12-01 00:00:00', 'UTC') GROUP BY start").Scan(&minute, &cost); err != nil {
		t.Fatal(err)
	}
	if !minute.Equal(time.Date(2026, 11, 30, 23, 59, 0, 0, time.UTC)) || cost != 120 {
		t.Fatalf("the reservation's minute %v holds %d, want 23:59 and 120", minute, cost)
	}
	var rawMonth uint32
	var actual int64
	if err := conn.QueryRow(ctx, "SELECT toYYYYMM(event_time), actual_cost FROM "+db+".decisions_raw WHERE kind = 'settle'").Scan(&rawMonth, &actual); err != nil {
		t.Fatal(err)
	}
	if rawMonth != 202612 || actual != -180 {
		t.Fatalf("the settle's raw row: month %d, actual_cost %d; want 202612 and -180", rawMonth, actual)
	}
	got, err := s.Progress(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	for tb, off := range got {
		if off != 2 {
			t.Fatalf("progress of %s is %d, want 2", chsink.Table(tb), off)
		}
	}
}
