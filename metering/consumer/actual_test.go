package consumer_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// settleEvents are reservations made in the last 20 s of November (UTC),
// settled 15 s later below or above their estimates (most of them after
// midnight, in December) or never (their estimates stand), among
// December's decisions and charges, in time order. Costs are per UTC month
// of the rollups (a settle's difference in its reservation's month) and
// the actual cost of them all.
func settleEvents() (evs, settles []metering.Event, perMonth map[uint32]uint64, actual int64) {
	reserveAt := time.Date(2026, 11, 30, 23, 59, 40, 0, time.UTC).UnixMilli()
	december := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	perMonth = map[uint32]uint64{}
	ev := func(ts int64, key string) metering.Event {
		return metering.Event{TS: ts, Key: key, Scope: "tokens", Tier: "llm",
			Allowed: true, Source: "shared", Remaining: 1, Limit: 1000, Policy: "llm", Instance: "test"}
	}
	for i := range 40 {
		r := ev(reserveAt+int64(i)*500, fmt.Sprintf("k%d", i%10))
		r.Kind, r.Reservation, r.Cost = metering.KindDecision, fmt.Sprintf("res-%d", i), uint64(100+i)
		evs = append(evs, r)
		perMonth[202611] += r.Cost
		actual += int64(r.Cost)
		if i%4 == 3 {
			continue // expired: its estimate stands
		}
		s := ev(r.TS+15_000, r.Key)
		s.Kind, s.Reservation, s.Estimate, s.Actual, s.ReservedTS = metering.KindSettle, r.Reservation, r.Cost, uint64(i*37%250), r.TS
		evs = append(evs, s)
		perMonth[202611] += s.Actual - s.Estimate
		actual += int64(s.Actual) - int64(s.Estimate)
	}
	for j := range 30 {
		d := ev(december+int64(j)*700, fmt.Sprintf("k%d", j%10))
		d.Cost, d.Allowed = 3, j%5 != 0
		evs = append(evs, d)
		if d.Allowed {
			perMonth[202612] += d.Cost
			actual += int64(d.Cost)
		}
	}
	for j := range 10 {
		c := ev(december+5_000+int64(j)*1000, fmt.Sprintf("k%d", j))
		c.Kind, c.Actual = metering.KindCharge, uint64(7+j)
		evs = append(evs, c)
		perMonth[202612] += c.Actual
		actual += int64(c.Actual)
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].TS < evs[j].TS })
	for i := range evs {
		evs[i].EventID = fmt.Sprintf("se-%04d", i)
	}
	for _, e := range evs {
		if e.Kind == metering.KindSettle {
			settles = append(settles, e)
		}
	}
	return evs, settles, perMonth, actual
}

// TestSettlesAreExactOnceInRawAndAcrossAMonth runs settles through the
// broker and the consumer (small batches), with producer retries of every
// settle at new offsets, and again after a consumer restart: the rollups
// count each settle's difference once, in its reservation's month (the
// settles after midnight in November's minutes, none wrapping below
// zero); decisions_raw holds every event once, settles and charges as
// rows of their kind, and its sum(actual_cost) is the actual cost.
func TestSettlesAreExactOnceInRawAndAcrossAMonth(t *testing.T) {
	conn, db := setup(t)
	k := testenv.StartKafka(t, "decisions", 4)
	evs, settles, perMonth, actual := settleEvents()
	var crossing int
	for _, s := range settles {
		if time.UnixMilli(s.TS).UTC().Month() != time.UnixMilli(s.ReservedTS).UTC().Month() {
			crossing++
		}
	}
	if crossing < 10 || crossing == len(settles) {
		t.Fatalf("%d of %d settles cross the month: want many, not all", crossing, len(settles))
	}
	// A settle whose reserved_ts no DateTime holds is a bad message,
	// skipped: counted at that time it would fail its batch for ever.
	bad := settles[0]
	bad.EventID, bad.ReservedTS = "bad-reserved-ts", 1
	produce(t, k.Addr(), k.Topic(), append(evs[:len(evs):len(evs)], bad))
	r := startConsumer(t, conn, db, k.Addr(), k.Topic(), 7)
	produce(t, k.Addr(), k.Topic(), settles) // producer retries
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs), 60*time.Second)
	waitCounter(t, r.reg, "meter_duplicates_discarded_total", float64(len(settles)))
	waitCounter(t, r.reg, "meter_bad_messages_total", 1)

	check := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, table := range []string{"usage_minute", "usage_hour", "usage_day"} {
			rows, err := conn.Query(ctx, "SELECT toYYYYMM(start), sum(cost) FROM "+db+"."+table+" WHERE key != '' GROUP BY toYYYYMM(start)")
			if err != nil {
				t.Fatal(err)
			}
			got := map[uint32]uint64{}
			for rows.Next() {
				var m uint32
				var c uint64
				if err := rows.Scan(&m, &c); err != nil {
					t.Fatal(err)
				}
				got[m] = c
			}
			rows.Close()
			if len(got) != 2 || got[202611] != perMonth[202611] || got[202612] != perMonth[202612] {
				t.Fatalf("%s cost per month %v, want %v", table, got, perMonth)
			}
		}
		var wrapped uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM (SELECT key, start, sum(cost) AS c FROM "+db+".usage_minute WHERE key != '' GROUP BY key, start) WHERE c > 1000000").Scan(&wrapped); err != nil {
			t.Fatal(err)
		}
		if wrapped != 0 {
			t.Fatalf("%d minutes of a key hold a cost below zero (wrapped)", wrapped)
		}
		deadline := time.Now().Add(testenv.Timeout(30 * time.Second))
		for {
			var rows, distinct, decisions uint64
			var raw int64
			if err := conn.QueryRow(ctx, "SELECT count(), uniqExact(event_id), countIf(kind = 'decision'), sum(actual_cost) FROM "+db+".decisions_raw").
				Scan(&rows, &distinct, &decisions, &raw); err != nil {
				t.Fatal(err)
			}
			if rows == uint64(len(evs)) && distinct == rows && decisions == 70 && raw == actual {
				return
			}
			if rows > uint64(len(evs)) || time.Now().After(deadline) {
				t.Fatalf("decisions_raw: %d rows (%d distinct), %d decisions, actual cost %d; want %d, 70 and %d", rows, distinct, decisions, raw, len(evs), actual)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	check()
	// A restart reads from the progress ClickHouse holds; the settles sent
	// once more are found in the deduplication window it reloads.
	r.stop()
	r = startConsumer(t, conn, db, k.Addr(), k.Topic(), 7)
	produce(t, k.Addr(), k.Topic(), settles)
	waitCounter(t, r.reg, "meter_duplicates_discarded_total", float64(len(settles)))
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs), 30*time.Second)
	check()
	t.Logf("%d events, %d settles (%d across the month) sent three times: November %d, December %d, actual cost %d in rollups and raw",
		len(evs), len(settles), crossing, perMonth[202611], perMonth[202612], actual)
}

