package chsink

import (
	"testing"

	"github.com/ratewarden/ratewarden/metering"
)

// Settle and charge events are left out of the tables of shadow verdicts,
// in order, and a batch of decisions only is passed as it is.
func TestDecisionsOnly(t *testing.T) {
	recs := []Record{
		{Offset: 1, Event: metering.Event{EventID: "a"}},
		{Offset: 2, Event: metering.Event{EventID: "b", Kind: metering.KindSettle}},
		{Offset: 3, Event: metering.Event{EventID: "c", Kind: metering.KindDecision}},
		{Offset: 4, Event: metering.Event{EventID: "d", Kind: metering.KindCharge}},
	}
	got := decisionsOnly(recs)
	if len(got) != 2 || got[0].Offset != 1 || got[1].Offset != 3 {
		t.Fatalf("decisions of the batch: %+v", got)
	}
	plain := recs[:1]
	if got := decisionsOnly(plain); &got[0] != &plain[0] {
		t.Fatal("a batch of decisions only was copied")
	}
}
