package decisionevents

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const slotPolicy = `version: 1
default_tier: free
priorities: { critical: 1, default: 1, sheddable: 0.5 }
tiers:
  free: { rate: 1000, burst: 1000 }
  reports: { concurrency: 2 }
  both: { rate: 0.001, burst: 3, concurrency: 2 }
`

// TestSlotDecisionEventsCountEachRequestOnce: through a Gate on Redis and
// the limiter's own recorder, every slot taken, refused, shed and released
// is an event with its class and the slots in flight, and every /check is
// counted as exactly one request (a decision event): by its slot's event
// on a concurrency alone, by its rate's on a limit with a rate, whose
// slot events are then no request.
func TestSlotDecisionEventsCountEachRequestOnce(t *testing.T) {
	r := testenv.StartRedis(t)
	pol, err := policy.Parse([]byte(slotPolicy))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	sink := &memSink{}
	rec := &Recorder{sink: sink, ids: metering.NewIDs(), instance: "i1", region: "eu"}
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, "ev"), Policy: pol, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	g, err := slots.NewGate(slots.Config{Next: lim, Policy: lim.Policy, Store: redisstore.NewConcurrency(rdb, "ev"),
		TTL: time.Minute, Timeout: testenv.Timeout(time.Second), Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	check := func(scope, tier, class string) enforcement.Decision {
		t.Helper()
		d, err := g.Check(ctx, enforcement.Request{Key: "acct", Scope: scope, Tier: tier, Priority: class})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	// A concurrency alone of 2; sheddable may hold 1 of them.
	first := check("export", "reports", "sheddable")
	if shed := check("export", "reports", "sheddable"); shed.Reason != enforcement.ReasonShed {
		t.Fatalf("second sheddable: %+v", shed)
	}
	check("export", "reports", "")
	if full := check("export", "reports", "critical"); full.Reason != enforcement.ReasonConcurrency {
		t.Fatalf("third: %+v", full)
	}
	if freed, err := g.Release(ctx, first.Lease); err != nil || !freed {
		t.Fatalf("release: %v %v", freed, err)
	}
	if freed, err := g.Release(ctx, first.Lease); err != nil || freed {
		t.Fatalf("second release: %v %v", freed, err) // frees nothing: no event
	}
	// A rate (burst 3) and a concurrency of 2: the third is allowed by its
	// rate and refused a slot, the fourth refused by its rate (no slot asked).
	for range 4 {
		check("report", "both", "default")
	}

	type row struct {
		kind, slot, priority string
		inFlight             int64
		request, allowed     bool
	}
	want := map[string][]row{
		"export": {
			{"", metering.SlotTaken, "sheddable", 1, true, true},
			{"", metering.SlotShed, "sheddable", 1, true, false},
			{"", metering.SlotTaken, "default", 2, true, true},
			{"", metering.SlotRefused, "critical", 2, true, false},
			{metering.KindSlot, metering.SlotReleased, "", 0, false, true},
		},
		"report": { // the rate's events name the class the request named
			{"", "", "default", 0, true, true},
			{metering.KindSlot, metering.SlotTaken, "default", 1, false, true},
			{"", "", "default", 0, true, true},
			{metering.KindSlot, metering.SlotTaken, "default", 2, false, true},
			{"", "", "default", 0, true, true},
			{metering.KindSlot, metering.SlotRefused, "default", 2, false, false},
			{"", "", "default", 0, true, false},
		},
	}
	got := map[string][]row{}
	for _, ev := range sink.evs {
		b := ev.AppendEncode(nil)
		dec, err := metering.Decode(b)
		if err != nil || dec != ev {
			t.Fatalf("event does not round-trip: %s %v", b, err)
		}
		if ev.Region != "eu" || ev.Key != "acct" {
			t.Fatalf("event without its key or region: %s", b)
		}
		if !ev.IsDecision() && ev.Cost != 0 {
			t.Fatalf("a slot event that is no request has a cost: %s", b)
		}
		got[ev.Scope] = append(got[ev.Scope], row{ev.Kind, ev.Slot, ev.Priority, ev.InFlight, ev.IsDecision(), ev.Allowed})
	}
	for scope, w := range want {
		g := got[scope]
		if len(g) != len(w) {
			t.Fatalf("scope %s: %d events %+v, want %+v", scope, len(g), g, w)
		}
		for i := range w {
			if g[i] != w[i] {
				t.Errorf("scope %s event %d: %+v, want %+v", scope, i, g[i], w[i])
			}
		}
	}
	requests := map[string]int{}
	for _, ev := range sink.evs {
		if ev.IsDecision() {
			requests[ev.Scope]++
		}
	}
	if requests["export"] != 4 || requests["report"] != 4 {
		t.Fatalf("requests counted %v, want 4 /check calls in each scope", requests)
	}
}

// BenchmarkRecordSlot is what a slot event adds to a slot decision before
// the emitter's non-blocking send: its id and the event, encoded as the
// emitter encodes it.
func BenchmarkRecordSlot(b *testing.B) {
	var buf []byte
	sink := encodeSink(func(ev metering.Event) { buf = ev.AppendEncode(buf[:0]) })
	rec := &Recorder{sink: sink, ids: metering.NewIDs(), instance: "i1"}
	ev := slots.Event{Request: enforcement.Request{Key: "acct_8812", Scope: "reports:export"},
		Decision: enforcement.Decision{Allowed: true, Tier: "reports", Policy: "reports", Source: enforcement.SourceShared},
		Outcome:  slots.OutcomeTaken, Priority: "default", InFlight: 7, At: time.Now()}
	b.ReportAllocs()
	for b.Loop() {
		rec.RecordSlot(ev)
	}
}

type encodeSink func(metering.Event)

func (f encodeSink) Emit(ev metering.Event) { f(ev) }