// The settles of the month before do not cut batches: a partition whose
// events alternate between December's decisions and settles of
// November's reservations is written in batches of the configured size,
// each one INSERT per table and one per carry stream, and its totals are
// exact in each month.
func TestSettlesOfTheMonthBeforeDoNotCutBatches(t *testing.T) {
	conn, db := setup(t)
	k := testenv.StartKafka(t, "decisions", 1)
	december := time.Date(2026, 12, 1, 0, 0, 10, 0, time.UTC).UnixMilli()
	november := time.Date(2026, 11, 30, 23, 59, 50, 0, time.UTC).UnixMilli()
	ev := func(id string, ts int64) metering.Event {
		return metering.Event{EventID: id, TS: ts, Key: "acct", Scope: "tokens", Tier: "llm",
			Allowed: true, Source: "shared", Policy: "llm", Instance: "test"}
	}
	var evs []metering.Event
	for i := range 1000 {
		r := ev(fmt.Sprintf("res-%04d", i), november+int64(i))
		r.Kind, r.Reservation, r.Cost = metering.KindDecision, fmt.Sprintf("r%d", i), 5
		evs = append(evs, r)
	}
	for i := range 1000 {
		d := ev(fmt.Sprintf("dec-%04d", i), december+int64(2*i))
		d.Cost = 2
		s := ev(fmt.Sprintf("set-%04d", i), december+int64(2*i+1))
		s.Kind, s.Reservation, s.Estimate, s.Actual, s.ReservedTS = metering.KindSettle, fmt.Sprintf("r%d", i), 5, 3, november+int64(i)
		evs = append(evs, d, s)
	}
	produce(t, k.Addr(), k.Topic(), evs)
	began := time.Now()
	startConsumer(t, conn, db, k.Addr(), k.Topic(), 500)
	testenv.WaitUsageTotals(t, conn, db, testenv.TotalsOf(evs), 60*time.Second)
	took := time.Since(began)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var batches, carries uint64
	if err := conn.QueryRow(ctx, "SELECT countIf(scope = ''), countIf(scope = 'carry') FROM "+db+".usage_minute WHERE key = ''").Scan(&batches, &carries); err != nil {
		t.Fatal(err)
	}
	if batches > 10 || carries != batches {
		t.Fatalf("%d batches (%d carry markers) for 3,000 events in batches of 500, want at most 10, each with its carry marker", batches, carries)
	}
	var nov, dec uint64
	if err := conn.QueryRow(ctx, "SELECT sumIf(cost, toYYYYMM(start) = 202611), sumIf(cost, toYYYYMM(start) = 202612) FROM "+db+".usage_minute WHERE key = 'acct'").Scan(&nov, &dec); err != nil {
		t.Fatal(err)
	}
	if nov != 1000*3 || dec != 1000*2 {
		t.Fatalf("November %d, December %d; want 3000 (the reservations' actual costs) and 2000", nov, dec)
	}
	t.Logf("3,000 events, 2,000 of them alternating across the month, in %d batches, %v", batches, took)
}
