package chsink_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
)

// slotRecords are n slot events of key acct from offset from on: a
// concurrency alone's (decisions, in scope export) and a rate's beside
// slots (kind slot, in scope report), over classes and two minutes.
func slotRecords(from, n int, base time.Time) []chsink.Record {
	outcomes := []string{metering.SlotTaken, metering.SlotRefused, metering.SlotShed, metering.SlotReleased}
	classes := []string{"critical", "default", "sheddable"}
	out := make([]chsink.Record, n)
	for i := range out {
		o := from + i
		e := metering.Event{EventID: fmt.Sprintf("s%09d", o), TS: base.UnixMilli() + int64(o)*997, Key: "acct", Scope: "export",
			Tier: "reports", Source: "shared", Policy: "reports", Instance: "i", Slot: outcomes[o%4], Region: "eu"}
		if e.Slot != metering.SlotReleased {
			e.Priority, e.InFlight = classes[o%3], int64(o%17)
			e.Allowed, e.Cost = e.Slot == metering.SlotTaken, 1
		} else {
			e.Kind, e.Allowed = metering.KindSlot, true
		}
		if o%5 == 0 && e.Kind == "" {
			e.Kind, e.Scope, e.Cost = metering.KindSlot, "report", 0 // beside a rate: no request
		}
		out[i] = chsink.Record{Offset: int64(o), Event: e}
	}
	return out
}

type slotRow struct {
	taken, refused, shed, released, peak uint64
}

// TestSlotsMinuteIsExactUnderReplay: slots_minute holds, per key, scope,
// class and minute, the slots taken, refused, shed and released and the
// peak in flight, exactly as counted from the events, after batches
// written twice and a table that lagged behind the others; the usage
// rollups count only the slot events that are requests.
func TestSlotsMinuteIsExactUnderReplay(t *testing.T) {
	s, conn, db := setupDB(t)
	ctx := context.Background()
	base := time.Date(2026, 5, 3, 10, 0, 0, 0, time.UTC)
	recs := slotRecords(0, 120, base) // about two minutes
	type k struct {
		scope, class string
		minute       int64
	}
	want := map[k]*slotRow{}
	var requests uint64
	for _, r := range recs {
		e := r.Event
		if e.IsDecision() {
			requests++
		}
		key := k{e.Scope, e.Priority, e.TS / 60_000 * 60}
		w := want[key]
		if w == nil {
			w = &slotRow{}
			want[key] = w
		}
		switch e.Slot {
		case metering.SlotTaken:
			w.taken++
		case metering.SlotRefused:
			w.refused++
		case metering.SlotShed:
			w.shed++
		default:
			w.released++
		}
		w.peak = max(w.peak, uint64(e.InFlight))
	}
	// write writes batch as the consumer does: from the progress ClickHouse
	// holds, resuming where the lowest table stopped; skipSlots loses
	// slots_minute's INSERT (a crash between the tables' INSERTs).
	write := func(last int64, skipSlots bool) {
		t.Helper()
		p, err := s.Progress(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		from := p.Resume()
		if skipSlots {
			p[chsink.SlotsMinute] = last
		}
		if err := s.Write(ctx, 1, recs[from:last+1], last, &p); err != nil {
			t.Fatal(err)
		}
	}
	write(29, false)
	write(59, true) // slots_minute lacks 30..59: the resume point goes back to 30
	if p, err := s.Progress(ctx, 1); err != nil || p.Resume() != 30 {
		t.Fatalf("resume at %d (%v), want 30", p.Resume(), err)
	}
	write(89, false)
	write(119, false)
	write(119, false) // the same offsets again: nothing changes

	rows, err := conn.Query(ctx, "SELECT scope, priority, toUInt32(start), sum(taken), sum(refused), sum(shed), sum(released), max(peak_in_flight)"+
		" FROM "+db+".slots_minute WHERE key = 'acct' GROUP BY scope, priority, start")
	if err != nil {
		t.Fatal(err)
	}
	got := map[k]slotRow{}
	for rows.Next() {
		var scope, class string
		var start uint32
		var r slotRow
		if err := rows.Scan(&scope, &class, &start, &r.taken, &r.refused, &r.shed, &r.released, &r.peak); err != nil {
			t.Fatal(err)
		}
		got[k{scope, class, int64(start)}] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d rows %+v, want %d", len(got), got, len(want))
	}
	for key, w := range want {
		if got[key] != *w {
			t.Errorf("%+v: %+v, want %+v", key, got[key], *w)
		}
	}
	var n, inFlight uint64
	if err := conn.QueryRow(ctx, "SELECT sum(requests) FROM "+db+".usage_minute WHERE key = 'acct'").Scan(&n); err != nil || n != requests {
		t.Fatalf("usage_minute counts %d requests (%v), want %d: a slot event beside a rate is no request", n, err, requests)
	}
	if err := conn.QueryRow(ctx, "SELECT count(), sum(in_flight) FROM "+db+".decisions_raw WHERE key = 'acct' AND slot != ''").Scan(&n, &inFlight); err != nil || n != 120 {
		t.Fatalf("decisions_raw holds %d slot rows (%v), want 120", n, err)
	}
	var wantInFlight uint64
	for _, r := range recs {
		wantInFlight += uint64(r.Event.InFlight)
	}
	if inFlight != wantInFlight {
		t.Fatalf("decisions_raw in_flight sums to %d, want %d", inFlight, wantInFlight)
	}
}
