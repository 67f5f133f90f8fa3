package decisionevents

import (
	"context"
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
