package decisionevents

import (
	"context"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/policy"
)

// TestSettleAndChargeEvents: a reservation, its settle and a charge are
// three events through the limiter's own recorder and the event encoding:
// the reserving decision with its estimate as cost and its id, the settle
// with kind, estimate and actual, the charge with kind and actual; the sum
// cost + Σ(actual − estimate) + Σ charges is the actual cost. Each
// carries the instant its store decided or applied it (decided_us).
func TestSettleAndChargeEvents(t *testing.T) {
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: t\ntiers:\n  t: { rate: 1, period: hour, burst: 1000 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	at := time.Date(2026, 5, 3, 10, 0, 0, 0, time.UTC)
	mem := enforcement.NewMemoryAuthority(func() time.Time { return at }, 1000)
	lim, err := enforcement.New(enforcement.Config{Authority: mem, Reservations: mem, Policy: pol,
		Recorder: &Recorder{sink: sink, ids: metering.NewIDs(), instance: "i1"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := lim.Check(ctx, enforcement.Request{Key: "acct", Scope: "tokens", Cost: 300, HasCost: true, Reserve: true})
	if err != nil || d.Reservation == "" {
		t.Fatalf("reserve: %+v %v", d, err)
	}
	at = at.Add(1500 * time.Microsecond)
	if _, err := lim.Settle(ctx, d.Reservation, 742); err != nil {
		t.Fatal(err)
	}
	at = at.Add(time.Second)
	if _, err := lim.Charge(ctx, enforcement.Request{Key: "acct", Scope: "tokens", Cost: 55, HasCost: true}); err != nil {
		t.Fatal(err)
	}
	if len(sink.evs) != 3 {
		t.Fatalf("%d events, want 3", len(sink.evs))
	}
	var actual int64
	for i, ev := range sink.evs {
		b := ev.AppendEncode(nil)
		got, err := metering.Decode(b)
		if err != nil || got != ev {
			t.Fatalf("event %d does not round-trip: %s %v", i, b, err)
		}
		want := []string{metering.KindDecision, metering.KindSettle, metering.KindCharge}[i]
		if got.Kind != want || got.Key != "acct" || got.Scope != "tokens" {
			t.Fatalf("event %d: %s", i, b)
		}
		stored := time.Date(2026, 5, 3, 10, 0, 0, 0, time.UTC).Add([]time.Duration{0, 1500 * time.Microsecond, time.Second + 1500*time.Microsecond}[i])
		if got.DecidedUS != stored.UnixMicro() {
			t.Fatalf("event %d: decided_us %d, want the store's instant %d: %s", i, got.DecidedUS, stored.UnixMicro(), b)
		}
		switch got.Kind {
		case metering.KindDecision:
			if got.Cost != 300 || got.Reservation != d.Reservation || !got.Allowed {
				t.Fatalf("reserving decision: %s", b)
			}
			actual += int64(got.Cost)
		case metering.KindSettle:
			if got.Estimate != 300 || got.Actual != 742 || got.Cost != 0 || got.Reservation != d.Reservation || got.Remaining != 1000-742 ||
				got.ReservedTS != sink.evs[0].TS {
				t.Fatalf("settle: %s", b)
			}
			actual += int64(got.Actual) - int64(got.Estimate)
		case metering.KindCharge:
			if got.Actual != 55 || got.Cost != 0 || got.Estimate != 0 || got.Reservation != "" {
				t.Fatalf("charge: %s", b)
			}
			actual += int64(got.Actual)
		}
	}
	if actual != 742+55 {
		t.Fatalf("actual cost from the events %d, want %d", actual, 742+55)
	}
}
