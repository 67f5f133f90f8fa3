package usage

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
)

type slotsAnswer struct {
	Key    string `json:"key"`
	Window string `json:"window"`
	Source string `json:"source"`
	Series []struct {
		Start  string `json:"start"`
		Scope  string `json:"scope"`
		Region string `json:"region"`
		SlotCounts
	} `json:"series"`
	Totals SlotCounts `json:"totals"`
}

// writeSlotEvents writes slot events of key through the meter-consumer's
// own sink: per minute of the two hours before testNow, a concurrency
// alone's slots taken, refused, shed per class and released, with the
// slots in flight rising and falling (now: testNow, or the clock for the
// browser). It returns, per minute and per
// hour, the peak in flight and the sheds per class the events make.
func writeSlotEvents(t *testing.T, e *env, key string, now time.Time) (minutes, hours map[string]SlotCounts) {
	t.Helper()
	sink, err := chsink.New(e.conn, e.db, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := now.Truncate(time.Hour).Add(-2 * time.Hour)
	outcomes := []string{metering.SlotTaken, metering.SlotTaken, metering.SlotShed, metering.SlotRefused, metering.SlotReleased, metering.SlotShed}
	classes := []string{"sheddable", "default", "sheddable", "critical", "", "batch"}
	minutes, hours = map[string]SlotCounts{}, map[string]SlotCounts{}
	var recs []chsink.Record
	for i := 0; i < 600; i++ {
		ts := base.Add(time.Duration(i) * 12 * time.Second)
		o := outcomes[i%len(outcomes)]
		ev := metering.Event{EventID: fmt.Sprintf("slot%05d", i), TS: ts.UnixMilli(), Key: key, Scope: "reports:export", Tier: "reports",
			Source: "shared", Slot: o, Priority: classes[i%len(classes)], Allowed: o == metering.SlotTaken, Cost: 1}
		if o == metering.SlotReleased {
			ev.Kind, ev.Allowed, ev.Cost = metering.KindSlot, true, 0
		} else {
			ev.InFlight = int64(1 + (i*7)%23)
		}
		recs = append(recs, chsink.Record{Offset: int64(i), Event: ev})
		row := slotRow{peak: uint64(ev.InFlight), priority: ev.Priority}
		switch o {
		case metering.SlotTaken:
			row.taken = 1
		case metering.SlotRefused:
			row.refused = 1
		case metering.SlotShed:
			row.shed = 1
		default:
			row.released = 1
		}
		for _, b := range []struct {
			m  map[string]SlotCounts
			at time.Time
		}{{minutes, ts.Truncate(time.Minute)}, {hours, ts.Truncate(time.Hour)}} {
			c := b.m[b.at.Format(time.RFC3339)]
			c.add(row)
			b.m[b.at.Format(time.RFC3339)] = c
		}
	}
	ctx := context.Background()
	for from := 0; from < len(recs); from += 250 { // three batches
		to := min(from+250, len(recs))
		p, err := sink.Progress(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := sink.Write(ctx, 0, recs[from:to], int64(to-1), &p); err != nil {
			t.Fatal(err)
		}
	}
	return minutes, hours
}

// TestSlotsPeakAndShedPerMinute: GET /v1/slots answers, per minute and
// per hour, the peak in flight and the sheds per class exactly as the
// events make them (written by the meter-consumer's own sink); a portal
// token reads its own key only.
func TestSlotsPeakAndShedPerMinute(t *testing.T) {
	e := newEnv(t, sharedCH, testNow)
	minutes, hours := writeSlotEvents(t, e, "acct_slots", testNow)
	from, to := testNow.Truncate(time.Hour).Add(-2*time.Hour).Format(time.RFC3339), testNow.Format(time.RFC3339)
	for window, want := range map[string]map[string]SlotCounts{"minute": minutes, "hour": hours} {
		code, b := e.do("GET", "/v1/slots?key=acct_slots&window="+window+"&from="+from+"&to="+to, testAdmin, "")
		if code != 200 {
			t.Fatalf("%s: %d %s", window, code, b)
		}
		got := decode[slotsAnswer](t, b)
		if got.Source != "slots_minute" || got.Key != "acct_slots" || got.Window != window || len(got.Series) != len(want) {
			t.Fatalf("%s: %d points, want %d: %s", window, len(got.Series), len(want), b)
		}
		var total SlotCounts
		for _, pt := range got.Series {
			w := want[pt.Start]
			if pt.Scope != "reports:export" || pt.Region != "" || fmt.Sprint(pt.SlotCounts) != fmt.Sprint(w) {
				t.Fatalf("%s %s: %+v, want %+v", window, pt.Start, pt.SlotCounts, w)
			}
			total.PeakInFlight = max(total.PeakInFlight, w.PeakInFlight)
			total.Shed += w.Shed
		}
		if got.Totals.PeakInFlight != total.PeakInFlight || got.Totals.Shed != total.Shed || got.Totals.Shed != got.Totals.ShedByPriority["sheddable"]+got.Totals.ShedByPriority["batch"] {
			t.Fatalf("%s totals: %+v", window, got.Totals)
		}
	}
	tok := e.issue("acct_slots", 3600).Token
	if code, b := e.do("GET", "/v1/slots?window=minute&from="+from+"&to="+to, tok, ""); code != 200 || len(decode[slotsAnswer](t, b).Series) != len(minutes) {
		t.Fatalf("a portal token's own key: %d %s", code, b)
	}
	if code, _ := e.do("GET", "/v1/slots?key=acct_other", tok, ""); code != 403 {
		t.Fatalf("a portal token reads another key's slots: %d", code)
	}
	if code, _ := e.do("GET", "/v1/slots?key=acct_slots&group_by=scope", testAdmin, ""); code != 400 {
		t.Fatalf("group_by: %d, want 400", code)
	}
}
