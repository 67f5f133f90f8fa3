package decisionevents

import (
	"context"
	"slices"
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/policy"
)

// TestRecorderStampsRegion: every event a limiter of region b records (a
// decision, a settle, a charge) carries region b; a one-region limiter's
// carry none.
func TestRecorderStampsRegion(t *testing.T) {
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: t\ntiers:\n  t: { rate: 1, period: hour, burst: 1000 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, region := range []string{"b", ""} {
		sink := &memSink{}
		mem := enforcement.NewMemoryAuthority(nil, 1000)
		lim, err := enforcement.New(enforcement.Config{Authority: mem, Reservations: mem, Policy: pol,
			Recorder: &Recorder{sink: sink, ids: metering.NewIDs(), instance: "i1", region: region}})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		d, err := lim.Check(ctx, enforcement.Request{Key: "acct", Scope: "s", Cost: 3, HasCost: true, Reserve: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lim.Settle(ctx, d.Reservation, 5); err != nil {
			t.Fatal(err)
		}
		if _, err := lim.Charge(ctx, enforcement.Request{Key: "acct", Scope: "s", Cost: 2, HasCost: true}); err != nil {
			t.Fatal(err)
		}
		if len(sink.evs) != 3 {
			t.Fatalf("%d events, want 3", len(sink.evs))
		}
		for _, ev := range sink.evs {
			if ev.Region != region {
				t.Fatalf("region %q: event %+v", region, ev)
			}
		}
	}
}

// TestRecorderNamesARateShedsClass: under priority classes a rate's
// decision event names the request's class, and one its class's share
// shed carries slot "shed" (the usage record counts it with the slots'
// sheds per class) while it stays a rejected request; a request naming
// no class names none unless it was shed.
func TestRecorderNamesARateShedsClass(t *testing.T) {
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: t\npriorities: { critical: 1, default: 0.8, sheddable: 0.5 }\n" +
		"tiers:\n  t: { rate: 0.001, burst: 10 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	mem := enforcement.NewMemoryAuthority(nil, 1000)
	lim, err := enforcement.New(enforcement.Config{Authority: mem, Policy: pol,
		Recorder: &Recorder{sink: sink, ids: metering.NewIDs(), instance: "i1"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	check := func(priority string) enforcement.Decision {
		t.Helper()
		d, err := lim.Check(ctx, enforcement.Request{Key: "acct", Scope: "s", Cost: 1, Priority: priority})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// sheddable may spend down to 5 of 10 tokens, default to 2, critical all.
	for range 5 {
		check("sheddable")
	}
	if d := check("sheddable"); d.Allowed || d.Reason != enforcement.ReasonShed {
		t.Fatalf("the sixth sheddable request: %+v", d)
	}
	for range 3 {
		check("")
	}
	if d := check(""); d.Allowed || d.Reason != enforcement.ReasonShed {
		t.Fatalf("the fourth default request: %+v", d)
	}
	if d := check("critical"); !d.Allowed {
		t.Fatalf("critical: %+v", d)
	}
	type seen struct {
		priority, slot string
		allowed        bool
	}
	var got []seen
	for _, ev := range sink.evs {
		if !ev.IsDecision() {
			t.Fatalf("a rate decision's event of kind %q", ev.Kind)
		}
		got = append(got, seen{ev.Priority, ev.Slot, ev.Allowed})
	}
	want := []seen{
		{"sheddable", "", true}, {"sheddable", "", true}, {"sheddable", "", true}, {"sheddable", "", true}, {"sheddable", "", true},
		{"sheddable", metering.SlotShed, false},
		{"", "", true}, {"", "", true}, {"", "", true},
		{policy.DefaultPriority, metering.SlotShed, false},
		{"critical", "", true},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("events (priority, slot, allowed):\n got %v\nwant %v", got, want)
	}
}
